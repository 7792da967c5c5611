"""How the commands and the admin show a lease to a person: relative times, state,
metadata. Who holds it and where is ``LeaseInfo.describe`` (and ``where``).

Times in the table are DynamoDB's clock as each writer estimated it from its
replies (to within about a second), compared with our own estimate of it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.utils.translation import gettext, gettext_lazy

from ..engine.client import LockClient
from ..engine.election import ELECTION_HOLDER_KEY, KEY_PREFIX
from ..engine.items import BREAK_PREFIX, USER_KEY, LeaseInfo
from ..engine.semaphore import SEMAPHORE_HOLDER_KEY
from ..engine.text import printable

# Django ships no type hints: gettext is typed here, so that what it returns is a str.
_: Callable[[str], str] = gettext

# How far two clients' estimates of DynamoDB's clock may disagree (seconds): the Date
# header they learn it from has a resolution of one second.
CLOCK_ERROR = 1.0

# A state as a person reads it (the admin); the codes stay in data attributes, JSON and CSV.
STATE_LABELS = {
    "held": gettext_lazy("held"),
    "expired": gettext_lazy("expired"),
    "reserved": gettext_lazy("reserved"),
    "released": gettext_lazy("released"),
    "broken": gettext_lazy("broken"),
    "malformed": gettext_lazy("malformed"),
}


def duration(value: float) -> str:
    """``42s``, ``3m 05s``, ``2h 10m``, ``4d 3h``: two units at most."""
    total = int(round(abs(value)))
    if total < 60:
        return f"{total}s" if total >= 1 or value == 0 else f"{abs(value):.1f}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def ago(when: dt.datetime | None, now: dt.datetime) -> str:
    if when is None:
        return "-"
    delta = (now - when).total_seconds()
    if -CLOCK_ERROR < delta < 0:
        delta = 0.0  # two estimates of DynamoDB's clock: a moment ago, not in the future
    if delta >= 0:
        return _("%(duration)s ago") % {"duration": duration(delta)}
    return _("in %(duration)s") % {"duration": duration(delta)}


def breakable(client: LockClient, key: str) -> LeaseInfo | None:
    """What a break of ``key`` would end (one read): its lease, or a waiter's reservation of
    a free key; None when there is neither. For breaklock and the admin's break pages.

    A malformed item is returned too (``is_breakable`` False), so that they can say why
    they will not break it."""
    info = client.get(key, include_released=True)
    return info if info is not None and (info.is_breakable or info.is_malformed) else None


def state(info: LeaseInfo, now: dt.datetime) -> str:
    """``held``, ``expired`` (an owner whose stored expiry passed), ``reserved`` (free, but the
    next turn is a waiter's), ``released``, ``broken``, or ``malformed`` (an item another
    application wrote, or one edited by hand: see ``info.problems``)."""
    if info.problems:
        return "malformed"
    if info.is_held:
        left = info.expires_in(now)
        return "expired" if left is not None and left < 0 else "held"
    if info.reserved_by:
        return "reserved"
    return "broken" if info.was_broken else "released"


def broken_why(info: LeaseInfo) -> str:
    """Why and by whom a broken lease was broken (``stuck job, by root@vm (breaklock)``);
    empty for any other lease."""
    if not info.was_broken or info.released_by is None:
        return ""
    return _("%(reason)s, by %(by)s") % {
        "reason": info.break_reason or _("no reason given"),
        "by": info.released_by.removeprefix(BREAK_PREFIX),
    }


#: The holder metadata of a lease taken with runlocked's --at-least (singleton at_least):
#: its seconds.
AT_LEAST_KEY = "at_least"
# How far a kept lease's expiry may be from its acquisition plus --at-least: the run
# measures --at-least from when acquire returned, and each stamp is its own estimate
# of DynamoDB's clock.
KEPT_SLACK = 1.0


def kept_after_its_run(info: LeaseInfo) -> bool:
    """A lease runlocked --at-least kept on purpose after its run (``Lease.keep_for``): its
    holder names the --at-least, and it expires that long after it was taken. A crashed
    run's lease expires a lease duration after its last renewal instead."""
    try:
        at_least = float(info.holder.get(AT_LEAST_KEY, ""))
    except ValueError:
        return False
    if info.acquired_at is None or info.expires_at is None:
        return False
    return abs((info.expires_at - info.acquired_at).total_seconds() - at_least) <= KEPT_SLACK


def state_text(info: LeaseInfo, now: dt.datetime) -> str:
    """The STATE cell of ``showlocks --all``: a broken lease says why."""
    shown = state(info, now)
    why = broken_why(info)
    return f"{shown}: {why}" if why else shown


