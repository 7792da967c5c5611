"""``manage.py breaklock KEY [KEY ...]``: force-release leases, after confirmation."""

from __future__ import annotations

import getpass
import logging
import socket
import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ...engine.breaking import MAX_REASON
from ...engine.client import LockClient
from ...engine.text import printable
from ...exceptions import BreakUnconfirmed
from .. import formatting as fmt
from ..base import DynLockCommand, translated_errors, usage_error

logger = logging.getLogger("django_dynlock.management")

EXIT_NOT_ALL_BROKEN = 1


def operator() -> str:
    """Who is breaking: recorded in the item (``released_by``), the signal and the log."""
    try:
        user = getpass.getuser()
    except Exception:  # no USER/LOGNAME and no passwd entry (some containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()} (breaklock)"


def stdin_is_interactive() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class Command(DynLockCommand):
    help = gettext_lazy(
        "Break (force-release) the leases on the given keys. Shows each lease and asks first; the break "
        "only happens if the lease still has the token that was shown (or --token)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("keys", nargs="+", metavar="KEY", help=_("Lock key(s) to break."))
        parser.add_argument(
            "--noinput", "--no-input", action="store_false", dest="interactive", help=_("Do not ask for confirmation.")
        )
        parser.add_argument(
            "--token",
            type=int,
            default=None,
            metavar="N",
            help=_(
                "Break only if the lease still has this fencing token (one KEY only); of a semaphore, "
                "the holder with this token."
            ),
        )
        parser.add_argument(
            "--reason",
            default="",
            metavar="TEXT",
            help=_("Why (required, as in the admin): recorded in the item, logged and sent with lock_broken."),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        keys: list[str] = list(dict.fromkeys(options["keys"]))  # once each, in the order given
        token: int | None = options["token"]
        interactive: bool = options["interactive"]
        if token is not None and len(keys) > 1:
            usage_error(_("--token applies to one KEY: tokens are counted per key"))
        if interactive and not stdin_is_interactive():
            usage_error(_("stdin is not a terminal, so breaklock cannot ask for confirmation: pass --noinput"))
        if len(options["reason"]) > MAX_REASON:
            usage_error(
                _("--reason is too long: at most %(count)s characters, as in the admin") % {"count": MAX_REASON}
            )
        if not options["reason"].strip():
            # As the admin's break form: the reason is the audit trail's why.
            usage_error(
                _(
                    "give a reason: --reason TEXT (recorded with the lease, logged and sent with lock_broken, "
                    "as the admin asks)"
                )
            )
        client = self.client(options)
        with translated_errors():
            for key in keys:
                client.options.prefixed(key)  # an invalid key is a usage error, before anything is broken
            by = operator()
            failed = [key for key in keys if not self.break_one(client, key, token, options["reason"], by, interactive)]
        if failed:
            raise CommandError(
                ngettext(
                    "%(failed)d of %(count)d lock not broken: %(keys)s",
                    "%(failed)d of %(count)d locks not broken: %(keys)s",
                    len(keys),
                )
                % {"failed": len(failed), "count": len(keys), "keys": ", ".join(map(repr, failed))},
                returncode=EXIT_NOT_ALL_BROKEN,
            )

    def break_one(
        self, client: LockClient, key: str, token: int | None, reason: str, by: str, interactive: bool
    ) -> bool:
        info = fmt.breakable(client, key)
        if token is not None and (info is None or info.token != token):
            # A semaphore's holder in another slot than the key's own item (docs/semaphores.md).
            info = next((h for h in client.holders(key) if h.token == token), info)
        if info is None:
            self.not_broken(key, _("not found: no live lease or reservation on this key"))
            return False
        if info.is_malformed:
            self.not_broken(
                key,
                _(
                    "a malformed item (%(problems)s): django-dynlock did not write it or it "
                    "was edited by hand; look at it (showlocks --format json) and delete it with the AWS "
                    "console or CLI if it is not a lock"
                )
                % {"problems": fmt.problems_text(info)},
            )
            return False
        now = client.server_datetime()
        if token is not None and info.token != token:
            # Whether a typo or a lease that changed hands, the table cannot tell: say which token it has.
            self.not_broken(
                key,
                _("--token %(token)s does not match: the lease has token %(now)s, held by %(holder)s")
                % {"now": info.token, "token": token, "holder": fmt.holder_text(info)},
            )
            return False
        if interactive:  # what the question is about; with --noinput, the "broken" line says it
            self.stdout.write(f"{printable(key)}: {fmt.summary(info, now)}")
        if interactive and not self.confirm(key):
            self.not_broken(key, _("skipped: not confirmed"))
            return False
        # Always conditioned on the token that was shown: a lease that changed hands
        # while the operator read it is not broken by mistake.
        try:
            broken = client.break_lease(key, token=info.token, reason=reason, by=by)
        except BreakUnconfirmed:
            # Counted as not broken (exit 1): nobody is told a break happened that may not have.
            logger.warning(
                "breaklock: %s may have broken lock %r (token %s, held by %s): its replies were lost: %s",
                printable(by),
                key,
                info.token,
                printable(fmt.holder_text(info)),
                printable(reason or "no reason given"),
            )
            self.not_broken(
                key,
                _(
                    "may have been broken: DynamoDB's replies were lost and the key could not be read "
                    "back; run `%(command)s` to see"
                )
                % {"command": f"showlocks --all --prefix {key}"},
            )
            return False
        if not broken:
            self.not_broken(key, _("gone: released or taken over since it was shown"))
            return False
        # The engine logs the break, in one line naming whose lease it was.
        if interactive:
            line = _("%(key)s: broken (token %(token)s)") % {"key": printable(key), "token": info.token}
        else:
            line = _("%(key)s: broken: %(summary)s") % {"key": printable(key), "summary": fmt.summary(info, now)}
        self.stdout.write(line, style_func=self.style.SUCCESS)
        return True

    def confirm(self, key: str) -> bool:
        try:
            answer = input(_("Break the lease on %(key)r? [y/N] ") % {"key": key})
        except EOFError:
            return False
        except KeyboardInterrupt:
            self.stdout.write("")
            raise CommandError(_("interrupted: nothing more is broken"), returncode=EXIT_NOT_ALL_BROKEN) from None
        return answer.strip().lower() in ("y", "yes")

    def not_broken(self, key: str, why: str) -> None:
        self.stdout.write(
            _("%(key)s: not broken: %(why)s") % {"key": printable(key), "why": printable(why)},
            style_func=self.style.WARNING,
        )
