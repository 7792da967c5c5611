"""Every write the lock client sends, as pure functions.

Each returns the parameters of one ``UpdateItem`` (without ``TableName``, which the
client adds) from what it needs to know. Nothing here reads a clock, draws a random
number or talks to DynamoDB: the client passes the times, the record versions and the
holder, so the conditions can be read, and tested, without a server. Why each condition
is what it is: docs/protocol.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..exceptions import InvalidArgument
from . import items as it
from .options import ClientOptions

Request = dict[str, Any]

# How long a reservation stays after the release when its waiter does not take its
# turn (it died, most likely): then any acquire takes the key.
RESERVATION_GRACE = 2.0


def _cut(value: object) -> str:
    """``value`` as text of at most it.HOLDER_VALUE_BYTES in UTF-8, cut at a character."""
    return str(value).encode("utf-8", "replace")[: it.HOLDER_VALUE_BYTES].decode("utf-8", "ignore")


def holder_map(holder: Mapping[str, Any] | None) -> dict[str, Any]:
    """Holder metadata as a DynamoDB map of strings (None values are dropped); raises
    InvalidArgument when it is over it.HOLDER_BYTES, before any request."""
    shown = {str(k): _cut(v) for k, v in (holder or {}).items() if v is not None}
    size = sum(len(k.encode("utf-8", "replace")) + len(v.encode("utf-8")) for k, v in shown.items())
    if size > it.HOLDER_BYTES:
        raise InvalidArgument(
            f"holder metadata is {size} bytes (names and values, each value cut to "
            f"{it.HOLDER_VALUE_BYTES}); at most {it.HOLDER_BYTES} are stored with a lease: "
            "keep it to who holds the lock and why"
        )
    return {"M": {k: {"S": v} for k, v in shown.items()}}


def key(options: ClientOptions, stored: str) -> dict[str, Any]:
    return {options.key_attribute: {"S": stored}}


def names(*attrs: str) -> dict[str, str]:
    return {f"#{name}": name for name in attrs}


def gc_at(options: ClientOptions, now: float, lease_seconds: float = 0.0) -> dict[str, str]:
    """When TTL may delete the item: RETENTION after the lease ends. TTL wants whole
    epoch seconds as a Number."""
    return it.num(int(now + lease_seconds + options.retention) + 1)


def _expiry(update: str, watch_only: bool) -> str:
    """``update`` (which sets ``#expires_at``) storing no expiry instead, when ``watch_only``:
    a holder that cannot learn DynamoDB's clock (its replies carry no Date) leaves its
    lease to takeover by the clock-free watch alone, for its wall clock must not decide."""
    if not watch_only:
        return update
    update = update.replace("#expires_at = :expires, ", "")
    return update + (", #expires_at" if " REMOVE " in update else " REMOVE #expires_at")


def acquire(
    options: ClientOptions,
    stored: str,
    *,
    owner: str,
    rvn: str,
    seq: int,
    lease_seconds: float,
    stamp: float,
    now: float,
    earliest: float | None,
    host: str,
    pid: int,
    thread: str,
    holder: Mapping[str, Any] | None,
    takeover_rvn: str | None,
    base: float | None,
    watch_only: bool = False,
) -> Request:
    """One acquire attempt (also an item of a transaction); it stores ``stamp + lease_seconds``
    as the expiry (none when ``watch_only``). ``earliest`` is the earliest DynamoDB's clock
    can read now (None while unknown); ``takeover_rvn`` the holder's record version a waiter
    watched for a whole lease. ``base`` starts the fencing counter of a key without an item:
    the latest DynamoDB's clock can read; None while that is unknown, and then the attempt
    applies only to an existing item (whose counter it continues)."""
    all_names = names(
        it.OWNER,
        it.RVN,
        it.SEQ,
        it.FENCE,
        it.LEASE_MS,
        it.EXPIRES_AT,
        it.ACQUIRED_AT,
        it.HOST,
        it.PID,
        it.THREAD,
        it.HOLDER,
        it.RELEASED_AT,
        it.RESERVED_BY,
    )
    slot, tag = it.release_slot(owner)
    all_names["#slot"] = slot
    all_names["#ring"] = it.RING
    all_names["#gc"] = options.ttl_attribute
    values = {
        ":me": {"S": owner},
        ":rvn": {"S": rvn},
        ":seq": it.num(seq),
        ":lease_ms": it.num(int(math.ceil(lease_seconds * 1000))),
        ":expires": it.num(stamp + lease_seconds),
        ":now": it.num(now),
        ":host": {"S": host},
        ":pid": it.num(pid),
        ":thread": {"S": thread},
        ":holder": holder_map(holder),
        ":gc": gc_at(options, stamp, lease_seconds),
        # A key whose item was deleted by TTL starts again from the clock in µs,
        # above every token issued before (unless a million were issued a second).
        # The latest DynamoDB's clock can read is never behind it, and an earlier
        # base was at most its writer's uncertainty ahead: TTL deletes an item no
        # sooner than a lease + RETENTION after its last write, far more than that.
        ":base": it.num(int((stamp if base is None else base) * 1_000_000)),  # unused when None: see below
        ":one": it.num(1),
        ":tag": {"S": tag},
        ":ring0": it.EMPTY_RING,
    }
    # Not while another waiter has the next turn (see reserve), unless it left that
    # turn unused for RESERVATION_GRACE after the release (it died, most likely).
    reservation = "attribute_not_exists(#reserved_by) OR #reserved_by = :me"
    if earliest is not None:
        reservation += " OR #released_at < :lapsed"
        values[":lapsed"] = it.num(earliest - RESERVATION_GRACE)
    # A free key, unless this very acquisition was already released or abandoned: an
    # attempt of ours that was delayed in the network and lands after that must not
    # lock the key for an owner nobody renews (a ghost holder). See items.RELEASE_SLOTS
    # and items.RING.
    # Or our own earlier attempt whose reply was lost, but never an earlier attempt
    # landing after a later one (the sequence number orders our writes).
    condition = (
        "(attribute_not_exists(#owner) AND (attribute_not_exists(#slot) OR NOT contains(#slot, :tag))"
        f" AND (attribute_not_exists(#ring) OR NOT contains(#ring, :tag)) AND ({reservation}))"
        " OR (#owner = :me AND #seq < :seq)"
    )
    if takeover_rvn is not None:
        condition += " OR #rvn = :seen"
        values[":seen"] = {"S": takeover_rvn}
    if earliest is not None:
        # The holder's expiry has passed, even by the earliest DynamoDB's clock can read.
        condition += " OR (attribute_exists(#owner) AND #expires_at < :earliest)"
        values[":earliest"] = it.num(earliest)
    if base is None:
        # A new counter from a host's wall clock could start below tokens already issued
        # (a slow clock, after TTL deleted the item): only DynamoDB's clock may start one.
        condition = f"({condition}) AND attribute_exists(#fence)"
    if watch_only:
        del values[":expires"]
    return {
        "Key": key(options, stored),
        "UpdateExpression": _expiry(
            "SET #owner = :me, #rvn = :rvn, #seq = :seq, #lease_ms = :lease_ms, #expires_at = :expires, "
            "#acquired_at = :now, #host = :host, #pid = :pid, #thread = :thread, #holder = :holder, "
            "#gc = :gc, #fence = if_not_exists(#fence, :base) + :one, #ring = if_not_exists(#ring, :ring0) "
            "REMOVE #released_at, #reserved_by",
            watch_only,
        ),
        "ConditionExpression": condition,
        "ExpressionAttributeNames": all_names,
        "ExpressionAttributeValues": values,
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


def renew(
    options: ClientOptions,
    stored: str,
    *,
    owner: str,
    rvn: str,
    seq: int,
    lease_seconds: float,
    stamp: float,
    watch_only: bool = False,
) -> Request:
    """One renewal: the expiry becomes ``stamp + lease_seconds`` (none when ``watch_only``)."""
    request: Request = {
        "Key": key(options, stored),
        "UpdateExpression": _expiry(
            "SET #rvn = :rvn, #seq = :seq, #lease_ms = :lease_ms, #expires_at = :expires, #gc = :gc", watch_only
        ),
        # The owner id names this acquisition alone. Not conditioned on our previous
        # rvn: a renewal applied whose reply was lost must not make the next one
        # fail. But on the sequence number: one delayed in the network must not
        # land after a later one and move the expiry back.
        "ConditionExpression": "#owner = :me AND #seq < :seq",
        "ExpressionAttributeNames": {
            **names(it.OWNER, it.RVN, it.SEQ, it.LEASE_MS, it.EXPIRES_AT),
            "#gc": options.ttl_attribute,
        },
        "ExpressionAttributeValues": {
            ":me": {"S": owner},
            ":rvn": {"S": rvn},
            ":seq": it.num(seq),
            ":lease_ms": it.num(int(math.ceil(lease_seconds * 1000))),
            ":expires": it.num(stamp + lease_seconds),
            ":gc": gc_at(options, stamp, lease_seconds),
        },
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    if watch_only:
        del request["ExpressionAttributeValues"][":expires"]
    return request


def adopt(
    options: ClientOptions,
    stored: str,
    *,
    owner: str,
    token: int,
    handed_seq: int,
    rvn: str,
    seq: int,
    lease_seconds: float,
    stamp: float,
    host: str,
    pid: int,
    thread: str,
    watch_only: bool = False,
) -> Request:
    """A renewal by the process a lease was handed to (see handover.py): the expiry becomes
    ``stamp + lease_seconds`` (none when ``watch_only``) and the item names the new process.
    Conditioned on the sequence number the giver stopped at, not just below ours: of two
    processes handed the same lease (a message delivered twice), only the first write applies."""
    request: Request = {
        "Key": key(options, stored),
        "UpdateExpression": _expiry(
            "SET #rvn = :rvn, #seq = :seq, #lease_ms = :lease_ms, #expires_at = :expires, #gc = :gc, "
            "#host = :host, #pid = :pid, #thread = :thread",
            watch_only,
        ),
        "ConditionExpression": "#owner = :me AND #fence = :token AND #seq = :handed",
        "ExpressionAttributeNames": {
            **names(it.OWNER, it.FENCE, it.RVN, it.SEQ, it.LEASE_MS, it.EXPIRES_AT, it.HOST, it.PID, it.THREAD),
            "#gc": options.ttl_attribute,
        },
        "ExpressionAttributeValues": {
            ":me": {"S": owner},
            ":token": it.num(token),
            ":handed": it.num(handed_seq),
            ":rvn": {"S": rvn},
            ":seq": it.num(seq),
            ":lease_ms": it.num(int(math.ceil(lease_seconds * 1000))),
            ":expires": it.num(stamp + lease_seconds),
            ":gc": gc_at(options, stamp, lease_seconds),
            ":host": {"S": host},
            ":pid": it.num(pid),
            ":thread": {"S": thread},
        },
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    if watch_only:
        del request["ExpressionAttributeValues"][":expires"]
    return request


def reserve(options: ClientOptions, stored: str, *, owner: str, holder: str) -> Request:
    """A starving waiter's claim of the next turn after ``holder`` (conditioned on that
    holder, so that a claim delayed in the network cannot land under a later one)."""
    return {
        "Key": key(options, stored),
        "UpdateExpression": "SET #reserved_by = :me",
        "ConditionExpression": "#owner = :holder AND attribute_not_exists(#reserved_by)",
        "ExpressionAttributeNames": names(it.OWNER, it.RESERVED_BY),
        "ExpressionAttributeValues": {":me": {"S": owner}, ":holder": {"S": holder}},
    }


def note_watch(options: ClientOptions, stored: str, *, attribute: str, rvn: str, note: str) -> Request:
    """Keep a waiter's watch of record version ``rvn`` in the item, under the waiter's own
    ``attribute``: its client forgot it (waiting.WATCHES_KEPT). Conditioned on ``rvn``:
    after any other write the watch is over anyway, and a free key gets no item."""
    return {
        "Key": key(options, stored),
        "UpdateExpression": "SET #note = :note",
        "ConditionExpression": "#rvn = :rvn",
        "ExpressionAttributeNames": {"#note": attribute, "#rvn": it.RVN},
        "ExpressionAttributeValues": {":note": {"S": note}, ":rvn": {"S": rvn}},
    }


def give_up_reservation(options: ClientOptions, stored: str, *, owner: str) -> Request:
    return {
        "Key": key(options, stored),
        "UpdateExpression": "REMOVE #reserved_by",
        "ConditionExpression": "#reserved_by = :me",
        "ExpressionAttributeNames": names(it.RESERVED_BY),
        "ExpressionAttributeValues": {":me": {"S": owner}},
    }


def mark_slot(options: ClientOptions, stored: str, *, owner: str, mark: str, now: float) -> Request:
    """Mark ``owner``'s release slot (``mark`` + its tag), whoever holds the key: no acquire
    attempt of that owner can land from then on (items.RELEASE_SLOTS)."""
    slot, tag = it.release_slot(owner)
    return {
        "Key": key(options, stored),
        "UpdateExpression": "SET #slot = :tag, #gc = if_not_exists(#gc, :gc)",
        "ExpressionAttributeNames": {"#slot": slot, "#gc": options.ttl_attribute},
        "ExpressionAttributeValues": {":tag": {"S": mark + tag}, ":gc": gc_at(options, now)},
    }


def release(
    options: ClientOptions,
    stored: str,
    *,
    owner: str,
    fence: int | None,
    rvn: str,
    now: float,
    handed_seq: int | None = None,
) -> Request:
    """The release write of ``owner``: the item keeps its fence, loses its owner, and
    remembers the release in the owner's slot (see items.RELEASE_SLOTS) and, for a
    lease whose ``fence`` is known, in the release ring (items.RING). With ``handed_seq``
    (release_handover), only while nobody wrote after the giver: an adopter's renewals
    carry the same owner id, and its lease is not the giver's to end."""
    slot, tag = it.release_slot(owner)
    all_names = {
        **names(it.OWNER, it.RVN, it.RELEASED_AT, it.RELEASED_BY),
        "#gc": options.ttl_attribute,
        "#slot": slot,
    }
    ring = ""
    if fence is not None:
        all_names["#ring"] = it.RING
        ring = f", #ring[{it.ring_index(fence)}] = :tag"  # a list index cannot be a placeholder
    request: Request = {
        "Key": key(options, stored),
        "UpdateExpression": (
            f"SET #released_at = :now, #released_by = :me, #slot = :tag{ring}, #gc = :gc, #rvn = :rvn REMOVE #owner"
        ),
        "ConditionExpression": "#owner = :me",
        "ExpressionAttributeNames": all_names,
        "ExpressionAttributeValues": {
            ":me": {"S": owner},
            ":tag": {"S": tag},
            ":now": it.num(now),
            ":rvn": {"S": rvn},
            ":gc": gc_at(options, now),
        },
    }
    if handed_seq is not None:
        request["ConditionExpression"] += " AND #seq = :handed"
        all_names["#seq"] = it.SEQ
        request["ExpressionAttributeValues"][":handed"] = it.num(handed_seq)
    return request


