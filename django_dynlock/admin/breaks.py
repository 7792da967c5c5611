"""Breaking a lease from the admin: the form's fields, the admin log, and the breaks
whose outcome is not known yet.

A break whose replies were lost (``BreakUnconfirmed``) is kept in the session until a
page read shows whether it landed; only then does it go to the admin log.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest
from django.utils.text import Truncator
from django.utils.translation import gettext

from .. import admin_ids, conf
from ..engine.breaking import MAX_REASON
from ..engine.client import LockClient
from ..engine.items import LeaseInfo
from ..engine.text import printable
from ..exceptions import BreakUnconfirmed, DynLockError
from ..management import formatting as fmt
from ..models import Lease
from ..registry import get_lock_client

# Django ships no type hints: gettext is typed here, so that what it returns is a str.
_: Callable[[str], str] = gettext

#: Where a session keeps the breaks whose outcome is not known yet (BreakUnconfirmed),
#: until a page read shows whether they landed; at most MAX_UNCONFIRMED of them.
UNCONFIRMED = "dynlock_unconfirmed_breaks"
MAX_UNCONFIRMED = 50


def break_lease(request: HttpRequest, client: LockClient, alias: str, key: str, token: int, reason: str) -> bool:
    """Break ``key`` if it still has ``token``; on success log it (LogEntry). The client
    sends ``lock_broken``. Raises BreakUnconfirmed, remembered in the session, when
    the outcome is not known yet."""
    by = f"admin:{request.user.get_username()}"
    try:
        broken = client.break_lease(key, token=token, reason=reason, by=by)
    except BreakUnconfirmed as exc:
        pending = request.session.get(UNCONFIRMED, [])
        pending.append({"alias": alias, "key": key, "token": token, "mark": exc.mark, "reason": reason, "by": by})
        request.session[UNCONFIRMED] = pending[-MAX_UNCONFIRMED:]
        raise
    if broken:
        audit(request, alias, key, token, f"Broke the lease on {key!r}", reason)
    return broken


def audit(request: HttpRequest, alias: str, key: str, token: int, what: str, reason: str) -> None:
    where = f" (alias {alias})" if alias != conf.DEFAULT_ALIAS else ""
    # Nothing here may fail after the break: no NUL or other control character
    # (PostgreSQL refuses NUL in text), and the id links to this key in this alias.
    LogEntry.objects.create(
        user_id=request.user.pk,
        content_type=ContentType.objects.get_for_model(Lease, for_concrete_model=False),
        object_id=admin_ids.object_id(key, alias),
        object_repr=Truncator(printable(key)).chars(200),
        action_flag=CHANGE,
        change_message=f"{what}{where}, token {token}. Reason: {printable(reason)}",
    )


def unconfirmed_message(key: str, token: int) -> str:
    return _(
        "The lease on %(key)r (token %(token)s) may have been broken: DynamoDB's replies were lost. "
        "Reload the page to see; the break goes to the admin log once it is confirmed."
    ) % {"key": key, "token": token}


def not_broken_message(key: str, token: int | None, info: LeaseInfo | None, now: dt.datetime) -> str:
    if info is None:
        return _("Not broken: the lease on %(key)r (token %(token)s) is not held any more.") % {
            "key": key,
            "token": token,
        }
    return _(
        "Not broken: the lease on %(key)r now has token %(now)s (held by %(holder)s), "
        "not %(token)s. Look again and confirm if you still want to break it."
    ) % {"key": key, "now": info.token, "holder": fmt.holder_text(info), "token": token}


def confirm_breaks(request: HttpRequest) -> None:
    """Settle the breaks of this session whose outcome was not known: audit those that
    landed, say which did not, keep those DynamoDB still cannot tell."""
    pending = request.session.get(UNCONFIRMED) if hasattr(request, "session") else None
    if not pending:
        return
    kept = []
    for entry in pending:
        alias, key, token, reason = entry["alias"], entry["key"], entry["token"], entry["reason"]
        if alias not in conf.aliases():
            continue
        try:
            landed = get_lock_client(alias).confirm_break(
                key, token=token, mark=entry["mark"], reason=reason, by=entry["by"]
            )
        except DynLockError:
            kept.append(entry)
            continue
        if landed:
            audit(request, alias, key, token, f"Broke the lease on {key!r}", reason)
            messages.success(
                request,
                _("Confirmed: the lease on %(key)r (token %(token)s) was broken.") % {"key": key, "token": token},
            )
        elif landed is False:
            messages.info(
                request,
                _(
                    "The lease on %(key)r (token %(token)s) was not broken: it is still held. "
                    "Break it again if you still want to."
                )
                % {"key": key, "token": token},
            )
        else:
            audit(
                request,
                alias,
                key,
                token,
                f"May have broken the lease on {key!r} (its replies were lost, and the lease has ended since)",
                reason,
            )
            messages.warning(
                request,
                _(
                    "The lease on %(key)r (token %(token)s) has ended, but whether your break "
                    "ended it cannot be told: it changed hands since. Recorded in the admin log "
                    "as a possible break."
                )
                % {"key": key, "token": token},
            )
    request.session[UNCONFIRMED] = kept


def posted_reason(request: HttpRequest) -> tuple[str, str | None]:
    """The form's reason, whitespace collapsed, and what is wrong with it (or None)."""
    reason = " ".join(request.POST.get("reason", "").split())
    if not reason:
        return reason, _("Give a reason: it is recorded with the lease, in the admin log and sent with lock_broken.")
    if len(reason) > MAX_REASON:
        return reason, _("The reason is too long: at most %(count)s characters.") % {"count": MAX_REASON}
    return reason, None


def parse_token(value: str | None) -> int | None:
    """A posted token, or None if it is not a whole number >= 0."""
    try:
        token = int((value or "").strip())
    except ValueError:
        return None
    return token if token >= 0 else None
