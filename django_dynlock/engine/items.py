"""The DynamoDB item that stores one lock, and its reading into :class:`LeaseInfo`.

One item per key, partition key only. The item outlives releases so that the
fencing counter never goes backwards; the TTL attribute only garbage-collects idle
items and is never used for correctness.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..exceptions import InvalidArgument

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


def _cut(value: object) -> str:
    """``value`` as text of at most HOLDER_VALUE_BYTES in UTF-8, cut at a character."""
    return str(value).encode("utf-8", "replace")[:HOLDER_VALUE_BYTES].decode("utf-8", "ignore")


def holder_map(holder: Mapping[str, Any] | None) -> dict[str, Any]:
    """Holder metadata as a DynamoDB map of strings (None values are dropped); raises
    InvalidArgument when it is over HOLDER_BYTES, before any request."""
    shown = {str(k): _cut(v) for k, v in (holder or {}).items() if v is not None}
    size = sum(len(k.encode("utf-8", "replace")) + len(v.encode("utf-8")) for k, v in shown.items())
    if size > HOLDER_BYTES:
        raise InvalidArgument(f"holder metadata is {size} bytes (names and values, each value cut to "
                              f"{HOLDER_VALUE_BYTES}); at most {HOLDER_BYTES} are stored with a lease: "
                              "keep it to who holds the lock and why")
    return {"M": {k: {"S": v} for k, v in shown.items()}}


def number(item: Mapping[str, Any], name: str) -> float | None:
    """A Number attribute as a float, or None when missing."""
    value = item.get(name, {}).get("N")
    return float(value) if value is not None else None


def _s(item: Mapping[str, Any], name: str) -> str | None:
    return item.get(name, {}).get("S")


def _ts(value: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(value, tz=dt.timezone.utc) if value is not None else None


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

    @property
    def is_held(self) -> bool:
        """An owner is recorded (it may still be a crashed holder whose lease ran out)."""
        return self.owner is not None

    @property
    def is_breakable(self) -> bool:
        """Held, or free but reserved by a waiter: a break clears either."""
        return self.owner is not None or self.reserved_by is not None

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
        now = now or dt.datetime.now(tz=dt.timezone.utc)
        return (self.expires_at - now).total_seconds()

    def describe(self) -> str:
        where = f"{self.host or '?'}:{self.pid or '?'}"
        what = self.holder.get("view") or self.holder.get("function") or self.holder.get("command")
        return f"{what} on {where}" if what else where

    @classmethod
    def from_item(cls, item: Mapping[str, Any], *, key_attribute: str, key_prefix: str) -> LeaseInfo:
        from .keys import unprefix

        stored = item[key_attribute]["S"]
        fence = item.get(FENCE, {}).get("N")
        pid = number(item, PID)
        holder = {k: v.get("S", "") for k, v in item.get(HOLDER, {}).get("M", {}).items()}
        lease_ms = number(item, LEASE_MS)
        return cls(
            key=unprefix(key_prefix, stored),
            stored_key=stored,
            token=int(fence) if fence is not None else None,  # exact: no float rounding
            owner=_s(item, OWNER),
            rvn=_s(item, RVN),
            lease_seconds=lease_ms / 1000.0 if lease_ms is not None else None,
            expires_at=_ts(number(item, EXPIRES_AT)),
            acquired_at=_ts(number(item, ACQUIRED_AT)),
            released_at=_ts(number(item, RELEASED_AT)),
            released_by=_s(item, RELEASED_BY),
            break_reason=_s(item, BREAK_REASON),
            reserved_by=_s(item, RESERVED_BY),
            host=_s(item, HOST),
            pid=int(pid) if pid is not None else None,
            thread=_s(item, THREAD),
            holder=holder,
            raw=dict(item),
        )
