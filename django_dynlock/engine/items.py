"""The DynamoDB item that stores one lock, and its reading into :class:`LeaseInfo`.

One item per key, partition key only. The item outlives releases so that the
fencing counter never goes backwards; the TTL attribute only garbage-collects idle
items and is never used for correctness.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

OWNER = "owner"
RVN = "rvn"
# Orders one acquisition's writes: each carries a higher number than the one before and
# is conditioned on it, so a write delayed in the network cannot land after a later one.
SEQ = "seq"
FENCE = "fence"
LEASE_MS = "lease_ms"
EXPIRES_AT = "expires_at"
ACQUIRED_AT = "acquired_at"
RELEASED_AT = "released_at"
RELEASED_BY = "released_by"
BREAK_REASON = "break_reason"
HOST = "host"
PID = "pid"
THREAD = "thread"
HOLDER = "holder"
# The owner id of a waiter that kept losing the key to others and now has the next turn.
RESERVED_BY = "reserved_by"

BREAK_PREFIX = "break:"

# A waiter's watch of the holder's record version that its client could not keep in
# memory (it watches more busy keys than it remembers): ``"<rvn> <since>"`` under the
# watcher's own attribute, ``since`` on that watcher's monotonic clock, so that only it
# can read the note back (engine/waiting.py, WATCHES_KEPT).
WATCH_NOTE_PREFIX = "watch_"

# Holder metadata that says what holds a lease (the first one set), and for whom: how
# ``LeaseInfo.describe`` names the holder, and the admin's and showlocks' columns. A
# Celery task (django_dynlock.celery) comes first: the function it calls is a detail.
WHAT_KEYS = ("task", "view", "function", "command")
USER_KEY = "user"

# Where the last releases are remembered, so that an acquire attempt delayed in the
# network cannot take the key after its own acquisition was released, even when other
# holders came and went meanwhile: each release writes a short tag of its owner id into
# one of these slots (chosen by the tag), and acquire refuses a free key whose slot
# holds its own tag. A later release that lands in the same slot would lift the guard for
# that one owner, which is why releases also write the ring below. The slots and the ring,
# 2 x 16 tags of 8 characters, keep the item well under 1 KB.
RELEASE_SLOTS = 16


def release_slot(owner: str) -> tuple[str, str]:
    """(attribute name, tag) remembering that ``owner`` was released."""
    tag = hashlib.blake2s(owner.encode(), digest_size=4).hexdigest()
    return f"rel{int(tag, 16) % RELEASE_SLOTS}", tag


# The release ring: a list of RELEASE_SLOTS tags, the release of the lease with token
# ``fence`` writing its tag at index fence % RELEASE_SLOTS. Consecutive holders of a key
# have consecutive fences, so the next RELEASE_SLOTS - 1 releases land elsewhere: a
# release whose reply was lost still finds its tag there when it tries again, and a
# delayed acquire attempt of a released acquisition is refused, however the owner slots
# collided meanwhile (one in RELEASE_SLOTS handoffs did). Acquire creates the list.
RING = "ring"
EMPTY_RING = {"L": [{"S": "-"} for _ in range(RELEASE_SLOTS)]}


def ring_index(fence: int) -> int:
    return fence % RELEASE_SLOTS


def in_ring(item: Mapping[str, Any], tag: str) -> bool:
    return {"S": tag} in item.get(RING, {}).get("L", [])


def num(value: float | int) -> dict[str, str]:
    if isinstance(value, float):
        return {"N": repr(round(value, 6))}
    return {"N": str(value)}


# Holder metadata is for people (who holds this, and why). Each value is cut to
# HOLDER_VALUE_BYTES, and the whole map may not exceed HOLDER_BYTES: the release and
# break writes add attributes to the item, and an item that DynamoDB's 400 KB limit
# leaves no room for could be acquired but never released or broken.
HOLDER_VALUE_BYTES = 1024
HOLDER_BYTES = 4096


# Separates a semaphore's key from its slot number (slot 1 and up) or from ``limit`` in
# the stored keys of its items. U+FFFF is a Unicode noncharacter, "permanently reserved
# for internal use": no lock key may contain it, so no lock key is ever stored as a
# semaphore's slot or limit item, whatever the keys and prefixes (docs/semaphores.md).
SLOT_MARK = "\uffff"
LIMIT_SUFFIX = "limit"
# The limit item's one attribute of ours: the semaphore's limit (a Number).
LIMIT = "limit"
# The limit before an operator's last change (``LockClient.set_limit``).
PREVIOUS_LIMIT = "previous"


def split_stored(stored: str) -> tuple[str, int | None, bool]:
    """(the semaphore's or lock's stored key, its slot number if a slot of 1 and up, is the limit item)."""
    base, mark, suffix = stored.partition(SLOT_MARK)
    if not mark:
        return stored, None, False
    if suffix == LIMIT_SUFFIX:
        return base, None, True
    return base, int(suffix) if suffix.isdigit() else None, False


def unprefix(prefix: str, stored: str) -> str:
    """A stored key as it was given: without the alias' ``KEY_PREFIX``."""
    return stored[len(prefix) :] if prefix and stored.startswith(prefix) else stored


