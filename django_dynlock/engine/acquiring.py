"""Acquiring one key: the acquire loop, its writes and reads, and undoing an attempt that may have landed unseen.

When to look again and when a write may take the key over is decided by the wait
policy (waiting.py); the requests themselves are built in requests.py.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from botocore.exceptions import ClientError

from ..exceptions import BackendError, DynLockError, LockNotAcquired
from . import items as it
from . import observe
from . import requests as rq
from .clock import ServerClock, monotonic
from .events import Events
from .executors import Executors
from .failures import is_throttling
from .holding import Keeper
from .items import LeaseInfo
from .keylocks import KeyLocks
from .lease import Lease, LeaseClient
from .options import ClientOptions
from .stamps import Stamper
from .steps import Enter, OnCancel, Prepare, Send, Sleep, Steps
from .store import Store
from .text import printable
from .undoing import Undo, Undoer
from .waiting import Attempt, WaitPolicy, Watch

logger = logging.getLogger("django_dynlock")

T = TypeVar("T")

# A client's first write, before any reply told it DynamoDB's clock, stamps the
# expiry with this host's wall clock (see _restamp). A wall clock this far (seconds)
# from DynamoDB's is worth a warning.
CLOCK_WARNING = 1.0
# No look at the key in this round of the loop (an item of None means: no item).
UNSEEN = object()


@dataclass(frozen=True)
class Terms:
    """What one acquire call asks for: until when (monotonic) to wait, for how long to
    hold, and the holder's description to store."""

    give_up_at: float
    lease_seconds: float
    holder: Mapping[str, Any] | None
    metrics_name: str | None = None


def _may_land(attempt: Attempt) -> None:
    """A coroutine cancelled with a request in flight: a write of this attempt may land."""
    attempt.ambiguous = True


def _token_after(before: Mapping[str, Any], params: Mapping[str, Any]) -> int:
    """The fencing token an applied acquire write gave, from the item as it was: its
    fence plus one, or the write's base plus one on an item without one (see requests.acquire)."""
    fence = before.get(it.FENCE, {}).get("N") or params["ExpressionAttributeValues"][":base"]["N"]
    return int(fence) + 1


def _local_holder(lease: Lease | None) -> LeaseInfo | None:
    if lease is None:
        return None
    return LeaseInfo(
        key=lease.key,
        stored_key=lease.stored_key,
        token=lease.token,
        owner=lease.owner,
        rvn=None,
        lease_seconds=lease.lease_seconds,
        expires_at=None,
        acquired_at=None,
        host=socket.gethostname(),
        pid=os.getpid(),
        holder={k: str(v) for k, v in lease.holder.items()},
    )


