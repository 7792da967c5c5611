"""acquire_many(): all keys, all or none: one TransactWriteItems, or one key at a time in
sorted order with rollback where the server has no transactions (dynalite).

As for one key (acquiring.py), the loops are steps (steps.py) that send nothing and never
sleep themselves: ``acquire_many`` drives them on its thread, ``acquire_many_async`` from
a coroutine.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ..exceptions import BackendError, DynLockError, LockNotAcquired
from . import items as it
from . import observe
from . import requests as rq
from .acquiring import Acquirer, Terms
from .clock import ServerClock, monotonic
from .events import Events
from .executors import Executors
from .failures import error_code, is_throttling, safe_endpoint
from .holding import Keeper
from .keylocks import KeyLocks
from .lease import Lease, LeaseClient, LeaseGroup
from .options import ClientOptions
from .stamps import Stamper
from .steps import Enter, OnCancel, Prepare, Send, Sleep, Steps
from .store import Store, backoff
from .undoing import Undo, Undoer
from .waiting import Attempt, WaitPolicy, Watch

# DynamoDB's limit on items per TransactWriteItems / BatchGetItem request.
MAX_KEYS_PER_TRANSACTION = 100


@dataclass
class Progress:
    """What a multi-key acquire has so far, which its driver undoes if it ends early (an
    error, busy, a cancelled coroutine): writes that may have landed unseen, and the keys
    already ours (one at a time, without transactions)."""

    attempts: list[tuple[str, Attempt]] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)

    def interrupted(self) -> None:
        """A request was in flight when the caller left: its write may land."""
        for _, attempt in self.attempts:
            attempt.ambiguous = True


@dataclass(frozen=True)
class TransactionLook:
    """What one transaction of acquire_many found: the leases when it applied; else the
    failure, or the first key another holds; ``unsupported`` when the server has no
    transactions."""

    leases: list[Lease] | None = None
    error: DynLockError | None = None
    busy: str | None = None
    unsupported: bool = False


def _unreleased(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether the holder a look found (``before``) still held the key when our transaction
    took it (``after``, read back): it released meanwhile if it wrote its tag into its
    release slot or into the release ring at its token's index (items.RING), and a token
    more than one above its own means others held the key in between."""
    holder = before.get(it.OWNER, {}).get("S")
    fence, taken = before.get(it.FENCE, {}).get("N"), after.get(it.FENCE, {}).get("N")
    try:
        if holder is None or fence is None or taken is None or int(taken) != int(fence) + 1:
            return False
    except ValueError:  # an item edited by hand: nothing to say about it
        return False
    slot, tag = it.release_slot(holder)
    ring = after.get(it.RING, {}).get("L", [])
    at = it.ring_index(int(fence))
    return not ((at < len(ring) and ring[at] == {"S": tag}) or after.get(slot) == {"S": tag})