def set_limit(options: ClientOptions, stored: str, limit: int, *, force: bool = False) -> Request:
    """Store a semaphore's limit in its limit item: unless another is stored, or (``force``,
    the operator's change) whatever is. The item has no TTL attribute: it outlives idle
    slots, so that a process with another limit is refused however long the key idled."""
    request: Request = {
        "Key": key(options, stored),
        "UpdateExpression": "SET #limit = :n",
        "ExpressionAttributeNames": names(it.LIMIT),
        "ExpressionAttributeValues": {":n": it.num(limit)},
    }
    if force:
        # The limit before: holders() reads its slots too, where holders past a lowered
        # limit stay until they release.
        request["UpdateExpression"] = "SET #previous = if_not_exists(#limit, :n), #limit = :n"
        request["ExpressionAttributeNames"] = names(it.LIMIT, it.PREVIOUS_LIMIT)
    else:
        request["ConditionExpression"] = "attribute_not_exists(#limit) OR #limit = :n"
        request["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    return request


def break_condition(token: int | None) -> tuple[str, dict[str, Any]]:
    """An operator's break: a held key, or a free one that a waiter has reserved (it
    may have died); with ``token``, only while the lease still has it."""
    condition = "(attribute_exists(#owner) OR attribute_exists(#reserved_by))"
    values: dict[str, Any] = {}
    if token is not None:
        condition += " AND #fence = :token"
        values[":token"] = it.num(token)
    return condition, values


def break_(
    options: ClientOptions,
    stored: str,
    *,
    condition: str,
    values: Mapping[str, Any],
    mark: str,
    reason: str,
    by: str,
    now: float,
) -> Request:
    """A break: the owner and any reservation go, the fence stays, and who broke it and
    why is recorded. ``mark`` is the record version it writes: how a retry, or a read
    after lost replies, recognises it."""
    all_names = names(it.OWNER, it.RVN, it.RELEASED_AT, it.RELEASED_BY, it.BREAK_REASON, it.RESERVED_BY)
    if ":token" in values:
        all_names["#fence"] = it.FENCE
    return {
        "Key": key(options, stored),
        "UpdateExpression": (
            "SET #released_at = :now, #released_by = :by, #break_reason = :why, #gc = :gc, #rvn = :rvn "
            "REMOVE #owner, #reserved_by"
        ),
        "ConditionExpression": condition,
        "ExpressionAttributeNames": {**all_names, "#gc": options.ttl_attribute},
        "ExpressionAttributeValues": {
            ":now": it.num(now),
            ":by": {"S": f"{it.BREAK_PREFIX}{by}"},
            ":why": {"S": reason or "no reason given"},
            ":rvn": {"S": mark},
            ":gc": gc_at(options, now),
            **values,
        },
    }


def scan(
    options: ClientOptions,
    prefix: str = "",
    *,
    include_released: bool = False,
    start: Mapping[str, Any] | None = None,
    limit: int | None = 100,
) -> Request:
    """One page of a listing: keys under ``prefix``, held or reserved unless ``include_released``."""
    full_prefix = options.key_prefix + prefix
    filters: list[str] = []
    attrs: dict[str, str] = {}
    values: dict[str, Any] = {}
    if full_prefix:
        filters.append("begins_with(#k, :prefix)")
        attrs["#k"] = options.key_attribute
        values[":prefix"] = {"S": full_prefix}
    if not include_released:
        # Held keys, and free ones a waiter has reserved (breakable, shown as such).
        filters.append("(attribute_exists(#owner) OR attribute_exists(#reserved_by))")
        attrs.update(names(it.OWNER, it.RESERVED_BY))
    params: dict[str, Any] = {"ConsistentRead": True}
    if limit is not None:
        params["Limit"] = limit
    if filters:
        params["FilterExpression"] = " AND ".join(filters)
        params["ExpressionAttributeNames"] = attrs
        if values:
            params["ExpressionAttributeValues"] = values
    if start:
        params["ExclusiveStartKey"] = dict(start)
    return params
