"""``manage.py setlocklimit KEY [N]``: show or change a semaphore's stored limit (docs/semaphores.md)."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ...engine.text import printable
from ..base import DynLockCommand, semaphore_limit, translated_errors
from .breaklock import operator

logger = logging.getLogger("django_dynlock.management")


class Command(DynLockCommand):
    help = gettext_lazy(
        "Show the limit stored for a semaphore's KEY, or change it to N. Processes that ask for another "
        "limit then raise SemaphoreConflict; holders past a lowered limit keep their slots until they "
        "release, so during a change up to the larger of the two limits hold KEY."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("key", metavar="KEY", help=_("The semaphore's key, e.g. export:acme."))
        parser.add_argument("limit", nargs="?", type=semaphore_limit, metavar="N", help=_("The new limit, 1-99."))

    def handle(self, *args: Any, **options: Any) -> None:
        key: str = options["key"]
        limit: int | None = options["limit"]
        client = self.client(options)
        with translated_errors():
            if limit is None:
                stored = client.semaphore_limit(key)
                holders = client.holders(key)
                if stored is None:
                    self.stdout.write(_("%(key)s: no limit stored (a lock)") % {"key": printable(key)})
                else:
                    self.stdout.write(
                        _("%(key)s: limit %(limit)s, %(held)s held")
                        % {"key": printable(key), "limit": stored, "held": len(holders)}
                    )
                return
            old = client.set_limit(key, limit)
            holders = client.holders(key) if old is not None and old > limit else []
        logger.warning(
            "semaphore %r: limit changed from %s to %s by %s",
            key,
            old if old is not None else "none",
            limit,
            operator(),
        )
        past = [h for h in holders if h.slot is not None and h.slot >= limit]
        line = _("%(key)s: limit %(old)s -> %(new)s") % {
            "key": printable(key),
            "old": old if old is not None else _("none"),
            "new": limit,
        }
        if past:
            line += "; " + _(
                "%(count)s holder(s) in slots past it keep them until they release: until then up to %(old)s hold it"
            ) % {"count": len(past), "old": old}
        self.stdout.write(line, style_func=self.style.SUCCESS)