class GroupAcquirer:
    """acquire_many(): the transaction, its fallback, and reading back the tokens.

    Holds nothing long-lived (a ``Progress`` per call): one per client and process. It
    takes each key's in-process gate, waits, looks and writes through the one-key
    ``Acquirer`` where a key is acquired alone, and hands the leases to the keeper.
    """

    def __init__(
        self,
        options: ClientOptions,
        *,
        client: LeaseClient,
        acquirer: Acquirer,
        store: Store,
        clock: ServerClock,
        stamper: Stamper,
        waiting: WaitPolicy,
        keylocks: KeyLocks,
        keeper: Keeper,
        undoer: Undoer,
        events: Events,
        executors: Executors,
    ):
        self.options = options
        self.client = client  # what a group knows as its client: the facade
        self.acquirer = acquirer
        self.store = store
        self.clock = clock
        self.stamper = stamper
        self.waiting = waiting
        self.keylocks = keylocks
        self.keeper = keeper
        self.undoer = undoer
        self.events = events
        self.executors = executors

    def acquisition(
        self,
        by_stored: dict[str, str],
        wait_s: float,
        lease_s: float,
        holder: Mapping[str, Any] | None,
        *,
        metrics_name: str | None = None,
    ) -> Steps[LeaseGroup]:
        """acquire_many() after its arguments were checked (``by_stored`` maps stored keys
        to keys), its in-process gates and its undo included, as steps: ``steps.run``
        drives it on a thread, ``steps.run_async`` from a coroutine."""
        started = monotonic()
        terms = Terms(started + wait_s, lease_s, holder, metrics_name)
        ordered = sorted(by_stored)  # one global order: no deadlock between processes
        return (
            yield from self.acquirer.observed(
                by_stored[ordered[0]],
                metrics_name,
                lambda observed: self._acquisition(by_stored, ordered, terms, started),
            )
        )

    def _acquisition(
        self, by_stored: dict[str, str], ordered: list[str], terms: Terms, started: float
    ) -> Steps[LeaseGroup]:
        metrics_name = terms.metrics_name
        entered: list[str] = []
        try:
            for stored in ordered:
                if not (yield Enter(stored, terms.give_up_at)):
                    raise self.acquirer.busy_here(by_stored[stored], stored, started, tuple(by_stored.values()))
                entered.append(stored)
            if not self.store.built:
                yield Prepare(lambda: self.store.boto)
            progress = Progress()
            yield OnCancel(progress.interrupted)
            try:
                leases = yield from self._acquire_all_steps(by_stored, ordered, terms, progress)
            except GeneratorExit:
                raise
            except BaseException:
                yield Send(functools.partial(self._undo_all, progress), holding=True)
                raise
        except BaseException as error:
            self._leave_all(entered, error, metrics_name)
            if observe.OBSERVERS and isinstance(error, Exception) and not isinstance(error, LockNotAcquired):
                first = by_stored[ordered[0]]
                observe.tell_failed(self.options.alias, first, metrics_name, monotonic() - started, error)
            raise
        return self._held_group(leases, started)

    def _held_group(self, leases: list[Lease], started: float) -> LeaseGroup:
        for one in leases:
            self.keeper.start(one, waited=monotonic() - started)
        return LeaseGroup(self.client, leases)

    def _leave_all(self, entered: list[str], error: BaseException, metrics_name: str | None = None) -> None:
        for stored in entered:
            self.keylocks.leave(stored)
        if isinstance(error, LockNotAcquired):
            self.events.emit("busy", key=error.key, holder=error.holder, waited=error.waited, name=metrics_name)

    def _undo_all(self, progress: Progress) -> None:
        """Undo what an acquire_many that ends early may hold: its unconfirmed writes, then
        the keys it got; none tried after the first that cannot reach DynamoDB, whatever
        the number of keys: the rest goes on in the background (Undoer.undo)."""
        self.undoer.undo([Undo.of(stored, attempt) for stored, attempt in progress.attempts], progress.leases)

    def _acquire_all_steps(
        self, by_stored: dict[str, str], ordered: list[str], terms: Terms, progress: Progress
    ) -> Steps[list[Lease]]:
        if self.stamper.clock_unread():
            yield Send(functools.partial(self.stamper.read_clock, ordered[0]))  # see Stamper.learn_clock
        if self.store.has_transactions is not False and len(ordered) > 1:
            attempt = Attempt(owner=self.acquirer.new_owner())
            progress.attempts = [(stored, attempt) for stored in ordered]
            leases = yield from self._transaction_steps(by_stored, ordered, terms, attempt)
            # Ours now, given back if we leave before they are handed out; or None: the
            # server has no transactions, nothing was written.
            progress.leases = leases or []
            progress.attempts = []
            if leases is not None:
                return leases
        return (yield from self._in_order_steps(by_stored, ordered, terms, progress))

    def _in_order_steps(
        self,
        by_stored: dict[str, str],
        ordered: list[str],
        terms: Terms,
        progress: Progress,
    ) -> Steps[list[Lease]]:
        """Without transactions: one key at a time, in sorted order; all or none.

        Each key is renewed by the heartbeat as soon as it is ours, so that a long wait
        for a later key cannot let an earlier one run out. If one was broken or taken
        meanwhile all are given back, and the whole group is tried again while ``wait``
        lasts: a group is only handed out while every lease in it holds. The driver
        gives back ``progress.leases`` if this ends early.
        """
        started = monotonic()
        while True:
            progress.leases = []
            for stored in ordered:
                attempt = Attempt(owner=self.acquirer.new_owner())
                progress.attempts = [(stored, attempt)]
                try:
                    lease = yield from self.acquirer.acquire_steps(
                        by_stored[stored], stored, terms, attempt, single=False
                    )
                except LockNotAcquired as busy:  # says which keys were asked for, as a transaction's does
                    raise LockNotAcquired(
                        busy.key,
                        holder=busy.holder,
                        retry_after=busy.retry_after,
                        waited=monotonic() - started,
                        keys=tuple(by_stored.values()),
                    ) from None
                progress.attempts = []
                self.waiting.remember(stored, None)
                progress.leases.append(lease)
                # Renewed, but not yet among held(): acquire_many() holds their in-process locks until all are ours.
                self.keeper.renew_early(lease)
            lost = [lease for lease in progress.leases if not lease.is_held]
            if not lost:
                return progress.leases
            leases, progress.leases = progress.leases, []
            yield Send(functools.partial(self._give_back, leases))
            now = monotonic()
            if now >= terms.give_up_at:
                item = yield Send(functools.partial(self.store.get_item, lost[0].stored_key))
                info = self.keeper.info(item)
                info = info if info is not None and info.is_held else None
                raise LockNotAcquired(
                    lost[0].key,
                    holder=info,
                    retry_after=self.waiting.retry_after(info, None, None),
                    waited=now - started,
                    keys=tuple(by_stored.values()),
                )

    def _give_back(self, leases: list[Lease]) -> None:
        """Release the leases of a group that could not be completed (quietly: none was handed out)."""
        for lease in reversed(leases):
            lease.upkeep.mark_released()  # no more renewals
            self.keeper.release_remote(lease, quiet=True)

    def _transaction_steps(
        self,
        by_stored: dict[str, str],
        ordered: list[str],
        terms: Terms,
        attempt: Attempt,
    ) -> Steps[list[Lease] | None]:
        """All keys in one TransactWriteItems, tried again while ``wait`` lasts; None when
        the server has no transactions."""
        watches: dict[str, Watch | None] = {stored: self.waiting.remembered(stored) for stored in ordered}
        items: dict[str, dict[str, Any] | None] = {}
        tries = 0
        throttled = 0  # looks in a row that DynamoDB throttled
        rechecked = False
        started = monotonic()
        # The next look: a transaction, or (False) one read of the keys the last look found
        # busy. A transaction costs two write units a key, ten reads' worth, and takes
        # them from the partitions whose holders must renew: a waiter writes only when
        # its reads show every key free (or its own, or due for a takeover).
        write = True
        last_busy: str | None = None  # the key the last look that saw it found busy
        error: DynLockError | None
        while True:
            now = monotonic()
            attempt.looks += 1  # a transaction, or else one read of the busy keys
            if not write and any(
                due is not None and due <= 0
                for due in (self.waiting.takeover_in(items.get(s), watches.get(s), now) for s in ordered)
            ):
                write = True
            busy: str | None = None
            if not write:
                error = yield from self._read_busy_steps(ordered, items, watches, attempt.owner)
                busy = self._first_busy(ordered, items, watches, attempt.owner) if error is None else None
                if error is None and busy is None:
                    write = True  # they look free: take them at once
                    continue
            else:
                clock_was_known = self.clock.known
                look = yield from self._transaction_look_steps(by_stored, ordered, terms, attempt, items, watches, now)
                if look.unsupported:
                    return None
                error, busy = look.error, look.busy
                if look.leases is not None:
                    held = all(lease.is_held for lease in look.leases)
                    wall_stamped = not clock_was_known and self.clock.known
                    if held and not (wall_stamped and not rechecked):
                        for stored in ordered:
                            self.waiting.remember(stored, None)
                        return look.leases
                    # Ours, but stamped by this host's wall clock (a client's first write; the
                    # reply told us DynamoDB's), or the replies came too late to use (see
                    # Acquirer.acquire_steps): write again, once at once. It recognises itself.
                    attempt.ambiguous = True
                    if not rechecked:
                        rechecked = True
                        continue
                    error = BackendError("acquired, but too late to use (was this thread starved?)", retryable=True)
            now = monotonic()
            last_busy = busy or last_busy
            if now >= terms.give_up_at:
                # What the last look saw: a read now could outlast the wait. A failed
                # look only hid who holds a key seen busy before: busy, not DynamoDB.
                raise self._gave_up_many(by_stored, last_busy, items, watches, error, now - started)
            # Busy, or throttled (not applied): watch by reading. Any other failure of a
            # transaction is tried again, and recognises itself if it was applied.
            write = write and error is not None and not is_throttling(error)
            # A look let through halves the backoff rather than ending it (see acquiring.py).
            throttled = throttled + 1 if is_throttling(error) else throttled // 2
            delay = self.waiting.transaction_delay(
                tries=tries,
                seen=[(items.get(stored), watches.get(stored)) for stored in ordered],
                now=now,
                give_up_at=terms.give_up_at,
                throttled=throttled,
            )
            tries += 1
            yield Sleep(delay)

    def _transaction_look_steps(
        self,
        by_stored: dict[str, str],
        ordered: list[str],
        terms: Terms,
        attempt: Attempt,
        items: dict[str, dict[str, Any] | None],
        watches: dict[str, Watch | None],
        now: float,
    ) -> Steps[TransactionLook]:
        """One TransactWriteItems of every key; updates ``items`` and the watches of the
        keys whose conditions failed."""
        attempt.seq += 1
        updates = []
        expiries = []
        for stored in ordered:
            watch = watches.get(stored)
            takeover = watch.takeover_rvn(now) if watch is not None else None
            request, expires = self.acquirer.acquire_request(stored, attempt, terms, takeover)
            updates.append({"Update": {"TableName": self.options.table_name, **request}})
            expiries.append(expires)
        sent = monotonic()
        # It may land however we leave this yield, an exception the caller's code raises
        # into the request included: until a reply says it did not, an undo must run (see
        # Acquirer.acquire_steps).
        was_ambiguous = attempt.ambiguous
        attempt.ambiguous = True
        try:
            yield Send(functools.partial(self.store.send, "transact_write_items", {"TransactItems": updates}))
        except ClientError as exc:
            code = error_code(exc)
            if code in ("UnknownOperationException", "TransactionCanceledException"):
                attempt.ambiguous = was_ambiguous  # refused whole: not applied
            if code == "UnknownOperationException":
                self.store.learn_transactions(False)
                self.store.say_once(
                    "no-transactions",
                    "DynamoDB server at %s has no transactions: acquire_many() falls back to "
                    "acquiring keys one by one in sorted order, with rollback",
                    safe_endpoint(self.options.endpoint_url),
                )
                return TransactionLook(unsupported=True)
            if code != "TransactionCanceledException":
                error = self.store.translate(exc, "acquire several locks")
                attempt.ambiguous = was_ambiguous or getattr(error, "ambiguous", False)
                if not getattr(error, "retryable", False):
                    raise error from exc
                return TransactionLook(error=error)
            busy: str | None = None
            reasons = exc.response.get("CancellationReasons") or []
            received = monotonic()
            for stored, reason in zip(ordered, reasons):
                if reason.get("Code") != "ConditionalCheckFailed":
                    continue
                item = reason.get("Item")
                if item is None:
                    try:
                        # The loop is the retry.
                        item = yield Send(functools.partial(self.store.get_item, stored, attempts=1))
                    except DynLockError as read_error:
                        if not getattr(read_error, "retryable", False):
                            raise
                        item = items.get(stored)  # we only failed to look: keep what we saw
                items[stored] = item
                watches[stored] = self.waiting.observe(watches.get(stored), item, received, attempt.owner)
                yield from self.acquirer.remember(stored, watches[stored])
                busy = busy or stored
            if busy is None:
                return TransactionLook(
                    error=BackendError("transaction conflict", code="TransactionConflict", retryable=True)
                )
            return TransactionLook(busy=busy)
        except BotoCoreError as exc:
            error = self.store.translate(exc, "acquire several locks")
            attempt.ambiguous = was_ambiguous or getattr(error, "ambiguous", False)
            return TransactionLook(error=error)
        self.store.learn_transactions(True)
        leases: list[Lease] = yield Send(
            functools.partial(
                self._leases_after_transaction, by_stored, ordered, attempt, terms, sent, min(expiries), dict(items)
            )
        )
        return TransactionLook(leases=leases)

    def _read_busy_steps(
        self,
        ordered: list[str],
        items: dict[str, dict[str, Any] | None],
        watches: dict[str, Watch | None],
        owner: str,
    ) -> Steps[DynLockError | None]:
        """One consistent BatchGetItem of the keys the last look found busy; updates
        ``items`` and the watches, and returns the failure that hid them, if any."""
        looked = [stored for stored in ordered if watches.get(stored) is not None] or ordered
        try:
            found = yield Send(functools.partial(self._read_items, looked))
        except DynLockError as error:
            if not getattr(error, "retryable", False):
                raise
            return error  # we only failed to look: keep what we saw
        received = monotonic()
        for stored, item in found.items():
            items[stored] = item
            watches[stored] = self.waiting.observe(watches.get(stored), item, received, owner)
            yield from self.acquirer.remember(stored, watches[stored])
        return None

    def _read_items(self, stored_keys: list[str]) -> dict[str, dict[str, Any] | None]:
        """One consistent read of several keys' items, sent once (the loop is the retry); a
        key DynamoDB left unprocessed is left out: it was not seen."""
        request = {"Keys": [rq.key(self.options, s) for s in stored_keys], "ConsistentRead": True}
        reply = self.store.call(
            "batch_get_item", "read locks", attempts=1, table=False, RequestItems={self.options.table_name: request}
        )
        unprocessed = reply.get("UnprocessedKeys", {}).get(self.options.table_name, {}).get("Keys", [])
        skipped = {key[self.options.key_attribute]["S"] for key in unprocessed}
        found: dict[str, dict[str, Any] | None] = {s: None for s in stored_keys if s not in skipped}
        for item in reply.get("Responses", {}).get(self.options.table_name, []):
            found[item[self.options.key_attribute]["S"]] = item
        return found

    @staticmethod
    def _first_busy(
        ordered: list[str], items: dict[str, dict[str, Any] | None], watches: dict[str, Watch | None], owner: str
    ) -> str | None:
        """The first key that looks taken by someone else (our own earlier transaction,
        landed unseen, is ours to write again: it recognises itself)."""
        for stored in ordered:
            item = items.get(stored)
            if watches.get(stored) is not None and (item or {}).get(it.OWNER, {}).get("S") != owner:
                return stored
        return None

    def _gave_up_many(
        self,
        by_stored: dict[str, str],
        busy: str | None,
        items: dict[str, dict[str, Any] | None],
        watches: dict[str, Watch | None],
        error: DynLockError | None,
        waited: float,
    ) -> DynLockError:
        """What a multi-key acquire that waited long enough raises: busy (on the key last
        seen taken), or the failure that hid the keys."""
        if busy is None:
            assert error is not None
            return error
        item = items.get(busy)
        info = self.keeper.info(item)
        return LockNotAcquired(
            by_stored[busy],
            holder=info,
            retry_after=self.waiting.retry_after(info, item, watches.get(busy)),
            waited=waited,
            keys=tuple(by_stored.values()),
        )

    def _leases_after_transaction(
        self,
        by_stored: dict[str, str],
        ordered: list[str],
        attempt: Attempt,
        terms: Terms,
        sent: float,
        expires: float,
        seen: Mapping[str, dict[str, Any] | None] | None = None,
    ) -> list[Lease]:
        """The leases of an applied transaction; ``seen``: what the looks before it found
        (to name a crashed holder it took a key from)."""
        # TransactWriteItems returns no attributes: read the new tokens back. While we
        # own the keys nobody else can change them, so this read is exact.
        tokens: dict[str, int] = {}
        found: dict[str, dict[str, Any]] = {}
        pending: dict[str, Any] = {
            self.options.table_name: {"Keys": [rq.key(self.options, s) for s in ordered], "ConsistentRead": True}
        }
        for _ in range(10):
            try:
                reply = self.store.send("batch_get_item", {"RequestItems": pending})
            except (ClientError, BotoCoreError) as exc:
                attempt.ambiguous = True
                raise self.store.translate(exc, "read the new fencing tokens") from exc
            for item in reply.get("Responses", {}).get(self.options.table_name, []):
                if item.get(it.OWNER, {}).get("S") == attempt.owner:
                    tokens[item[self.options.key_attribute]["S"]] = int(item[it.FENCE]["N"])
                    found[item[self.options.key_attribute]["S"]] = item
            pending = reply.get("UnprocessedKeys") or {}
            if not pending:
                break
            time.sleep(backoff(self.options, 0))
        if len(tokens) != len(ordered):
            attempt.ambiguous = True
            raise BackendError("could not read back the fencing tokens of a multi-key acquire", retryable=True)
        for stored in ordered:
            before = (seen or {}).get(stored)
            if before and _unreleased(before, found[stored]):
                self.acquirer.log_takeover(by_stored[stored], before, attempt.owner, sent)
        return [self.acquirer.new_lease(by_stored[s], s, attempt, tokens[s], terms, sent, expires) for s in ordered]