class Acquirer:
    """Acquire one key, waiting as the wait policy says.

    Holds nothing long-lived (a ``Terms`` and an ``Attempt`` per call): one per client
    and process, over that process's store, clock, stamper, wait policy, in-process gate
    and thread pools. It hands each lease it gets to the keeper, and what an acquire
    that ends without one may have left to the undoer.
    """

    def __init__(
        self,
        options: ClientOptions,
        *,
        client: LeaseClient,
        client_id: str,
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
        self.client = client  # what a lease knows as its client: the facade
        self.client_id = client_id
        self.store = store
        self.clock = clock
        self.stamper = stamper
        self.waiting = waiting
        self.keylocks = keylocks
        self.keeper = keeper
        self.undoer = undoer
        self.events = events
        self.executors = executors

    def new_owner(self) -> str:
        """A new acquisition's owner id: this client's id, and a random part."""
        return f"{self.client_id}:{uuid.uuid4().hex[:12]}"

    def busy_here(self, key: str, stored: str, started: float, keys: tuple[str, ...] | None = None) -> LockNotAcquired:
        """What an acquire refused by the in-process gate raises (another thread or coroutine
        of this process holds ``stored``, or is acquiring it): the same for one key and
        several, sync and async, with the hint a waiter in another process would work out."""
        lease = next((lease for lease in list(self.keeper.held) if lease.stored_key == stored), None)
        return LockNotAcquired(
            key,
            holder=_local_holder(lease),
            # Still being acquired by the other thread: no holder to estimate from.
            retry_after=self.waiting.retry_after_local(lease) if lease is not None else None,
            waited=monotonic() - started,
            keys=keys,
        )

    def acquisition(
        self,
        key: str,
        stored: str,
        wait: float,
        lease_seconds: float,
        holder: Mapping[str, Any] | None,
        *,
        single: bool,
        metrics_name: str | None = None,
        slot: int = 0,
        quiet: bool = False,
        began: float | None = None,
        owner: str | None = None,
    ) -> Steps[Lease]:
        """One acquire of ``key``, its in-process gate and its undo included, as steps:
        ``steps.run`` drives it on a thread, ``steps.run_async`` from a coroutine.

        A semaphore (semaphore.py) tries its slots' items with this: ``slot`` is the
        lease's, ``quiet`` leaves the ``busy`` event to the semaphore's own acquire, and
        ``began`` is when that acquire began (the ``acquired`` event's ``waited``), and
        ``owner`` the owner id that reserved the slot's next turn."""
        started = monotonic()
        terms = Terms(started + wait, lease_seconds, holder, metrics_name)

        def acquiring(observed: observe.AcquireObservation | None) -> Steps[Lease]:
            return self._acquisition(
                key,
                stored,
                terms,
                started,
                single=single,
                observed=observed,
                slot=slot,
                quiet=quiet,
                began=began,
                owner=owner,
            )

        if quiet:  # a semaphore's slot: the semaphore's acquire is the one observed
            return (yield from acquiring(None))
        return (yield from self.observed(key, metrics_name, acquiring))

    def observed(
        self,
        key: str,
        metrics_name: str | None,
        acquiring: Callable[[observe.AcquireObservation | None], Steps[T]],
    ) -> Steps[T]:
        """``acquiring`` (an acquire's steps, given its observation), followed by the
        observers (observe.py) from start to end, if any: a lock's, a semaphore's, and an
        acquire_many's (one for the group, named by ``key``, its first key)."""
        started = monotonic()
        # Started before the first step, in the caller's context: a span's parent is current.
        observed = None
        if observe.OBSERVERS:
            observed = observe.start_acquire(self.options.alias, observe.metrics_name(key, metrics_name), key)
        if observed is None:
            return (yield from acquiring(None))
        try:
            result = yield from acquiring(observed)
        except LockNotAcquired as busy:
            observed.end("busy", waited=monotonic() - started, looks=observed.looks, token=None, error=busy)
            raise
        except BaseException as error:
            observed.end("error", waited=monotonic() - started, looks=observed.looks, token=None, error=error)
            raise
        if isinstance(result, Lease):
            observed.end(
                "acquired", waited=monotonic() - started, looks=result.upkeep.looks, token=result.token, error=None
            )
        else:  # a group: no one token, and its looks are not counted
            observed.end("acquired", waited=monotonic() - started, looks=observed.looks, token=None, error=None)
        return result

    def _acquisition(
        self,
        key: str,
        stored: str,
        terms: Terms,
        started: float,
        *,
        single: bool,
        observed: observe.AcquireObservation | None,
        slot: int,
        quiet: bool,
        began: float | None,
        owner: str | None,
    ) -> Steps[Lease]:
        try:
            if not (yield Enter(stored, terms.give_up_at)):
                raise self.busy_here(key, stored, started)  # another thread or coroutine of this process has it
            try:
                if not self.store.built:
                    yield Prepare(lambda: self.store.boto)
                attempt = Attempt(owner=owner or self.new_owner())
                yield OnCancel(functools.partial(_may_land, attempt))
                try:
                    lease = yield from self.acquire_steps(key, stored, terms, attempt, single=single, observed=observed)
                    self.waiting.remember(stored, None)
                except GeneratorExit:
                    raise
                except BaseException:
                    # However we leave (busy, an error, SystemExit, a task's time limit, a
                    # cancelled coroutine): undo an attempt that may have landed unseen,
                    # and give up our reserved turn.
                    yield Send(functools.partial(self.abandon, stored, attempt), holding=True)
                    raise
            except BaseException:
                self.keylocks.leave(stored)
                raise
        except LockNotAcquired as busy:
            if not quiet:
                self.events.emit("busy", key=key, holder=busy.holder, waited=busy.waited, name=terms.metrics_name)
            raise
        except Exception as error:
            if observe.OBSERVERS and not quiet:  # a semaphore tells of its own acquire's failure
                observe.tell_failed(self.options.alias, key, terms.metrics_name, monotonic() - started, error)
            raise
        lease.slot = slot
        self.keeper.start(lease, waited=monotonic() - (started if began is None else began))
        return lease

    def acquire_steps(
        self,
        key: str,
        stored: str,
        terms: Terms,
        attempt: Attempt,
        *,
        single: bool,
        observed: observe.AcquireObservation | None = None,
    ) -> Steps[Lease]:
        """The acquire loop, as steps for a driver (steps.py): it sends nothing and never
        sleeps itself, so that threads and asyncio run the same decisions."""
        # A waiter writes only when its last look showed the key free, the holder's
        # expiry past by DynamoDB's clock, or its rvn unchanged for a whole lease. In
        # between it watches with consistent reads: a read costs a fifth of a write, is
        # cheaper for the server to answer, and leaves the holder's own writes unqueued.
        began = monotonic()
        if self.stamper.clock_unread():
            yield Send(functools.partial(self.stamper.read_clock, stored))  # see Stamper.learn_clock
        watch = self.waiting.remembered(stored)  # what earlier calls saw of this key
        last_item: dict[str, Any] | None = None
        tries = 0
        # Looks in a row that DynamoDB throttled, earlier calls' on this key included:
        # a waiter called again and again (a view, a task retried) backs off all the same.
        throttled = watch.throttled if watch is not None else 0
        # A throttled key is first looked at by reading: waiters' writes take the write
        # units the holder's renewals need. try_acquire's one look stays a write.
        write = single or not throttled
        rechecked = False
        resumed = False  # a look read back a watch this client forgot (see below)
        stale = False
        holders_seen: set[str] = set()
        reserved_looks = 0
        seen_busy = False  # a look of this call showed the key held by someone else
        last_holder: str | None = None
        handoffs = 0  # holders that followed one another while we waited: Retry-After's estimate
        while True:
            due = self.waiting.takeover_in(last_item, watch, monotonic())
            if due is not None and due <= 0:
                write = True
            error: DynLockError | None = None
            # How we learn what the key holds now: a read to send, or an item at hand.
            look: Callable[[], dict[str, Any] | None] | None = None
            seen: dict[str, Any] | None | object = UNSEEN
            found_busy = False  # this look found the key held by someone else (a span event)
            looked_at = monotonic()
            clock_was_known = self.clock.known
            attempt.looks += 1  # a write, or else a read: one look either way
            if write:
                attempt.seq += 1
                takeover = watch.takeover_rvn(looked_at) if watch is not None else None
                params, expires = self.acquire_request(stored, attempt, terms, takeover)
                sent = monotonic()
                # However we leave this yield it may land: by a reply, a failure that says
                # whether it may have, or an exception the caller's own code raises into
                # the request (KeyboardInterrupt, a signal handler, a task's soft time
                # limit), which no clause below knows. Until one says it did not, an undo
                # must run (issue 36, D2). As the reservation below.
                was_ambiguous = attempt.ambiguous
                attempt.ambiguous = True
                try:
                    reply = yield Send(
                        functools.partial(
                            self.store.call,
                            "update_item",
                            "acquire a lock",
                            attempts=1,
                            hedge=True,  # a copy lands or fails by the same condition (seq, release slot)
                            late=functools.partial(self._late_copy_landed, stored, attempt.owner),
                            # The item as it was: the token follows from its fence, and a
                            # holder it names is one this write took over (_log_takeover).
                            ReturnValues="ALL_OLD",
                            **params,
                        )
                    )
                except ClientError as exc:
                    attempt.ambiguous = was_ambiguous  # its condition failed: not applied
                    # Where the server returns no item (dynalite) reading it costs a call:
                    # try_acquire skips it, unless only a watch of the holder's record
                    # version (kept between calls) can ever take the key over.
                    seen_busy = found_busy = True  # the condition failed: the key is not ours to take now
                    # Past the wait, only the first attempt's read: ``wait`` is a bound.
                    seen = self.store.old_item(exc, stored, read=False)
                    read = (not single or not self.clock.known) and (tries == 0 or monotonic() < terms.give_up_at)
                    if seen is None and read:
                        look = functools.partial(self.store.old_item, exc, stored, attempts=1)
                except DynLockError as exc:
                    attempt.ambiguous = was_ambiguous or getattr(exc, "ambiguous", False)
                    if not getattr(exc, "retryable", False):
                        raise
                    error = exc  # try the write again: it recognises itself
                else:
                    # Applied: the key is ours, and stays to undo until the lease is handed out.
                    before = reply.get("Attributes") or {}
                    token = _token_after(before, params)
                    self.log_takeover(key, before, attempt.owner, sent)
                    lease = self.new_lease(key, stored, attempt, token, terms, sent, expires)
                    if clock_was_known:
                        kept, item_now = True, None
                    else:
                        kept, item_now = yield Send(functools.partial(self._restamp, lease, attempt, expires, sent))
                    attempt.seq = lease.upkeep.seq  # a restamp is a write of this acquisition too
                    if kept and lease.is_held:
                        return lease
                    if kept:
                        # Ours, but the reply came too late to use: this thread did not run for
                        # about a lease. Never hand out a lease that has already ended: write
                        # again (it recognises itself and starts a fresh lease), once at once.
                        attempt.ambiguous = True
                        if not stale and (tries == 0 or monotonic() < terms.give_up_at):
                            stale = True
                            continue
                        error = BackendError("acquired, but too late to use (was this thread starved?)", retryable=True)
                    else:
                        attempt.ambiguous = was_ambiguous  # no longer ours: nothing of this write to undo
                        seen = item_now  # taken while we restamped: busy
            else:
                # Sent once: the loop is the retry, and a read tried three times could
                # outlast the wait by two request timeouts.
                look = functools.partial(self.store.get_item, stored, attempts=1)
            if look is not None or seen is not UNSEEN:
                try:
                    item = cast("dict[str, Any] | None", seen if look is None else (yield Send(look)))
                except DynLockError as read_error:
                    if not getattr(read_error, "retryable", False):
                        raise
                    error = read_error  # we only failed to look at the holder: keep waiting
                else:
                    if item is not None or not single or not self.clock.known:
                        last_item = item
                        found_busy = found_busy or bool(
                            item and item.get(it.OWNER, {}).get("S") not in (None, attempt.owner)
                        )
                        seen_busy = seen_busy or found_busy
                        before = watch
                        watch = self.waiting.observe(watch, item, monotonic(), attempt.owner)
                        yield from self.remember(stored, watch)
                        resumed = resumed or bool(watch and watch.noted and (before is None or before.rvn != watch.rvn))
                        if watch is not None and watch.holder is not None:
                            if last_holder is not None and watch.holder != last_holder:
                                handoffs += 1
                            last_holder = watch.holder
                        if item:
                            # Every acquire, takeovers included, removes the reservation.
                            attempt.reserved = item.get(it.RESERVED_BY, {}).get("S") == attempt.owner
                        if (
                            item
                            and not attempt.reserved
                            and self.waiting.starving(item, attempt.owner, holders_seen, began)
                        ):
                            attempt.reserved = True  # it may land even if we are interrupted: then give it back
                            attempt.reserved = yield Send(
                                functools.partial(self.reserve, stored, attempt.owner, item[it.OWNER]["S"])
                            )
            if observed is not None:
                observed.looks = attempt.looks
                if found_busy:
                    observed.busy_look(attempt.looks, last_item.get(it.OWNER, {}).get("S") if last_item else None)
            now = monotonic()
            if (
                write
                and not clock_was_known
                and self.clock.known
                and not rechecked
                and error is None
                and (last_item is None or self.waiting.expired(last_item, now))
            ):
                # Our first attempt could not ask for a takeover by DynamoDB's clock: we
                # learnt that clock from its reply. One more attempt that can.
                rechecked = True
                continue
            if write and resumed and error is None and watch is not None and watch.takeover_rvn(now) is not None:
                # The attempt went without the watch: this client had forgotten it, and the
                # look read it back from the item, due. One more attempt, with it, at once
                # (a try_acquire would give up here). A watch kept in memory went into the
                # attempt itself: those calls cost what they did.
                resumed = False
                write = True
                continue
            if single or now >= terms.give_up_at:
                raise self._gave_up(key, error, seen_busy, last_item, watch, handoffs, now - began)
            free = watch is None and error is None
            # An earlier attempt of ours, delayed in the network, may have landed after
            # we gave up waiting for its reply: the key is ours, but only a write tells
            # us the token (and gives it a fresh rvn, so our lease starts no earlier than
            # anyone's watch of it). Without it we would wait a whole lease for ourselves.
            ours = error is None and last_item is not None and last_item.get(it.OWNER, {}).get("S") == attempt.owner
            if (free or ours) and not write:
                write = True  # a read showed it free (or ours): take it at once
                continue
            # A failed write is tried again (it recognises itself if it was applied), and
            # so is one that failed on a key that looked free (or ours) a moment later.
            # A throttled one was not applied: the next look reads (see ``write`` above).
            write = write and ((error is not None and not is_throttling(error)) or free or ours)
            reserved_looks = reserved_looks + 1 if attempt.reserved else 0
            # A look let through halves the backoff rather than ending it (as TCP's
            # congestion window grows back): one token got through, not the partition's rate.
            throttled = throttled + 1 if is_throttling(error) else throttled // 2
            if watch is not None:
                watch.throttled = throttled
            if not throttled and self.waiting.looks_by_writing(reserved_looks, self.store.returns_item_on_failure):
                write = True
            delay = self.waiting.poll_delay(
                tries=tries,
                reserved=attempt.reserved,
                took=now - looked_at,
                error=error,
                item=last_item,
                watch=watch,
                now=now,
                give_up_at=terms.give_up_at,
                throttled=throttled,
                handoffs=handoffs,
            )
            tries += 1
            yield Sleep(delay)
            if throttled and monotonic() >= terms.give_up_at:
                # DynamoDB asked us to back off until past the wait: no look at its end.
                raise self._gave_up(key, error, seen_busy, last_item, watch, handoffs, monotonic() - began)

    def log_takeover(self, key: str, before: Mapping[str, Any] | None, owner: str, sent: float) -> None:
        """One INFO line when an acquire write sent at ``sent`` took the key from a holder
        that never released it (it crashed, hung or lost its network): ``before`` is the
        item as the write found it, so a holder it names was taken over (an acquire
        applies to a held item only once its lease has run out, or to our own)."""
        if not before or not logger.isEnabledFor(logging.INFO):
            return
        dead = before.get(it.OWNER, {}).get("S")
        info = self.keeper.info(before)
        if dead is None or dead == owner or info is None:
            return
        expires = it.number(before, it.EXPIRES_AT)
        bounds = self.clock.bounds(sent)
        if expires is None:
            how = "it stored no expiry (no Date in its replies); taken after watching it unchanged for a whole lease"
        elif bounds is None:
            how = "taken after watching it unchanged for a whole lease (DynamoDB's clock unknown)"
        else:
            # DynamoDB's clock is known within bounds (its Date has whole seconds): the
            # middle, and how far either way. Taken by the expiry once even the earliest
            # reading is past it, else by watching the holder's record version.
            ago, within = (bounds[0] + bounds[1]) / 2 - expires, (bounds[1] - bounds[0]) / 2
            by = "its expiry" if bounds[0] >= expires else "watching it unchanged for a whole lease"
            when = f"had expired {ago:.3f}s" if ago >= 0 else f"was to expire in {-ago:.3f}s"
            how = f"its lease {when} (±{within:.3f}s) by DynamoDB's clock; taken by {by}"
        logger.info(
            "took over %r from %s (token %s), which never released it: %s",
            key,
            printable(info.describe()),
            info.token,
            how,
        )

    def _gave_up(
        self,
        key: str,
        error: DynLockError | None,
        seen_busy: bool,
        item: dict[str, Any] | None,
        watch: Watch | None,
        handoffs: int,
        waited: float,
    ) -> DynLockError:
        """What an acquire that waited long enough raises: busy, or the failure that hid the key."""
        # A failed read only hid who holds the key: it is busy, not DynamoDB.
        if error is not None and not seen_busy:
            return error
        info = self.keeper.info(item)
        return LockNotAcquired(
            key,
            holder=info,
            retry_after=self.waiting.retry_after(info, item, watch, handoffs=handoffs, waited=waited),
            waited=waited,
        )

    def acquire_request(
        self,
        stored: str,
        attempt: Attempt,
        terms: Terms,
        takeover_rvn: str | None,
    ) -> tuple[dict[str, Any], float]:
        """The UpdateItem parameters of one acquire attempt (shared with transactions), and the expiry it stores."""
        _ = self.store.boto  # built before the stamp is taken: building it takes a while the first time
        at = monotonic()
        stamp = self.stamper.stamp(at)
        params = rq.acquire(
            self.options,
            stored,
            owner=attempt.owner,
            rvn=uuid.uuid4().hex,
            seq=attempt.seq,
            lease_seconds=terms.lease_seconds,
            stamp=stamp,
            now=self.clock.now(),
            earliest=self.clock.earliest(at),
            host=socket.gethostname(),
            pid=os.getpid(),
            thread=threading.current_thread().name,
            holder=terms.holder,
            takeover_rvn=takeover_rvn,
            base=self.stamper.fence_base(stamp),
            watch_only=self.stamper.watch_only(),
        )
        return params, stamp + terms.lease_seconds

    def new_lease(
        self,
        key: str,
        stored: str,
        attempt: Attempt,
        token: int,
        terms: Terms,
        sent: float,
        expires: float,
    ) -> Lease:
        lease = Lease(
            self.client,
            keeper=self.keeper,
            key=key,
            stored_key=stored,
            owner=attempt.owner,
            token=token,
            lease_seconds=terms.lease_seconds,
            sent_at=sent,
            ends_at=self.stamper.holder_end(sent, terms.lease_seconds, expires),
            seq=attempt.seq,
            holder=dict(terms.holder or {}),
            metrics_name=terms.metrics_name,
        )
        lease.upkeep.looks = attempt.looks
        return lease

    def _restamp(
        self, lease: Lease, attempt: Attempt, expires: float, sent: float
    ) -> tuple[bool, dict[str, Any] | None]:
        """After a client's first acquire, stamped by this host's wall clock: rewrite the
        expiry by DynamoDB's clock, now known from the reply, where the wall clock's stamp
        would cost something.

        Later than DynamoDB's clock could have stamped it, a crash now would hold the key
        past the promised bound; leaving less than half the lease, the holder could not
        trust its lease long enough (the reply bounds DynamoDB's clock only to about a
        second, which on a short lease is most of it). A wall clock right to within the
        reply's resolution, on a lease of a few seconds or more, costs nothing.

        Returns (kept, item): kept is False when someone took the key meanwhile (a
        clock far behind stored an expiry in the past); item is what we saw then.
        """
        latest = self.clock.latest(sent)
        if latest is None:
            if not self.stamper.watch_only():
                return True, None
            ahead = 0.0  # no Date in the reply either: store no expiry, not the wall clock's
        else:
            ahead = expires - (latest + lease.lease_seconds)
            if ahead <= 0 and lease.remaining() >= lease.lease_seconds / 2:
                return True, None
        if abs(ahead) > CLOCK_WARNING:
            logger.warning(
                "this host's wall clock is about %+.0fs off DynamoDB's: lock expiries are stamped by DynamoDB's clock",
                ahead,
            )
        try:
            with lease.upkeep.renew_lock:
                applied, item = self.keeper.renew_write(lease, lease.lease_seconds)
        except DynLockError:
            if lease.remaining() > 0:
                return True, None  # valid, only late to expire or short: the next heartbeat restamps it
            attempt.ambiguous = True  # it is ours, but expired: undo it
            raise
        return applied, item

    def _late_copy_landed(self, stored: str, owner: str, _: dict[str, Any]) -> None:
        """A hedged acquire's copy was applied after the other copy had won: our own item
        stood in its way until then (``seq``, the expiry, the record version), so it landed
        on a key we had released, or lost, since. It holds the key for nobody: free it now
        rather than at its expiry (the release slot refuses such a copy only until 16
        holders have come and gone, and at 50 handoffs a second a 0.3 s delay is that many)."""
        self.store.try_update(
            "free a key a late copy of our acquire took", attempts=1, **self.keeper.release_request(stored, owner)
        )

    def reserve(self, stored: str, owner: str, holder: str) -> bool:
        """Claim the next turn after ``holder``; whether the claim may have been written.

        Waiters poll, so whoever asks first after a release gets the key: usually the
        releaser itself, going round its loop. Go's sync.Mutex meets the same problem
        with a starvation mode; ours is this reservation. Only the acquire condition
        reads it, so it can delay others but never let two hold the key. It is
        conditioned on the holder we saw, not just on someone holding: a claim delayed
        in the network must not land under a later holder, after this acquisition has
        ended, and leave a reservation nobody will use.
        """
        try:
            self.store.call(
                "update_item",
                "reserve a busy lock",
                attempts=1,
                **rq.reserve(self.options, stored, owner=owner, holder=holder),
            )
        except ClientError:
            return False  # released meanwhile, or someone else has the next turn
        except DynLockError as exc:
            return bool(getattr(exc, "ambiguous", False))
        return True

    def remember(self, stored: str, watch: Watch | None) -> Steps[None]:
        """Keep what this look saw of the key between calls; write into their items the
        watches that memory drops and only they could take their keys by (see
        WaitPolicy.remember)."""
        for dropped, forgotten in self.waiting.remember(stored, watch):
            yield Send(functools.partial(self._note_watch, dropped, forgotten))

    def _note_watch(self, stored: str, watch: Watch) -> None:
        """Write a forgotten watch into its key's item. Best effort: if it fails, the next
        look at the key starts watching it afresh, as a new watcher would."""
        assert watch.rvn is not None
        try:
            self.store.call(
                "update_item",
                "note a watch of a busy lock",
                attempts=1,
                **rq.note_watch(
                    self.options,
                    stored,
                    attribute=self.waiting.note_attribute,
                    rvn=watch.rvn,
                    note=self.waiting.note(watch),
                ),
            )
        except ClientError:
            pass  # written again or released since: that watch is over
        except DynLockError as exc:
            logger.debug("could not note a watch of %r: %s", stored, exc)

    def abandon(self, stored: str, attempt: Attempt) -> bool:
        """Undo an acquire whose reply we never saw (it may have succeeded), and give up our reservation.

        Best effort, and never raises. One try per write, and none after one that cannot
        reach DynamoDB: ``wait`` stays a bound (plus a request timeout or two) in an
        outage. What could not get through is tried again in the background until
        DynamoDB answers (Undoer._undo_later): the key is free within seconds of the
        link healing, not once its expiry passes. Returns whether DynamoDB could be reached.
        """
        return self.undoer.undo([Undo.of(stored, attempt)])