def expires(info: LeaseInfo, now: dt.datetime) -> str:
    if not info.is_held:
        return "-"
    left = info.expires_in(now)
    if left is None:
        return "-"
    if left >= 0:
        return _("in %(duration)s") % {"duration": duration(left)}
    return _("expired %(duration)s ago") % {"duration": duration(left)}


def holder_text(info: LeaseInfo) -> str:
    """``shop.views.pay (user 42) on web-1:1234``: what, for whom, where."""
    return info.describe(user=True)


def problems_text(info: LeaseInfo) -> str:
    return "; ".join(info.problems)


def election(info: LeaseInfo) -> str | None:
    """The name of the election whose term ``info`` is (``client.election(name)``: its
    holder metadata names it, on the key ``election:<name>``), or None for a plain lease."""
    name = info.holder.get(ELECTION_HOLDER_KEY)
    return name if name and info.key == KEY_PREFIX + name else None


def semaphore(info: LeaseInfo) -> int | None:
    """The limit of the semaphore whose holder ``info`` is (its holder metadata says),
    or None for a lock's holder."""
    value = info.holder.get(SEMAPHORE_HOLDER_KEY, "")
    return int(value) if value.isdigit() else None


def slot(info: LeaseInfo) -> int | None:
    """A semaphore holder's slot (slot 0 is the key's own item, which names none)."""
    return None if semaphore(info) is None else info.slot or 0


def term_age(info: LeaseInfo, now: dt.datetime) -> float | None:
    """Seconds since an election's term began (renewals keep ``acquired_at``), while the
    term is held; None for a plain lease or a term that has ended."""
    if election(info) is None or info.acquired_at is None or state(info, now) != "held":
        return None
    return max(0.0, (now - info.acquired_at).total_seconds())


def election_text(info: LeaseInfo, now: dt.datetime) -> str:
    """``election beat, term age 4m 05s``; empty for a plain lease."""
    name = election(info)
    if name is None:
        return ""
    text = _("election %(name)s") % {"name": name}
    age = term_age(info, now)
    if age is not None:
        text += ", " + _("term age %(age)s") % {"age": duration(age)}
    return text


def metadata(info: LeaseInfo) -> list[tuple[str, str]]:
    """The holder metadata not already shown as what holds the lease and for whom (nor,
    for an election's term, as the election)."""
    shown = {info.what_key(), USER_KEY}
    if election(info) is not None:
        shown.add(ELECTION_HOLDER_KEY)
    if semaphore(info) is not None:
        shown.add(SEMAPHORE_HOLDER_KEY)
    return [(k, v) for k, v in sorted(info.holder.items()) if k not in shown]


def metadata_text(info: LeaseInfo, now: dt.datetime | None = None) -> str:
    """``METADATA``: an election's name and term age first (given ``now``), then the rest."""
    text = " ".join(f"{k}={v}" for k, v in metadata(info))
    if election(info) is not None:
        said = election_text(info, now) if now is not None else _("election %(name)s") % {"name": election(info)}
        text = f"{said}; {text}" if text else said
    if info.problems:
        text = _("malformed: %(problems)s") % {"problems": problems_text(info)} + (f" {text}" if text else "")
    return text


def _iso(when: dt.datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def record(info: LeaseInfo, now: dt.datetime) -> dict[str, Any]:
    """Everything known about a lease, as JSON-ready values (shared by json and csv)."""
    left = info.expires_in(now)
    return {
        "key": info.key,
        "state": state(info, now),
        "token": info.token,
        "host": info.host,
        "pid": info.pid,
        "thread": info.thread,
        "holder": dict(info.holder),
        "owner": info.owner,
        "acquired_at": _iso(info.acquired_at),
        "expires_at": _iso(info.expires_at),
        "expires_in": round(left, 3) if left is not None and info.is_held else None,
        "lease_seconds": info.lease_seconds,
        "released_at": _iso(info.released_at),
        "released_by": info.released_by,
        "break_reason": info.break_reason,
        "reserved_by": info.reserved_by,
        "problems": list(info.problems),
        "election": election(info),
        "semaphore": semaphore(info),
        "slot": slot(info),
        "term_age": round(age, 3) if (age := term_age(info, now)) is not None else None,
    }


def summary(info: LeaseInfo, now: dt.datetime) -> str:
    """One line for breaklock and runlocked: token, holder, timing, metadata; safe to print."""
    parts = [
        _("token %(token)s") % {"token": info.token},
        _("held by %(holder)s") % {"holder": holder_text(info)},
        _("acquired %(ago)s") % {"ago": ago(info.acquired_at, now)},
        expires(info, now) if state(info, now) == "expired" else _("expires %(when)s") % {"when": expires(info, now)},
    ]
    extra = metadata_text(info, now)
    if extra:
        parts.append(extra)
    return printable(", ".join(parts))