def number(item: Mapping[str, Any], name: str) -> float | None:
    """A Number attribute as a float, or None when missing."""
    value = item.get(name, {}).get("N")
    return float(value) if value is not None else None


_TYPES = {
    "B": "binary",
    "BOOL": "a boolean",
    "NULL": "null",
    "L": "a list",
    "M": "a map",
    "SS": "a string set",
    "NS": "a number set",
    "BS": "a binary set",
    "N": "a number",
    "S": "a string",
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# The attributes every item of ours has from its first acquire.
_OURS = (FENCE, RVN)


class _Reader:
    """Reads one item's attributes, noting what is malformed instead of raising: items
    written by another application, or edited by hand, are shown, not a traceback."""

    def __init__(self, item: Mapping[str, Any]):
        self.item = item
        self.problems: list[str] = []

    def _typed(self, name: str, wanted: str) -> Any:
        value = self.item.get(name)
        if value is None:
            return None
        if not isinstance(value, Mapping) or wanted not in value:
            kind = next(iter(value), "?") if isinstance(value, Mapping) else "?"
            self.problems.append(f"{name} is {_TYPES.get(kind, kind)} ({kind}), not {_TYPES[wanted]}")
            return None
        return value[wanted]

    def string(self, name: str) -> str | None:
        text: str | None = self._typed(name, "S")
        return text

    def decimal(self, name: str) -> Decimal | None:
        text = self._typed(name, "N")
        if text is None:
            return None
        try:
            return Decimal(text)
        except InvalidOperation:
            self.problems.append(f"{name} {text} is not a number")
            return None

    def whole(self, name: str) -> int | None:
        value = self.decimal(name)
        if value is None:
            return None
        if value != value.to_integral_value():
            self.problems.append(f"{name} {self.item[name]['N']} is not a whole number")
            return None
        return int(value)  # exact: a fence is above 2**53, where a float would round it

    def seconds(self, name: str, scale: int = 1) -> float | None:
        value = self.decimal(name)
        return float(value) / scale if value is not None else None

    def time(self, name: str) -> dt.datetime | None:
        value = self.decimal(name)
        if value is None:
            return None
        try:
            return _EPOCH + dt.timedelta(seconds=float(value))
        except OverflowError:
            self.problems.append(f"{name} {self.item[name]['N']} is not a time")
            return None

    def holder(self) -> dict[str, str]:
        fields = self._typed(HOLDER, "M") or {}
        holder = {}
        for name, value in fields.items():
            if isinstance(value, Mapping) and "S" in value:
                holder[str(name)] = value["S"]
            else:
                kind = next(iter(value), "?") if isinstance(value, Mapping) else "?"
                self.problems.append(f"holder {name} is {_TYPES.get(kind, kind)} ({kind}), not a string")
        return holder


@dataclass(frozen=True)
class LeaseInfo:
    """What the table says about one key: its holder, token and timing.

    Times are DynamoDB's clock as the writer estimated it from the replies it got
    (a client's very first write uses its host's wall clock). A taker compares
    ``expires_at`` with the earliest reading of DynamoDB's clock; see docs/protocol.md.
    """

    key: str
    stored_key: str
    token: int | None
    owner: str | None
    rvn: str | None
    lease_seconds: float | None
    expires_at: dt.datetime | None
    acquired_at: dt.datetime | None
    released_at: dt.datetime | None = None
    released_by: str | None = None
    break_reason: str | None = None
    reserved_by: str | None = None  # a starving waiter's owner id: the next turn is its
    host: str | None = None
    pid: int | None = None
    thread: str | None = None
    holder: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # What could not be read: an item another application wrote, or one edited by hand.
    # Such an item is shown, never broken (its token, if any, cannot be trusted).
    problems: tuple[str, ...] = ()
    # A semaphore holder's slot (``LockClient.holders``; a listing names slots 1 and up,
    # and slot 0 is the key's own item, which looks like a lock there); None for a lock.
    slot: int | None = None

    @property
    def is_malformed(self) -> bool:
        return bool(self.problems)

    @property
    def is_held(self) -> bool:
        """An owner is recorded (it may still be a crashed holder whose lease ran out)."""
        return self.owner is not None

    @property
    def is_breakable(self) -> bool:
        """Held, or free but reserved by a waiter: a break clears either. Not a malformed item."""
        return (self.owner is not None or self.reserved_by is not None) and not self.problems

    @property
    def was_broken(self) -> bool:
        return bool(self.released_by and self.released_by.startswith(BREAK_PREFIX))

    def expires_in(self, now: dt.datetime | None = None) -> float | None:
        """Seconds until the stored expiry (negative: past), at ``now``.

        Pass DynamoDB's clock (``LockClient.server_datetime()``) where you have a client;
        the default is this machine's wall clock.
        """
        if self.expires_at is None:
            return None
        now = now or dt.datetime.now(tz=dt.UTC)
        return (self.expires_at - now).total_seconds()

    def what_key(self) -> str | None:
        """The holder metadata that says what holds the lease: the first of WHAT_KEYS set."""
        return next((k for k in WHAT_KEYS if self.holder.get(k)), None)

    def where(self) -> str:
        """``host:pid`` of the holder, ``?`` for what is unknown. A pid of 0 is no process
        (an item written without one): unknown too, never shown as ``0``."""
        return f"{self.host or '?'}:{self.pid or '?'}"

    def describe(self, *, user: bool = False) -> str:
        """Who holds the lease and where, as people read it: ``shop.views.pay on web-1:1234``;
        with ``user``, ``shop.views.pay (user 42) on web-1:1234`` (the commands and the
        admin show the user; exception messages leave it out)."""
        what_key = self.what_key()
        text = self.holder[what_key] if what_key else ""
        shown_user = self.holder.get(USER_KEY) if user else None
        if shown_user:
            text = f"{text} (user {shown_user})" if text else f"user {shown_user}"
        return f"{text} on {self.where()}" if text else self.where()

    @classmethod
    def from_item(cls, item: Mapping[str, Any], *, key_attribute: str, key_prefix: str) -> LeaseInfo:
        """Never raises: what cannot be read is None, and is named in ``problems``."""
        read = _Reader(item)
        stored = read.string(key_attribute) or ""
        if not any(name in item for name in _OURS):
            read.problems.insert(0, f"not written by django-dynlock (it has no {FENCE} or {RVN} attribute)")
        base, slot, _ = split_stored(stored)
        return cls(
            key=unprefix(key_prefix, base),
            slot=slot,
            stored_key=stored,
            token=read.whole(FENCE),
            owner=read.string(OWNER),
            rvn=read.string(RVN),
            lease_seconds=read.seconds(LEASE_MS, 1000),
            expires_at=read.time(EXPIRES_AT),
            acquired_at=read.time(ACQUIRED_AT),
            released_at=read.time(RELEASED_AT),
            released_by=read.string(RELEASED_BY),
            break_reason=read.string(BREAK_REASON),
            reserved_by=read.string(RESERVED_BY),
            host=read.string(HOST),
            pid=read.whole(PID),
            thread=read.string(THREAD),
            holder=read.holder(),
            raw=dict(item),
            problems=tuple(read.problems),
        )
