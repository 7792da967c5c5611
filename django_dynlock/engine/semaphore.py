"""Semaphores: at most ``limit`` holders of one key (issue 38, docs/semaphores.md).

A semaphore of limit N is N slots, each an ordinary lease under the single-key
protocol (acquiring.py): slot 0 is the key's own item, the one a lock of that key
holds; slot i >= 1 is stored as ``key + U+FFFF + i``; one more item, ``key + U+FFFF +
"limit"``, stores N. A look reads all of them with one consistent BatchGetItem; a
waiter then writes to one free or expired slot, starting at a random one, with the
lock's own acquire (its in-process gate, conditions, takeover and undo included).
Holding, renewing, extending and releasing a slot are a lock's: one write of one
item each, whatever N is.

A process that asks for another limit than the stored one raises SemaphoreConflict
before it writes anything; ``set_limit`` is the operator's way to change it.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from ..exceptions import BackendError, DynLockError, LockNotAcquired, SemaphoreConflict
from . import items as it
from . import observe
from . import requests as rq
from .acquiring import Acquirer
from .clock import monotonic
from .events import Events
from .holding import Keeper
from .items import LeaseInfo
from .keys import limit_key, slot_key
from .lease import Lease
from .options import ClientOptions
from .steps import Prepare, Send, Sleep, Steps
from .store import Store
from .waiting import Attempt, WaitPolicy, Watch

Item = dict[str, Any]

# How many BatchGetItem calls holders() makes for the keys DynamoDB leaves unprocessed
# (a throttled table): then it gives up, as any other call that cannot get through.
UNPROCESSED_ROUNDS = 5

#: The holder metadata a semaphore's holder stores: the limit it asked for (as
#: ``election`` marks an election's term).
SEMAPHORE_HOLDER_KEY = "semaphore"


def stored_limit(item: Mapping[str, Any] | None) -> int | None:
    """The limit a limit item stores (None: no item, or none stored)."""
    value = (item or {}).get(it.LIMIT, {}).get("N")
    return int(value) if value is not None else None


def _counting(steps: Steps[Lease], sent: list[int]) -> Steps[Lease]:
    """``yield from steps``, counting in ``sent[0]`` the requests they make: a slot the
    in-process gate refused sent none, and the next slot may be tried at once."""
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if failure is None else steps.throw(failure)
        except StopIteration as done:
            lease: Lease = done.value
            return lease
        if isinstance(step, Send):
            sent[0] += 1
        reply, failure = None, None
        try:
            reply = yield step
        except BaseException as exc:  # thrown in by the driver: the inner steps undo what they must
            failure = exc


class SemaphoreAcquirer:
    """Acquire one of a key's ``limit`` slots, waiting as the wait policy says."""

    def __init__(
        self,
        options: ClientOptions,
        *,
        acquirer: Acquirer,
        store: Store,
        waiting: WaitPolicy,
        keeper: Keeper,
        events: Events,
    ):
        self.options = options
        self.acquirer = acquirer
        self.store = store
        self.waiting = waiting
        self.keeper = keeper
        self.events = events

    def read(self, stored_keys: list[str]) -> dict[str, Item | None]:
        """One consistent read of the items, sent once (the loop is the retry); a key
        DynamoDB left unprocessed is left out: it was not seen."""
        request = {"Keys": [rq.key(self.options, s) for s in stored_keys], "ConsistentRead": True}
        reply = self.store.call(
            "batch_get_item",
            "read a semaphore",
            attempts=1,
            table=False,
            RequestItems={self.options.table_name: request},
        )
        unprocessed = reply.get("UnprocessedKeys", {}).get(self.options.table_name, {}).get("Keys", [])
        skipped = {key[self.options.key_attribute]["S"] for key in unprocessed}
        found: dict[str, Item | None] = {s: None for s in stored_keys if s not in skipped}
        for item in reply.get("Responses", {}).get(self.options.table_name, []):
            found[item[self.options.key_attribute]["S"]] = item
        return found

    def agree(self, key: str, stored: str, limit: int) -> None:
        """Store ``limit`` as the key's, unless one is stored already; raise SemaphoreConflict
        if that one differs. A condition keeps two first users with different limits from
        both storing theirs."""
        meta = limit_key(stored)
        try:
            self.store.call("update_item", "store a semaphore's limit", **rq.set_limit(self.options, meta, limit))
        except ClientError as exc:
            now = stored_limit(self.store.old_item(exc, meta))
            if now is not None and now != limit:
                raise SemaphoreConflict(key, limit=limit, stored_limit=now) from None

    def set_limit(self, stored: str, limit: int) -> int | None:
        """The operator's change of a key's limit, whatever is stored; returns the old one."""
        reply = self.store.call(
            "update_item",
            "change a semaphore's limit",
            ReturnValues="ALL_OLD",
            **rq.set_limit(self.options, limit_key(stored), limit, force=True),
        )
        return stored_limit(reply.get("Attributes"))

    def holders(self, stored: str) -> tuple[int | None, list[LeaseInfo]]:
        """(the stored limit, the slots' items that name a holder): two reads. The slots
        of the limit before an operator lowered it too: their holders stay until they release."""
        item = self.store.get_item(limit_key(stored))
        limit = stored_limit(item)
        previous = (item or {}).get(it.PREVIOUS_LIMIT, {}).get("N")
        slots = [slot_key(stored, i) for i in range(max(limit or 1, int(previous or 0)))]
        found: dict[str, Item | None] = {}
        for _ in range(UNPROCESSED_ROUNDS):
            found.update(self.read([s for s in slots if s not in found]))
            if len(found) == len(slots):
                break
        else:
            raise BackendError(f"DynamoDB left {len(slots) - len(found)} of the slots unread", retryable=True)
        infos = []
        for index, slot in enumerate(slots):
            info = self.keeper.info(found[slot])
            if info is not None and info.is_held:
                infos.append(info if info.slot == index else _with_slot(info, index))
        return limit, infos

    def acquisition(
        self,
        key: str,
        stored: str,
        limit: int,
        wait: float,
        lease_seconds: float,
        holder: Mapping[str, Any] | None,
        *,
        single: bool,
        metrics_name: str | None = None,
    ) -> Steps[Lease]:
        """One acquire of a slot of ``key``, as steps (steps.run or steps.run_async drive it),
        followed by the observers as a lock's acquire is (its slots' own attempts are not)."""
        return self.acquirer.observed(
            key,
            metrics_name,
            lambda observed: self._acquisition(
                key, stored, limit, wait, lease_seconds, holder, single=single, metrics_name=metrics_name
            ),
        )

    def _acquisition(
        self,
        key: str,
        stored: str,
        limit: int,
        wait: float,
        lease_seconds: float,
        holder: Mapping[str, Any] | None,
        *,
        single: bool,
        metrics_name: str | None,
    ) -> Steps[Lease]:
        began = monotonic()
        give_up_at = began + wait
        meta = limit_key(stored)
        slots = [slot_key(stored, i) for i in range(limit)]
        if not self.store.built:
            yield Prepare(lambda: self.store.boto)
        # Whose watches and reservation these are: the owner id of the slot we reserve.
        me = self.acquirer.new_owner()
        reserved: list[str | None] = [None]  # the slot whose next turn we claimed
        try:
            return (
                yield from self._acquire_loop(
                    key,
                    slots,
                    meta,
                    limit,
                    lease_seconds,
                    holder,
                    single,
                    began,
                    give_up_at,
                    me,
                    reserved,
                    metrics_name,
                )
            )
        except GeneratorExit:
            raise
        except BaseException as error:
            if observe.OBSERVERS and isinstance(error, Exception) and not isinstance(error, LockNotAcquired):
                observe.tell_failed(self.options.alias, key, metrics_name, monotonic() - began, error)
            if reserved[0] is not None:  # give the turn back, however we leave
                yield Send(
                    functools.partial(self.acquirer.abandon, reserved[0], Attempt(owner=me, reserved=True)),
                    holding=True,
                )
            raise

    def _acquire_loop(
        self,
        key: str,
        slots: list[str],
        meta: str,
        limit: int,
        lease_seconds: float,
        holder: Mapping[str, Any] | None,
        single: bool,
        began: float,
        give_up_at: float,
        me: str,
        reserved: list[str | None],
        metrics_name: str | None,
    ) -> Steps[Lease]:
        """The look, write and sleep loop of ``acquisition``."""
        items: dict[str, Item | None] = {}
        watches: dict[str, Watch | None] = {}
        holders_seen: dict[str, set[str]] = {slot: set() for slot in slots}  # a slot changing hands
        agreed = False
        tries = 0
        while True:
            error: DynLockError | None = None
            looked_at = monotonic()
            try:
                found = yield Send(functools.partial(self.read, [meta, *slots]))
            except DynLockError as exc:
                if not getattr(exc, "retryable", False):
                    raise
                error = exc  # we only failed to look: keep waiting
                found = {}
            if meta in found:
                now_limit = stored_limit(found[meta])
                if now_limit is not None and now_limit != limit:
                    raise SemaphoreConflict(key, limit=limit, stored_limit=now_limit)
                if now_limit is None and not agreed:
                    # The key's first use (or an item deleted by hand): one write, once.
                    try:
                        yield Send(functools.partial(self.agree, key, slots[0], limit))
                    except DynLockError as exc:
                        if not getattr(exc, "retryable", False):
                            raise
                        error = exc
                agreed = agreed or error is None
            received = monotonic()
            for slot in slots:
                if slot in found:
                    items[slot] = found[slot]
                    watches[slot] = self.waiting.observe(watches.get(slot), found[slot], received, me)
                    yield from self.acquirer.remember(slot, watches[slot])
            if agreed and meta in found:
                lease = yield from self._try_slots(
                    key,
                    slots,
                    found,
                    items,
                    watches,
                    received,
                    lease_seconds,
                    holder,
                    began,
                    me,
                    reserved,
                    metrics_name,
                )
                if lease is not None:
                    return lease
                if reserved[0] is None and not single:
                    yield from self._reserve_if_starving(slots, found, items, holders_seen, began, me, reserved)
            now = monotonic()
            if single or now >= give_up_at:
                raise self._gave_up(key, slots, items, watches, error, now - began, metrics_name)
            seen: list[tuple[Mapping[str, Any] | None, Watch | None]] = [(items.get(s), watches.get(s)) for s in slots]
            yield Sleep(
                self.waiting.semaphore_delay(
                    tries=tries,
                    took=now - looked_at,
                    error=error,
                    seen=seen,
                    now=now,
                    give_up_at=give_up_at,
                    reserved=reserved[0] is not None,
                )
            )
            tries += 1

    def _try_slots(
        self,
        key: str,
        slots: list[str],
        found: dict[str, Item | None],
        items: dict[str, Item | None],
        watches: dict[str, Watch | None],
        received: float,
        lease_seconds: float,
        holder: Mapping[str, Any] | None,
        began: float,
        me: str,
        reserved: list[str | None],
        metrics_name: str | None,
    ) -> Steps[Lease | None]:
        """One write to a slot that looks free or expired (the one we reserved first, else
        from a random one on); None if none got us a lease."""
        start = random.randrange(len(slots))
        order = [*range(start, len(slots)), *range(start)]
        if reserved[0] is not None:
            mine = slots.index(reserved[0])
            order = [mine] + [i for i in order if i != mine]
        sent = [0]
        for index in order:
            slot = slots[index]
            if slot not in found:
                continue
            due = self.waiting.takeover_in(items[slot], watches[slot], received)
            if watches[slot] is not None and (due is None or due > 0):
                continue  # held (or another waiter's next turn), and not yet ours to take over
            try:
                lease: Lease = yield from _counting(
                    self.acquirer.acquisition(
                        key,
                        slot,
                        0.0,
                        lease_seconds,
                        holder,
                        single=True,
                        metrics_name=metrics_name,
                        slot=index,
                        quiet=True,
                        began=began,
                        # Only the slot we reserved is written as ``me``: a write of
                        # ours that was undone would keep that owner off a slot for good.
                        owner=me if slot == reserved[0] else None,
                    ),
                    sent,
                )
            except LockNotAcquired:
                if slot == reserved[0]:
                    reserved[0] = None  # the acquire gave our turn back
            else:
                if reserved[0] is not None and reserved[0] != slot:
                    yield Send(
                        functools.partial(self.acquirer.abandon, reserved[0], Attempt(owner=me, reserved=True)),
                        holding=True,
                    )
                reserved[0] = None
                return lease
            if sent[0]:
                break  # one write a look, as a lock's waiter: the next look says more
        return None

    def _reserve_if_starving(
        self,
        slots: list[str],
        found: dict[str, Item | None],
        items: dict[str, Item | None],
        holders_seen: dict[str, set[str]],
        began: float,
        me: str,
        reserved: list[str | None],
    ) -> Steps[None]:
        """Claim the next turn of one held slot, as a lock's starving waiter does (see
        Acquirer.reserve): whoever looks first after a release would otherwise get the
        slot, most often its own releaser going round its loop."""
        for slot in random.sample(slots, len(slots)):
            item = items.get(slot)
            if slot in found and item and self.waiting.starving(item, me, holders_seen[slot], began):
                if (yield Send(functools.partial(self.acquirer.reserve, slot, me, item[it.OWNER]["S"]))):
                    reserved[0] = slot
                return

    def _gave_up(
        self,
        key: str,
        slots: list[str],
        items: dict[str, Item | None],
        watches: dict[str, Watch | None],
        error: DynLockError | None,
        waited: float,
        metrics_name: str | None,
    ) -> DynLockError:
        """Busy (naming the holder whose slot will likely free first), or the failure that hid the slots."""
        held = [s for s in slots if items.get(s) and watches.get(s) is not None]
        if not held:
            if error is not None:
                return error
            busy = LockNotAcquired(key, waited=waited)
        else:
            hints = []
            for slot in held:
                info = self.keeper.info(items[slot])
                hints.append((self.waiting.retry_after(info, items[slot], watches[slot], waited=waited), slot, info))
            hint, slot, info = min(hints, key=lambda h: (h[0] is None, h[0] or 0.0))
            busy = LockNotAcquired(key, holder=info, retry_after=hint, waited=waited)
        self.events.emit("busy", key=key, holder=busy.holder, waited=busy.waited, name=metrics_name)
        return busy


def _with_slot(info: LeaseInfo, slot: int) -> LeaseInfo:
    return dataclasses.replace(info, slot=slot)
