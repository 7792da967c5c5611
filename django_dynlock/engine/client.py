"""The lock client: the lease protocol on top of one low-level boto3 DynamoDB client.

Every write is one conditional UpdateItem that carries this acquisition's owner id,
so a retry after a lost reply recognises its own earlier success. See
docs/protocol.md for the design and the reasoning behind each condition.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import socket
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ..exceptions import (
    BackendError,
    BreakUnconfirmed,
    ClientClosed,
    DynLockError,
    InvalidArgument,
    LockLost,
    LockNotAcquired,
)
from . import items as it
from . import requests as rq
from .clock import DRIFT, ServerClock, reply_date
from .connection import build_boto_client
from .errors import describe_endpoint, error_code, may_have_applied, safe_endpoint, translate
from .gates import Gates
from .heartbeat import THREAD_NAME_PREFIX, Heartbeater
from .items import LeaseInfo
from .lease import Lease, LeaseGroup, LeaseState
from .options import ClientOptions, check_seconds
from .requests import RESERVATION_GRACE
from .table import TableStatus, create_table, describe_table
from .text import printable

logger = logging.getLogger("django_dynlock")

Listener = Callable[..., None]

# DynamoDB's limit on items per TransactWriteItems / BatchGetItem request.
MAX_KEYS_PER_TRANSACTION = 100

# A waiter sleeps at least this many of its last round trips between looks at a busy key,
# but never more than this many MAX_RETRY_DELAYs for that reason.
POLL_ROUND_TRIPS = 4
POLL_DELAY_CAP = 10
# A waiter that sees another waiter has the next turn looks this many MAX_RETRY_DELAYs apart.
RESERVED_POLL = 4
# The waiter with the next turn looks by writing this many times, then by reading.
RESERVED_WRITES = 8
# A waiter that has waited this long (seconds), and seen the key go to others
# meanwhile, reserves the next turn.
STARVING_AFTER = 0.1
# A client's first write, before any reply told it DynamoDB's clock, stamps the
# expiry with this host's wall clock (see _restamp). A wall clock this far (seconds)
# from DynamoDB's is worth a warning.
CLOCK_WARNING = 1.0
# What a client remembers of busy keys between calls (their record versions), so that
# repeated short attempts add up to a watch of a whole lease.
WATCHES_KEPT = 1024
# How long a release that cannot reach DynamoDB is retried in the background (seconds).
RELEASE_RETRY_FOR = 600.0

_live_clients: weakref.WeakSet[LockClient] = weakref.WeakSet()


@dataclass
class _Attempt:
    """One acquisition's attempts: its owner id, the sequence number of its last write,
    whether a write may have landed unseen, and whether it holds the next turn."""

    owner: str
    seq: int = 0
    ambiguous: bool = False
    reserved: bool = False


@dataclass
class _Watch:
    """A waiter's observation of a holder's record version, on its own monotonic clock."""

    rvn: str | None
    since: float
    lease_seconds: float

    def takeover_at(self) -> float:
        return self.since + self.lease_seconds


class LockClient:
    """Acquire, renew, release, list and break leases stored in one DynamoDB table.

    Thread-safe. One instance per process and table is enough: it owns the boto3
    client (built lazily, rebuilt after fork) and one heartbeat thread for all its
    leases.
    """

    def __init__(
        self,
        options: ClientOptions,
        *,
        boto_client: Any = None,
        listeners: Iterable[Listener] = (),
    ):
        self.options = options
        self._boto = boto_client
        self._listeners = list(listeners)
        self._closed = False
        self._said: set[str] = set()
        # What the server supports, learnt on first use (dynalite lacks all three).
        self.returns_item_on_failure: bool | None = None
        self.has_transactions: bool | None = None
        # DynamoDB's clock as this client can bound it; see clock.py.
        self.clock = ServerClock(describe=f"DynamoDB at {safe_endpoint(options.endpoint_url)}")
        self._init_process_state()
        _live_clients.add(self)

    def _init_process_state(self) -> None:
        self._pid = os.getpid()
        self.client_id = f"{socket.gethostname()}:{self._pid}:{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._gates = Gates()
        self._held: set[Lease] = set()
        self._watches: OrderedDict[str, _Watch] = OrderedDict()
        self.clock = self.clock.fresh_copy()  # a lock a parent thread held at fork stays held
        self._heartbeater = Heartbeater(self._heartbeat, name=THREAD_NAME_PREFIX + self.options.alias)

    def _after_fork(self) -> None:
        # A child shares none of its parent's leases: the parent keeps renewing them,
        # and the child must neither renew nor release them. Only the forking thread
        # exists in the child: a lock another thread held at fork stays held for ever,
        # so the child's copies get fresh ones before anything takes them.
        for lease in list(self._held):
            lease._after_fork()
            lease._mark_lost("fork", "a forked child does not own its parent's leases")
        self._boto = None
        self._init_process_state()

    def __repr__(self) -> str:
        return f"<LockClient alias={self.options.alias!r} table={self.options.table_name!r}>"

    # -- plumbing ---------------------------------------------------------------
    @property
    def boto(self) -> Any:
        """The low-level boto3 DynamoDB client (thread-safe)."""
        self._check_open()
        if self._boto is None:
            with self._lock:
                if self._boto is None:
                    try:
                        self._boto = build_boto_client(self.options)
                    except BotoCoreError as exc:  # no region, an unknown profile, ...
                        raise self._translate(exc, "build the DynamoDB client") from exc
        return self._boto

    def where(self) -> str:
        """The endpoint and the region of the table, for messages (never user:password):
        the region as boto3 resolved it, which may come from the host's environment."""
        try:
            region = self.boto.meta.region_name
        except DynLockError:
            region = self.options.region_name
        return describe_endpoint(self.options.endpoint_url, region)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"{self!r} is closed: get a new one with get_lock_client()")
        if os.getpid() != self._pid:
            self._after_fork()

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event, **info)`` on lock events.

        Every event has ``client`` and ``key``; events about a held lease also have
        ``lease``, ``token`` and ``holder``. Events: ``acquired`` (``waited``),
        ``released`` (``held``), ``busy`` (``holder`` is a LeaseInfo or None,
        ``waited``), ``at_risk`` (a renewal failed, the lease is still valid;
        ``error``), ``recovered``, ``lost`` (``reason``), ``broken`` (``token``,
        ``reason``, ``by``). Listeners run in the thread that saw the event, often
        the heartbeat thread: keep them short.
        """
        self._listeners.append(listener)

    def _emit(self, event: str, lease: Lease | None = None, **info: Any) -> None:
        if lease is not None:
            info = {"lease": lease, "key": lease.key, "token": lease.token, "holder": lease.holder, **info}
        for listener in self._listeners:
            try:
                listener(event, client=self, **info)
            except Exception:
                logger.exception("dynlock listener %r failed on %s", listener, event)

    def _say_once(self, topic: str, message: str, *args: Any) -> None:
        if topic not in self._said:
            self._said.add(topic)
            logger.warning(message, *args)

    def _call(
        self, operation: str, action: str, *, attempts: int | None = None, table: bool = True, **params: Any
    ) -> dict[str, Any]:
        """One API request, retried quickly on transient failures.

        A failed condition is raised as the ClientError it is; every other botocore
        failure becomes a DynLockError. We retry here rather than in botocore, whose
        backoff sleeps up to a second: every write of ours is safe to repeat, because
        its condition recognises our own earlier success.
        """
        if table:
            params["TableName"] = self.options.table_name
        attempts = attempts or self.options.call_attempts
        ambiguous = False  # any attempt may have been applied, not only the last one
        for attempt in range(attempts):
            try:
                return self._send(operation, params)
            except ClientError as exc:
                if error_code(exc) in ("ConditionalCheckFailedException", "TransactionCanceledException"):
                    raise
                error = self._translate(exc, action)
            except BotoCoreError as exc:
                error = self._translate(exc, action)
            ambiguous = ambiguous or error.ambiguous  # type: ignore[attr-defined]
            if not getattr(error, "retryable", False) or attempt == attempts - 1:
                error.ambiguous = ambiguous  # type: ignore[attr-defined]
                raise error
            time.sleep(self._backoff(attempt))
        raise AssertionError("unreachable")

    def _send(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """One botocore call; its reply's Date header narrows our view of DynamoDB's clock."""
        method = getattr(self.boto, operation)
        sent = time.monotonic()
        try:
            reply = method(**params)
        except ClientError as exc:
            self.clock.observe(sent, time.monotonic(), reply_date(exc.response))
            raise
        self.clock.observe(sent, time.monotonic(), reply_date(reply))
        return reply

    def _translate(self, exc: BaseException, action: str) -> DynLockError:
        region = self._boto.meta.region_name if self._boto is not None else self.options.region_name
        error = translate(
            exc, table=self.options.table_name, endpoint=self.options.endpoint_url, action=action, region=region
        )
        error.ambiguous = may_have_applied(exc)  # type: ignore[attr-defined]
        return error

    def _key(self, stored_key: str) -> dict[str, Any]:
        return rq.key(self.options, stored_key)

    def _old_item(self, exc: ClientError, stored_key: str, *, read: bool = True) -> dict[str, Any] | None:
        """The item that made a condition fail: from the reply, or (if ``read``) one consistent read."""
        item = exc.response.get("Item")
        if item is not None:
            self.returns_item_on_failure = True
            return item
        if not read:
            return None
        if self.returns_item_on_failure is None:
            self.returns_item_on_failure = False
            self._say_once(
                "no-item",
                "DynamoDB server at %s returns no item on a failed condition: "
                "falling back to a consistent GetItem (one extra call per busy attempt)",
                safe_endpoint(self.options.endpoint_url),
            )
        return self._get_item(stored_key)

    def _get_item(self, stored_key: str) -> dict[str, Any] | None:
        reply = self._call("get_item", "read a lock", Key=self._key(stored_key), ConsistentRead=True)
        return reply.get("Item")

    def _info(self, item: Mapping[str, Any] | None) -> LeaseInfo | None:
        if not item:
            return None
        return LeaseInfo.from_item(item, key_attribute=self.options.key_attribute, key_prefix=self.options.key_prefix)

    def _new_owner(self) -> str:
        return f"{self.client_id}:{uuid.uuid4().hex[:12]}"

    def _lease_seconds(self, lease: float | None) -> float:
        value = self.options.lease_duration if lease is None else lease
        return check_seconds("lease", value)  # type: ignore[return-value]

    def _wait_seconds(self, wait: float | None) -> float:
        value = self.options.wait_timeout if wait is None else wait
        return check_seconds("wait", value, allow_zero=True)  # type: ignore[return-value]

    def _period(self, lease_seconds: float) -> float:
        return min(self.options.heartbeat_period, lease_seconds / 3.0)

    def _backoff(self, attempt: int) -> float:
        # Equal jitter: never zero, never in lockstep with other waiters.
        cap = min(self.options.max_retry_delay, self.options.min_retry_delay * 2**attempt)
        return cap / 2 + random.uniform(0, cap / 2)

    # -- acquire --------------------------------------------------------------
    def acquire(
        self,
        key: str,
        *,
        wait: float | None = None,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
    ) -> Lease:
        """Acquire ``key``, waiting up to ``wait`` seconds; raise LockNotAcquired if busy."""
        self._check_open()
        stored = self.options.prefixed(key)
        it.holder_map(holder)  # refused before any request if too large
        return self._acquire(key, stored, self._wait_seconds(wait), self._lease_seconds(lease), holder, single=False)

    def try_acquire(
        self,
        key: str,
        *,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Lease | None:
        """Exactly one attempt: the Lease, or None when the key is busy."""
        if "wait" in kwargs:
            raise InvalidArgument("try_acquire() makes exactly one attempt and takes no wait=; use acquire(wait=...)")
        if kwargs:
            raise InvalidArgument(f"try_acquire() got unexpected arguments: {', '.join(sorted(kwargs))}")
        self._check_open()
        stored = self.options.prefixed(key)
        it.holder_map(holder)  # refused before any request if too large
        try:
            return self._acquire(key, stored, 0.0, self._lease_seconds(lease), holder, single=True)
        except LockNotAcquired:
            return None

    def _acquire(
        self,
        key: str,
        stored: str,
        wait: float,
        lease_seconds: float,
        holder: Mapping[str, Any] | None,
        *,
        single: bool,
    ) -> Lease:
        started = time.monotonic()
        try:
            if not self._gates.enter(stored, wait):
                # Held (or being acquired) by another thread of this process: its lease
                # is renewed like any holder's, so a lease is the same hint as a remote one's.
                local = self._local_holder(stored)
                raise LockNotAcquired(
                    key,
                    holder=local,
                    retry_after=local.lease_seconds if local else None,
                    waited=time.monotonic() - started,
                )
            try:
                lease = self._acquire_remote(key, stored, started + wait, lease_seconds, holder, single=single)
            except BaseException:
                self._gates.leave(stored)
                raise
        except LockNotAcquired as busy:
            self._emit("busy", key=key, holder=busy.holder, waited=busy.waited)
            raise
        self._start_holding(lease, waited=time.monotonic() - started)
        return lease

    def _local_holder(self, stored: str) -> LeaseInfo | None:
        for lease in list(self._held):
            if lease.stored_key == stored:
                return LeaseInfo(
                    key=lease.key,
                    stored_key=stored,
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
        return None

    def _start_holding(self, lease: Lease, *, waited: float) -> None:
        with self._lock:
            self._held.add(lease)
        self._heartbeater.add(lease, self._first_heartbeat(lease))
        self._emit("acquired", lease, waited=waited)

    def _first_heartbeat(self, lease: Lease) -> float:
        # The first renewal comes early if the first write left a short validity.
        return min(self._period(lease.lease_seconds), max(lease.remaining() / 2, self.options.min_retry_delay))

    def _stop_holding(self, lease: Lease) -> None:
        with self._lock:
            if lease not in self._held:
                return
            self._held.discard(lease)
        self._gates.leave(lease.stored_key)
        self._heartbeater.discard(lease)

    # -- DynamoDB's clock --------------------------------------------------------
    def _stamp(self, at: float) -> float:
        """The time a write sent at monotonic ``at`` stamps into the item.

        The latest DynamoDB's clock can read then, so that no stored expiry comes
        earlier than its holder expects; this host's wall clock only for a client's
        very first request, before any reply (see _restamp).
        """
        latest = self.clock.latest(at)
        return latest if latest is not None else time.time()

    def _holder_end(self, sent: float, lease_seconds: float, expires: float) -> float:
        """Until when (monotonic) a write sent at ``sent`` that stored ``expires`` may be trusted, before the margin.

        Never past a lease after the send, and never past the moment DynamoDB's clock
        could reach the stored expiry, which is when takers may take the key.
        """
        end = sent + lease_seconds
        now = time.monotonic()
        latest = self.clock.latest(now)
        if latest is not None:
            end = min(end, now + (expires - latest) / (1.0 + DRIFT))
        return end

    def server_time(self) -> float:
        """DynamoDB's clock now (epoch seconds), as this client estimates it from its replies."""
        return self.clock.now()

    def server_datetime(self) -> dt.datetime:
        """:meth:`server_time` as an aware UTC datetime: the "now" to show lease times against."""
        return dt.datetime.fromtimestamp(self.clock.now(), tz=dt.UTC)

    def _expired(self, item: Mapping[str, Any] | None, at: float) -> bool:
        """Whether DynamoDB's clock, even at its earliest reading, lets us take the key (see below)."""
        due = self._takeover_by_clock_in(item, at)
        return due is not None and due <= 0

    def _takeover_by_clock_in(self, item: Mapping[str, Any] | None, at: float) -> float | None:
        """Seconds until DynamoDB's clock lets us take the key: the holder's expiry, or a lapsed reservation."""
        earliest = self.clock.earliest(at)
        if not item or earliest is None:
            return None
        if it.OWNER in item:
            deadline = it.number(item, it.EXPIRES_AT)
        elif it.RESERVED_BY in item:
            released = it.number(item, it.RELEASED_AT)
            deadline = None if released is None else released + RESERVATION_GRACE
        else:
            return None
        # The earliest reading grows a little slower than our clock (DRIFT).
        return None if deadline is None else (deadline - earliest) / (1.0 - DRIFT)

    def _takeover_in(self, item: Mapping[str, Any] | None, watch: _Watch | None, at: float) -> float | None:
        """Seconds until a write may take a busy key: by DynamoDB's clock, or after watching it a whole lease."""
        due = [
            d
            for d in (self._takeover_by_clock_in(item, at), watch.takeover_at() - at if watch else None)
            if d is not None
        ]
        return min(due) if due else None

    # -- what a client remembers of busy keys ---------------------------------------
    def _remembered(self, stored: str) -> _Watch | None:
        with self._lock:
            return self._watches.get(stored)

    def _remember(self, stored: str, watch: _Watch | None) -> None:
        with self._lock:
            if watch is None:
                self._watches.pop(stored, None)
                return
            self._watches[stored] = watch
            self._watches.move_to_end(stored)
            while len(self._watches) > WATCHES_KEPT:
                self._watches.popitem(last=False)

    # -- acquire attempts --------------------------------------------------------------
    def _acquire_request(
        self,
        stored: str,
        owner: str,
        seq: int,
        lease_seconds: float,
        holder: Mapping[str, Any] | None,
        takeover_rvn: str | None,
    ) -> tuple[dict[str, Any], float]:
        """The UpdateItem parameters of one acquire attempt (shared with transactions), and the expiry it stores."""
        _ = self.boto  # built before the stamp is taken: building it takes a while the first time
        at = time.monotonic()
        stamp = self._stamp(at)
        params = rq.acquire(
            self.options,
            stored,
            owner=owner,
            rvn=uuid.uuid4().hex,
            seq=seq,
            lease_seconds=lease_seconds,
            stamp=stamp,
            now=self.clock.now(),
            earliest=self.clock.earliest(at),
            host=socket.gethostname(),
            pid=os.getpid(),
            thread=threading.current_thread().name,
            holder=holder,
            takeover_rvn=takeover_rvn,
        )
        return params, stamp + lease_seconds

    def _observe(
        self, watch: _Watch | None, item: Mapping[str, Any] | None, received: float, owner: str
    ) -> _Watch | None:
        """Update the watch on the holder's record version; None when the key is free for ``owner``.

        A released key that another waiter has reserved counts as held until the
        reservation lapses (RESERVATION_GRACE after the release, by DynamoDB's clock).
        """
        if not item:
            return None
        if it.OWNER not in item:
            reserver = item.get(it.RESERVED_BY, {}).get("S", owner)
            if reserver == owner or self._expired(item, received):
                return None
        rvn = item.get(it.RVN, {}).get("S")
        if watch is not None and watch.rvn == rvn:
            return watch
        lease_ms = float(item.get(it.LEASE_MS, {}).get("N", self.options.lease_duration * 1000))
        return _Watch(rvn=rvn, since=received, lease_seconds=lease_ms / 1000.0)

    def _new_lease(
        self,
        key: str,
        stored: str,
        attempt: _Attempt,
        token: int,
        lease_seconds: float,
        sent: float,
        expires: float,
        holder: Mapping[str, Any] | None,
    ) -> Lease:
        return Lease(
            self,
            key=key,
            stored_key=stored,
            owner=attempt.owner,
            token=token,
            lease_seconds=lease_seconds,
            sent_at=sent,
            ends_at=self._holder_end(sent, lease_seconds, expires),
            seq=attempt.seq,
            holder=dict(holder or {}),
        )

    def _acquire_remote(
        self,
        key: str,
        stored: str,
        give_up_at: float,
        lease_seconds: float,
        holder: Mapping[str, Any] | None,
        *,
        single: bool,
    ) -> Lease:
        attempt = _Attempt(owner=self._new_owner())
        try:
            lease = self._acquire_loop(key, stored, give_up_at, lease_seconds, holder, attempt, single=single)
        except BaseException:
            # However we leave (busy, an error, SystemExit, a task's time limit): undo an
            # attempt that may have landed unseen, and give up our reserved turn.
            self._abandon(stored, attempt)
            raise
        self._remember(stored, None)
        return lease

    def _acquire_loop(
        self,
        key: str,
        stored: str,
        give_up_at: float,
        lease_seconds: float,
        holder: Mapping[str, Any] | None,
        attempt: _Attempt,
        *,
        single: bool,
    ) -> Lease:
        # A waiter writes only when its last look showed the key free, the holder's
        # expiry past by DynamoDB's clock, or its rvn unchanged for a whole lease. In
        # between it watches with consistent reads: a read costs a fifth of a write, is
        # cheaper for the server to answer, and leaves the holder's own writes unqueued.
        began = time.monotonic()
        watch = self._remembered(stored)  # what earlier calls saw of this key
        last_item: dict[str, Any] | None = None
        tries = 0
        write = True
        rechecked = False
        stale = False
        holders_seen: set[str] = set()
        reserved_looks = 0
        while True:
            due = self._takeover_in(last_item, watch, time.monotonic())
            if due is not None and due <= 0:
                write = True
            error: DynLockError | None = None
            look: Callable[[], dict[str, Any] | None] | None
            looked_at = time.monotonic()
            clock_was_known = self.clock.known
            if write:
                attempt.seq += 1
                takeover = watch.rvn if watch is not None and watch.rvn and looked_at >= watch.takeover_at() else None
                params, expires = self._acquire_request(
                    stored, attempt.owner, attempt.seq, lease_seconds, holder, takeover
                )
                sent = time.monotonic()
                try:
                    reply = self._call("update_item", "acquire a lock", attempts=1, ReturnValues="ALL_NEW", **params)
                except ClientError as exc:
                    # Where the server returns no item (dynalite) reading it costs a call:
                    # try_acquire skips it, unless only a watch of the holder's record
                    # version (kept between calls) can ever take the key over.
                    failed = exc
                    read = not single or not self.clock.known
                    look = lambda: self._old_item(failed, stored, read=read)  # noqa: E731, B023 (called in this iteration)
                except DynLockError as exc:
                    attempt.ambiguous = attempt.ambiguous or getattr(exc, "ambiguous", False)
                    if not getattr(exc, "retryable", False):
                        raise
                    error, look = exc, None  # try the write again: it recognises itself
                else:
                    lease = self._new_lease(
                        key,
                        stored,
                        attempt,
                        int(reply["Attributes"][it.FENCE]["N"]),
                        lease_seconds,
                        sent,
                        expires,
                        holder,
                    )
                    kept, item_now = (True, None) if clock_was_known else self._restamp(lease, attempt, expires, sent)
                    attempt.seq = lease._seq  # a restamp is a write of this acquisition too
                    if kept and lease.is_held:
                        return lease
                    if kept:
                        # Ours, but the reply came too late to use: this thread did not run for
                        # about a lease. Never hand out a lease that has already ended: write
                        # again (it recognises itself and starts a fresh lease), once at once.
                        attempt.ambiguous = True
                        if not stale:
                            stale = True
                            continue
                        error, look = (
                            BackendError("acquired, but too late to use (was this thread starved?)", retryable=True),
                            None,
                        )
                    else:
                        look = lambda: item_now  # noqa: E731, B023 (taken while we restamped: busy; called in this iteration)
            else:
                look = lambda: self._get_item(stored)  # noqa: E731
            if look is not None:
                try:
                    item = look()
                except DynLockError as read_error:
                    if not getattr(read_error, "retryable", False):
                        raise
                    error = read_error  # we only failed to look at the holder: keep waiting
                else:
                    if item is not None or not single or not self.clock.known:
                        last_item = item
                        watch = self._observe(watch, item, time.monotonic(), attempt.owner)
                        self._remember(stored, watch)
                        if item:
                            # Every acquire, takeovers included, removes the reservation.
                            attempt.reserved = item.get(it.RESERVED_BY, {}).get("S") == attempt.owner
                        if item and not attempt.reserved and self._starving(item, attempt.owner, holders_seen, began):
                            attempt.reserved = True  # it may land even if we are interrupted: then give it back
                            attempt.reserved = self._reserve(stored, attempt.owner, item[it.OWNER]["S"])
            now = time.monotonic()
            if (
                write
                and not clock_was_known
                and self.clock.known
                and not rechecked
                and error is None
                and (last_item is None or self._expired(last_item, now))
            ):
                # Our first attempt could not ask for a takeover by DynamoDB's clock: we
                # learnt that clock from its reply. One more attempt that can.
                rechecked = True
                continue
            if single or now >= give_up_at:
                if error is not None:
                    raise error
                info = self._info(last_item)
                raise LockNotAcquired(
                    key, holder=info, retry_after=self._retry_after(info, last_item, watch), waited=now - began
                )
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
            write = write and (error is not None or free or ours)
            reserved_looks = reserved_looks + 1 if attempt.reserved else 0
            if attempt.reserved and self.returns_item_on_failure and reserved_looks <= RESERVED_WRITES:
                # The waiter with the next turn asks by writing: its attempt lands as soon
                # as the key is free, a round trip sooner than a read and then a write,
                # and a failed one returns the item, like a read. Only its first few looks:
                # a failed write costs five times a read, and a long hold would add up.
                write = True
            if attempt.reserved:
                # The waiter with the next turn polls at the first step: the key idles until it looks.
                delay = self._backoff(0)
            else:
                delay = max(self._backoff(tries), self._busy_server_delay(now - looked_at, error))
                if last_item and it.RESERVED_BY in last_item:
                    # Another waiter has the next turn: ours comes after it, so a look
                    # sooner would only load the server the holder and that waiter need.
                    delay = max(delay, RESERVED_POLL * self.options.max_retry_delay * random.uniform(0.75, 1.25))
            tries += 1
            due = self._takeover_in(last_item, watch, now)
            if due is not None and due > 0:
                delay = min(delay, due)
            time.sleep(max(0.0, min(delay, give_up_at - now)))

    def _restamp(
        self, lease: Lease, attempt: _Attempt, expires: float, sent: float
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
            return True, None
        ahead = expires - (latest + lease.lease_seconds)
        if ahead <= 0 and lease.remaining() >= lease.lease_seconds / 2:
            return True, None
        if abs(ahead) > CLOCK_WARNING:
            logger.warning(
                "this host's wall clock is about %+.0fs off DynamoDB's: lock expiries are stamped by DynamoDB's clock",
                ahead,
            )
        try:
            with lease._renew_lock:
                applied, item = self._renew_write(lease, lease.lease_seconds)
        except DynLockError:
            if lease.remaining() > 0:
                return True, None  # valid, only late to expire or short: the next heartbeat restamps it
            attempt.ambiguous = True  # it is ours, but expired: undo it
            raise
        return applied, item

    def _busy_server_delay(self, took: float, error: DynLockError | None) -> float:
        """At least a few round trips between polls: on a busy server, faster polls would
        only queue our reads in front of the holder's release. A failed look (a timeout,
        a reset) says nothing about load, and a cap keeps one slow reply from stalling a
        waiter."""
        if error is not None:
            return 0.0
        return min(POLL_ROUND_TRIPS * took, POLL_DELAY_CAP * self.options.max_retry_delay) * random.uniform(0.75, 1.25)

    def _starving(self, item: Mapping[str, Any], owner: str, holders_seen: set[str], began: float) -> bool:
        """Whether this waiter has waited a while, seen the key change hands, and nobody has the next turn."""
        current = item.get(it.OWNER, {}).get("S")
        if current is None or current == owner:
            return False
        if len(holders_seen) < 2:  # all we need to know: the key changed hands
            holders_seen.add(current)
        return len(holders_seen) > 1 and time.monotonic() - began >= STARVING_AFTER and it.RESERVED_BY not in item

    def _reserve(self, stored: str, owner: str, holder: str) -> bool:
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
            self._call(
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

    def _retry_after(
        self, info: LeaseInfo | None, item: Mapping[str, Any] | None, watch: _Watch | None
    ) -> float | None:
        if info is None or not info.is_held:
            return None
        due = self._takeover_in(item, watch, time.monotonic())
        return max(0.0, due) if due is not None else info.lease_seconds

    def _abandon(self, stored: str, attempt: _Attempt) -> None:
        """Undo an acquire whose reply we never saw (it may have succeeded), and give up our reservation.

        Best effort, and never raises. One try per write, and none after one that cannot
        reach DynamoDB: ``wait`` stays a bound (plus a request timeout or two) in an
        outage. A write left undone leaves the key to be taken over once its expiry
        passes, as from a dead holder.
        """
        if (
            attempt.reserved
            and self._try_update(
                "give up a reservation",
                attempts=1,
                **rq.give_up_reservation(self.options, stored, owner=attempt.owner),
            )
            is None
        ):
            return
        if attempt.ambiguous:
            self._end_owner(stored, attempt.owner, "undo an unconfirmed acquire", mark="undone:", attempts=1)

    def _end_owner(
        self,
        stored: str,
        owner: str,
        action: str,
        *,
        mark: str,
        release: dict[str, Any] | None = None,
        attempts: int | None = None,
    ) -> None:
        """Make sure no write of ``owner`` holds the key, now or later: no ghost holder.

        An acquire of ours delayed in the network may land at any time while the key is
        free: after we gave up waiting for its reply, after a break, after a taker's
        release. First mark ``owner``'s release slot, whoever holds the key, so that
        none can land from then on (items.RELEASE_SLOTS); then release the key in case
        one landed before the mark. In the other order, one landing between the two
        writes would hold the key for nobody until its expiry passed.

        ``mark`` prefixes the tag: the acquire guard looks for the tag anywhere in the
        slot, but a release recognises its own earlier success by the bare tag alone,
        which these marks must never look like. ``release`` replaces the owner's own
        release write.
        """
        marked = self._try_update(
            action,
            attempts=attempts,
            **rq.mark_slot(self.options, stored, owner=owner, mark=mark, now=self.clock.now()),
        )
        if marked is not None:  # else DynamoDB cannot be reached: the release would not get through either
            self._try_update(action, attempts=attempts, **(release or self._release_request(stored, owner)))

    def _disown(self, lease: Lease) -> None:
        """After a lease was taken from us or broken: no late write of ours may hold the key (two writes, on losses only)."""
        if not lease._disowned:
            lease._disowned = True
            self._end_owner(lease.stored_key, lease.owner, "make sure a lost lease leaves no late write", mark="lost:")

    def _try_update(self, action: str, *, attempts: int | None = None, **params: Any) -> bool | None:
        """A best-effort write: True if applied, False if its condition failed, None if DynamoDB could not be reached."""
        stored = params["Key"][self.options.key_attribute]["S"]
        try:
            self._call("update_item", action, attempts=attempts, **params)
        except ClientError:
            return False
        except DynLockError as exc:
            # It may have meant to free a key that stays held until its expiry passes.
            logger.warning("could not %s of %r: %s", action, stored, exc)
            return None
        return True

    # -- many keys ------------------------------------------------------------
    def acquire_many(
        self,
        keys: Iterable[str],
        *,
        wait: float | None = None,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
    ) -> LeaseGroup:
        """Acquire all ``keys`` or none: one TransactWriteItems (ordered fallback without transactions)."""
        self._check_open()
        if isinstance(keys, str):
            raise InvalidArgument("acquire_many() takes a list of keys, not one string; use acquire(key)")
        by_stored = {self.options.prefixed(key): key for key in keys}
        it.holder_map(holder)  # refused before any request if too large
        if not by_stored:
            raise InvalidArgument("acquire_many() needs at least one key")
        if len(by_stored) > MAX_KEYS_PER_TRANSACTION:
            raise InvalidArgument(f"acquire_many() takes at most {MAX_KEYS_PER_TRANSACTION} keys, got {len(by_stored)}")
        wait_s, lease_s = self._wait_seconds(wait), self._lease_seconds(lease)
        started = time.monotonic()
        give_up_at = started + wait_s
        ordered = sorted(by_stored)  # one global order: no deadlock between processes
        entered: list[str] = []
        try:
            for stored in ordered:
                if not self._gates.enter(stored, max(0.0, give_up_at - time.monotonic())):
                    raise LockNotAcquired(
                        by_stored[stored],
                        holder=self._local_holder(stored),
                        waited=time.monotonic() - started,
                        keys=tuple(by_stored.values()),
                    )
                entered.append(stored)
            if self.has_transactions is not False and len(ordered) > 1:
                leases = self._acquire_transaction(by_stored, ordered, give_up_at, lease_s, holder)
            else:
                leases = None
            if leases is None:
                leases = self._acquire_in_order(by_stored, ordered, give_up_at, lease_s, holder)
        except BaseException as error:
            for stored in entered:
                self._gates.leave(stored)
            if isinstance(error, LockNotAcquired):
                self._emit("busy", key=error.key, holder=error.holder, waited=error.waited)
            raise
        for one in leases:
            self._start_holding(one, waited=time.monotonic() - started)
        return LeaseGroup(self, leases)

    def _acquire_in_order(
        self,
        by_stored: dict[str, str],
        ordered: list[str],
        give_up_at: float,
        lease_s: float,
        holder: Mapping[str, Any] | None,
    ) -> list[Lease]:
        """Without transactions: one key at a time, in sorted order; all or none.

        Each key is renewed by the heartbeat as soon as it is ours, so that a long wait
        for a later key cannot let an earlier one run out. If one was broken or taken
        meanwhile all are given back, and the whole group is tried again while ``wait``
        lasts: a group is only handed out while every lease in it holds.
        """
        started = time.monotonic()
        while True:
            leases: list[Lease] = []
            try:
                for stored in ordered:
                    lease = self._acquire_remote(by_stored[stored], stored, give_up_at, lease_s, holder, single=False)
                    leases.append(lease)
                    # Renewed, but not yet among held(): acquire_many() holds its gate until all are ours.
                    self._heartbeater.add(lease, self._first_heartbeat(lease))
            except BaseException:
                self._give_back(leases)
                raise
            lost = [lease for lease in leases if not lease.is_held]
            if not lost:
                return leases
            self._give_back(leases)
            now = time.monotonic()
            if now >= give_up_at:
                info = self.get(lost[0].key)
                raise LockNotAcquired(
                    lost[0].key,
                    holder=info,
                    retry_after=self._retry_after(info, None, None),
                    waited=now - started,
                    keys=tuple(by_stored.values()),
                )

    def _give_back(self, leases: list[Lease]) -> None:
        """Release the leases of a group that could not be completed (quietly: none was handed out)."""
        for lease in reversed(leases):
            lease._mark_released()  # no more renewals
            self._release_remote(lease, quiet=True)

    def _acquire_transaction(
        self,
        by_stored: dict[str, str],
        ordered: list[str],
        give_up_at: float,
        lease_s: float,
        holder: Mapping[str, Any] | None,
    ) -> list[Lease] | None:
        """All keys in one TransactWriteItems; None when the server has no transactions."""
        attempt = _Attempt(owner=self._new_owner())
        try:
            return self._transaction_loop(by_stored, ordered, give_up_at, lease_s, holder, attempt)
        except BaseException:
            for stored in ordered:
                self._abandon(stored, attempt)
            raise

    def _transaction_loop(
        self,
        by_stored: dict[str, str],
        ordered: list[str],
        give_up_at: float,
        lease_s: float,
        holder: Mapping[str, Any] | None,
        attempt: _Attempt,
    ) -> list[Lease] | None:
        watches: dict[str, _Watch | None] = {stored: self._remembered(stored) for stored in ordered}
        items: dict[str, dict[str, Any] | None] = {}
        tries = 0
        rechecked = False
        started = time.monotonic()
        while True:
            now = time.monotonic()
            clock_was_known = self.clock.known
            attempt.seq += 1
            updates = []
            expiries = []
            for stored in ordered:
                watch = watches.get(stored)
                takeover = watch.rvn if watch is not None and watch.rvn and now >= watch.takeover_at() else None
                request, expires = self._acquire_request(stored, attempt.owner, attempt.seq, lease_s, holder, takeover)
                updates.append({"Update": {"TableName": self.options.table_name, **request}})
                expiries.append(expires)
            sent = time.monotonic()
            error: DynLockError | None = None
            busy: str | None = None
            try:
                self._send("transact_write_items", {"TransactItems": updates})
            except ClientError as exc:
                code = error_code(exc)
                if code == "UnknownOperationException":
                    self.has_transactions = False
                    self._say_once(
                        "no-transactions",
                        "DynamoDB server at %s has no transactions: acquire_many() falls back to "
                        "acquiring keys one by one in sorted order, with rollback",
                        safe_endpoint(self.options.endpoint_url),
                    )
                    return None
                if code != "TransactionCanceledException":
                    error = self._translate(exc, "acquire several locks")
                    attempt.ambiguous = attempt.ambiguous or getattr(error, "ambiguous", False)
                    if not getattr(error, "retryable", False):
                        raise error from exc
                else:
                    reasons = exc.response.get("CancellationReasons") or []
                    received = time.monotonic()
                    for stored, reason in zip(ordered, reasons):
                        if reason.get("Code") == "ConditionalCheckFailed":
                            item = reason.get("Item")
                            if item is None:
                                item = self._get_item(stored)
                            items[stored] = item
                            watches[stored] = self._observe(watches.get(stored), item, received, attempt.owner)
                            self._remember(stored, watches[stored])
                            busy = busy or stored
                    if busy is None:
                        error = BackendError("transaction conflict", code="TransactionConflict", retryable=True)
            except BotoCoreError as exc:
                error = self._translate(exc, "acquire several locks")
                attempt.ambiguous = attempt.ambiguous or getattr(error, "ambiguous", False)
            else:
                self.has_transactions = True
                leases = self._leases_after_transaction(
                    by_stored, ordered, attempt, lease_s, sent, min(expiries), holder
                )
                held = all(lease.is_held for lease in leases)
                wall_stamped = not clock_was_known and self.clock.known
                if held and not (wall_stamped and not rechecked):
                    for stored in ordered:
                        self._remember(stored, None)
                    return leases
                # Ours, but stamped by this host's wall clock (a client's first write; the
                # reply told us DynamoDB's), or the replies came too late to use (see
                # _acquire_loop): write again, once at once. It recognises itself.
                attempt.ambiguous = True
                if not rechecked:
                    rechecked = True
                    continue
                error = BackendError("acquired, but too late to use (was this thread starved?)", retryable=True)
            now = time.monotonic()
            if now >= give_up_at:
                if busy is not None:
                    item = self._get_item(busy)
                    info = self._info(item)
                    raise LockNotAcquired(
                        by_stored[busy],
                        holder=info,
                        retry_after=self._retry_after(info, item, watches.get(busy)),
                        waited=now - started,
                        keys=tuple(by_stored.values()),
                    )
                assert error is not None
                raise error
            delay = self._backoff(tries)
            tries += 1
            for stored in ordered:
                # Only a takeover still to come shortens the sleep: one that is due already
                # went into this attempt, and another key kept the transaction from applying.
                due = self._takeover_in(items.get(stored), watches.get(stored), now)
                if due is not None and due > 0:
                    delay = min(delay, due)
            time.sleep(max(0.0, min(delay, give_up_at - now)))

    def _leases_after_transaction(
        self,
        by_stored: dict[str, str],
        ordered: list[str],
        attempt: _Attempt,
        lease_s: float,
        sent: float,
        expires: float,
        holder: Mapping[str, Any] | None,
    ) -> list[Lease]:
        # TransactWriteItems returns no attributes: read the new tokens back. While we
        # own the keys nobody else can change them, so this read is exact.
        tokens: dict[str, int] = {}
        pending: dict[str, Any] = {
            self.options.table_name: {"Keys": [self._key(s) for s in ordered], "ConsistentRead": True}
        }
        for _ in range(10):
            try:
                reply = self._send("batch_get_item", {"RequestItems": pending})
            except (ClientError, BotoCoreError) as exc:
                attempt.ambiguous = True
                raise self._translate(exc, "read the new fencing tokens") from exc
            for item in reply.get("Responses", {}).get(self.options.table_name, []):
                if item.get(it.OWNER, {}).get("S") == attempt.owner:
                    tokens[item[self.options.key_attribute]["S"]] = int(item[it.FENCE]["N"])
            pending = reply.get("UnprocessedKeys") or {}
            if not pending:
                break
            time.sleep(self._backoff(0))
        if len(tokens) != len(ordered):
            attempt.ambiguous = True
            raise BackendError("could not read back the fencing tokens of a multi-key acquire", retryable=True)
        return [self._new_lease(by_stored[s], s, attempt, tokens[s], lease_s, sent, expires, holder) for s in ordered]

    # -- renew ------------------------------------------------------------------
    def _renew_write(self, lease: Lease, lease_seconds: float) -> tuple[bool, dict[str, Any] | None]:
        """One renewal write: (True, None) when applied, else (False, the item that shows it is not ours).

        Raises DynLockError when DynamoDB cannot be reached. The caller holds
        ``lease._renew_lock``: renewals of one lease go out one at a time.
        """
        seq = lease._seq = lease._seq + 1
        sent = time.monotonic()
        stamp = self._stamp(sent)
        expires = stamp + lease_seconds
        try:
            request = rq.renew(
                self.options,
                lease.stored_key,
                owner=lease.owner,
                rvn=uuid.uuid4().hex,
                seq=seq,
                lease_seconds=lease_seconds,
                stamp=stamp,
            )
            self._call("update_item", "renew a lease", **request)
        except ClientError as exc:
            item = self._old_item(exc, lease.stored_key)
            # Still ours with this write's number (or a later one): an earlier try of this
            # same write was applied and its reply lost.
            if not (item and item.get(it.OWNER, {}).get("S") == lease.owner and (it.number(item, it.SEQ) or 0) >= seq):
                return False, item
        if lease._renewed(sent, lease_seconds, self._holder_end(sent, lease_seconds, expires)):
            self._emit("recovered", lease)
        return True, None

    def _renew_once(self, lease: Lease, lease_seconds: float) -> None:
        """One renewal; raises LockLost if the lease is gone, DynLockError on failure."""
        applied, item = self._renew_write(lease, lease_seconds)
        if not applied:
            reason, detail = self._why_not_ours(lease, item)
            self._lose(lease, reason, detail)
            raise lease._lost or LockLost(lease.key, lease.token, reason, detail)

    def _lose(self, lease: Lease, reason: str, detail: str) -> None:
        """Mark a lease lost, free its local gate and tell the listeners (once)."""
        if lease._mark_lost(reason, detail):
            logger.warning("%r lost: %s", lease, lease._lost)
            self._stop_holding(lease)
            self._emit("lost", lease, reason=reason)
            if reason in ("taken", "broken", "released"):  # the item shows it is not ours
                self._disown(lease)

    def _why_not_ours(self, lease: Lease, item: Mapping[str, Any] | None) -> tuple[str, str]:
        info = self._info(item)
        if info is None:
            return "taken", "the lock item is gone"
        if info.owner is None and info.was_broken:
            return "broken", printable(
                f"broken by {(info.released_by or '')[len(it.BREAK_PREFIX) :]}: {info.break_reason or 'no reason given'}"
            )
        if info.owner is None:
            return "released", "the lease was released"
        return "taken", printable(f"now held by {info.describe()} with token {info.token}")

    def _extend(self, lease: Lease, lease_seconds: float | None) -> None:
        self._check_open()
        new = self._lease_seconds(lease_seconds if lease_seconds is not None else lease.lease_seconds)
        lease.raise_if_lost()
        with lease._renew_lock:
            self._renew_once(lease, new)
        # The next renewal follows the new lease's period, not the old one's.
        self._heartbeater.add(lease, self._period(new))

    def _keep_for(self, lease: Lease, seconds: float) -> None:
        self._check_open()
        seconds = check_seconds("seconds", seconds)  # type: ignore[assignment]
        lease.raise_if_lost()
        with lease._renew_lock:
            self._renew_once(lease, seconds)
        # From here on nobody renews or releases it: the lease simply runs out, and any
        # acquire takes the key once its expiry has passed by DynamoDB's clock.
        lease._mark_released()
        self._stop_holding(lease)
        self._emit("released", lease, held=time.monotonic() - lease.acquired_monotonic)

    def _heartbeat(self, lease: Lease) -> float | None:
        """Renew one lease for the heartbeat thread; return the delay to the next renewal."""
        if lease._release_pending:
            lease._release_pending = False
            self._release_remote(lease, quiet=True)  # schedules itself again if it fails again
            return None
        if not lease.needs_renewal or self._closed:
            return None
        period = self._period(lease.lease_seconds)
        if time.monotonic() >= lease.valid_until:
            self._lose(lease, "expired", "no successful renewal within the lease (DynamoDB unreachable?)")
            return None
        try:
            with lease._renew_lock:
                self._renew_once(lease, lease.lease_seconds)
        except LockLost:
            return None
        except DynLockError as exc:
            if lease._mark_at_risk():
                logger.warning("renewing %r failed, lease at risk: %s", lease, exc)
                self._emit("at_risk", lease, error=exc)
            # Retry well before the lease runs out; the loop marks it lost at its end.
            return self._retry_delay(lease)
        return period * random.uniform(0.85, 1.0)

    def _retry_delay(self, lease: Lease) -> float:
        left = max(0.0, lease.valid_until - time.monotonic())
        return max(self.options.min_retry_delay, min(self._period(lease.lease_seconds) / 3, left / 3))

    # -- release ----------------------------------------------------------------
    def _release(self, lease: Lease) -> None:
        if os.getpid() != self._pid:
            self._check_open()
        if lease._state is LeaseState.RELEASED:
            raise LockLost(lease.key, lease.token, "released", "release() was already called")
        try:
            if lease._state is LeaseState.LOST and lease.lost_reason != "expired":
                raise lease._lost or LockLost(lease.key, lease.token, "taken")
            if self._closed:
                raise LockLost(lease.key, lease.token, "expired", "the lock client was closed before release")
            # Ran out before release: free the key if nobody took it, and say so all the same.
            expired = not lease.is_held
            self._release_remote(lease, quiet=False)
            if expired:
                self._lose(
                    lease, "expired", "the lease ran out before release(): the work may have overlapped another holder"
                )
                raise lease._lost or LockLost(lease.key, lease.token, "expired")
        finally:
            lease._mark_released()
            self._stop_holding(lease)
        self._emit("released", lease, held=time.monotonic() - lease.acquired_monotonic)

    def _release_remote(self, lease: Lease, *, quiet: bool) -> None:
        """The release write. On success the item keeps its fence and loses its owner.

        ``quiet`` (a retry in the background): never raises, and stops once the item
        shows the key is no longer ours.
        """
        try:
            self._call(
                "update_item",
                "release a lock",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **self._release_request(lease.stored_key, lease.owner, lease.token),
            )
        except ClientError as exc:
            try:
                item = self._old_item(exc, lease.stored_key)
            except DynLockError as read_error:
                # Our release may well have been applied (its reply lost); we cannot tell
                # now. Trying it again will: it recognises its own earlier success.
                if not quiet:
                    logger.warning(
                        "could not confirm the release of %r, retrying in the background: %s", lease, read_error
                    )
                self._release_later(lease)
                return
            if self._released_by_us(lease, item):
                return
            if quiet:
                self._disown(lease)  # taken or broken meanwhile
                return
            reason, detail = self._why_not_ours(lease, item)
            self._lose(lease, reason, detail)
            raise lease._lost or LockLost(lease.key, lease.token, reason, detail) from None
        except DynLockError as exc:
            if not quiet:
                # The work ran under a valid lease; only freeing it early failed.
                logger.warning("could not release %r, retrying in the background: %s", lease, exc)
            self._release_later(lease)

    @staticmethod
    def _released_by_us(lease: Lease, item: Mapping[str, Any] | None) -> bool:
        """Whether a release whose condition failed had an earlier try of its own applied.

        That try, its reply lost, wrote our owner id, and our tag into our release slot
        and into our fence's place in the release ring (items.RING), which the releases
        of the next holders keep. Breaks and takeovers write none of them.
        (Guessing from the fence instead read a break followed by another holder's
        acquire and release as our own release: issue 13, finding 3.)
        """
        if not item:
            return False
        slot, tag = it.release_slot(lease.owner)
        return (
            item.get(it.RELEASED_BY, {}).get("S") == lease.owner
            or item.get(slot, {}).get("S") == tag
            or it.in_ring(item, tag)
        )

    def _release_request(self, stored: str, owner: str, fence: int | None = None) -> dict[str, Any]:
        """The release write of ``owner`` (see requests.release)."""
        now = self.clock.now()
        return rq.release(self.options, stored, owner=owner, fence=fence, rvn=uuid.uuid4().hex, now=now)

    def _release_later(self, lease: Lease) -> None:
        """Have the heartbeat thread try a failed release again, until it is confirmed.

        Safe to repeat at any time: the release is conditioned on our owner id and
        recognises its own earlier success, and once the item shows another owner the
        retries stop. Without them the key would stay held until its expiry passed.
        Bounded by RELEASE_RETRY_FOR, with a backoff up to the heartbeat period.
        """
        now = time.monotonic()
        if lease._release_since is None:
            lease._release_since = now
        if self._closed or now - lease._release_since >= RELEASE_RETRY_FOR:
            logger.warning("gave up releasing %r: others take it over once its expiry has passed", lease)
            return
        delay = min(
            self._period(lease.lease_seconds), self.options.min_retry_delay * 2 ** min(lease._release_tries, 16)
        )
        lease._release_tries += 1
        lease._release_pending = True
        self._heartbeater.schedule(lease, now + delay)

    # -- inspection and operations ------------------------------------------------
    def get(self, key: str, *, include_released: bool = False) -> LeaseInfo | None:
        """The live holder of ``key`` (one consistent read), or None if it is free.

        With ``include_released``, the item whatever its state (None only if there is
        none): who released or broke it last, and the token it is at.
        """
        self._check_open()
        info = self._info(self._get_item(self.options.prefixed(key)))
        return info if info is not None and (include_released or info.is_held) else None

    def leases(
        self, prefix: str = "", *, include_released: bool = False, page_size: int | None = None
    ) -> Iterator[LeaseInfo]:
        """Iterate over live leases (or all items), one Scan page at a time.

        ``page_size=None`` reads DynamoDB's full 1 MB pages: the fewest calls.
        """
        start: dict[str, Any] | None = None
        while True:
            page, start = self.scan_page(prefix, include_released=include_released, start=start, limit=page_size)
            yield from page
            if start is None:
                return

    def scan_page(
        self,
        prefix: str = "",
        *,
        include_released: bool = False,
        start: dict[str, Any] | None = None,
        limit: int | None = 100,
    ) -> tuple[list[LeaseInfo], dict[str, Any] | None]:
        """One Scan call: the leases on it and the cursor of the next page (None at the end)."""
        self._check_open()
        full_prefix = self.options.key_prefix + prefix
        filters: list[str] = []
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        if full_prefix:
            filters.append("begins_with(#k, :prefix)")
            names["#k"] = self.options.key_attribute
            values[":prefix"] = {"S": full_prefix}
        if not include_released:
            # Held keys, and free ones a waiter has reserved (breakable, shown as such).
            filters.append("(attribute_exists(#owner) OR attribute_exists(#reserved_by))")
            names["#owner"] = it.OWNER
            names["#reserved_by"] = it.RESERVED_BY
        params: dict[str, Any] = {"ConsistentRead": True}
        if limit is not None:
            params["Limit"] = limit
        if filters:
            params["FilterExpression"] = " AND ".join(filters)
            params["ExpressionAttributeNames"] = names
            if values:
                params["ExpressionAttributeValues"] = values
        if start:
            params["ExclusiveStartKey"] = start
        reply = self._call("scan", "list locks", **params)
        page = [info for info in map(self._info, reply.get("Items", [])) if info is not None]
        return page, reply.get("LastEvaluatedKey")

    def break_lease(self, key: str, *, token: int | None = None, reason: str = "", by: str = "operator") -> bool:
        """Force-release ``key``: only if it still has ``token`` when one is given. True if broken."""
        self._check_open()
        stored = self.options.prefixed(key)
        if token is not None and (isinstance(token, bool) or not isinstance(token, int)):
            raise InvalidArgument(f"token must be an int fencing token, got {token!r}")
        mark = uuid.uuid4().hex  # the rvn this break writes: how a retry recognises it
        broken: str | None = None  # the owner it took the key from, when the reply says
        condition, extra = rq.break_condition(token)
        try:
            reply = self._call(
                "update_item",
                "break a lock",
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **self._break_request(stored, condition, extra, mark, reason, by),
            )
        except ClientError as exc:
            item = self._old_item(exc, stored)
            if not item or item.get(it.RVN, {}).get("S") != mark:
                return False
            # else: a retry after our own break was applied but its reply was lost
        except DynLockError as exc:
            if not getattr(exc, "ambiguous", False):
                raise  # never applied: nothing was broken
            # Every reply was lost, and the write may have landed: read the key back
            # rather than tell the operator that nothing was broken.
            try:
                landed = self._break_landed(stored, token, mark)
            except DynLockError:
                landed = None
            if landed is None:
                raise BreakUnconfirmed(key, token, mark) from exc
            if not landed:
                raise
        else:
            broken = reply.get("Attributes", {}).get(it.OWNER, {}).get("S")
            if broken is not None:
                # A copy of that holder's acquire still in the network could land on the
                # freed key and quietly undo the break. The slot is marked as broken, not
                # released: the holder's release() must not take it for its own.
                self._end_owner(
                    stored,
                    broken,
                    "make sure a broken lease leaves no late write",
                    mark=it.BREAK_PREFIX,
                    release=self._break_request(
                        stored, "#owner = :broken", {":broken": {"S": broken}}, uuid.uuid4().hex, reason, by
                    ),
                )
        self._broken(key, token, reason, by, broken)
        return True

    def confirm_break(
        self, key: str, *, token: int | None, mark: str, reason: str = "", by: str = "operator"
    ) -> bool | None:
        """Whether the break that raised ``BreakUnconfirmed`` (its ``token`` and ``mark``)
        was applied: True (then it is logged and ``broken`` is sent, as by a break that
        got its reply), False, or None when that cannot be told any more (the lease
        ended since, by this break or otherwise). Raises BackendError while DynamoDB
        still cannot be read."""
        self._check_open()
        landed = self._break_landed(self.options.prefixed(key), token, mark)
        if landed:
            self._broken(key, token, reason, by, None)
        return landed

    def _break_landed(self, stored: str, token: int | None, mark: str) -> bool | None:
        """Read the key back after a break whose replies were all lost."""
        item = self._get_item(stored)
        if item is not None and item.get(it.RVN, {}).get("S") == mark:
            return True  # the break's own record version: nothing has written since
        if item is None:
            return False  # a break leaves the item (and its fence) in place
        fence = item.get(it.FENCE, {}).get("N")
        still_there = it.OWNER in item or it.RESERVED_BY in item
        if token is not None and fence == str(token) and still_there:
            return False  # the same lease still holds (or is reserved): not broken
        return None  # ended since, by this break or otherwise

    def _broken(self, key: str, token: int | None, reason: str, by: str, broken: str | None) -> None:
        """After a break that was applied: log it, send ``broken``, tell our own holder."""
        stored = self.options.prefixed(key)
        logger.warning(
            "lock %r (token %s) broken by %s: %s", key, token, printable(by), printable(reason or "no reason given")
        )
        self._emit("broken", key=key, token=token, reason=reason, by=by)
        for lease in list(self._held):
            if lease.stored_key == stored and (token is None or lease.token == token):
                # Our own process held it: tell the holder now, not at its next heartbeat.
                # Its owner was ended above already; _lose need not do it again.
                lease._disowned = lease._disowned or lease.owner == broken
                self._lose(lease, "broken", printable(f"broken by {by}: {reason or 'no reason given'}"))

    def _break_request(
        self, stored: str, condition: str, values: dict[str, Any], mark: str, reason: str, by: str
    ) -> dict[str, Any]:
        """A break (see requests.break_)."""
        return rq.break_(
            self.options,
            stored,
            condition=condition,
            values=values,
            mark=mark,
            reason=reason,
            by=by,
            now=self.clock.now(),
        )

    def create_table(
        self,
        *,
        wait: bool = True,
        billing_mode: str = "PAY_PER_REQUEST",
        read_capacity: int | None = None,
        write_capacity: int | None = None,
        timeout: float = 60.0,
    ) -> TableStatus:
        """Create the lock table if needed and enable TTL. Idempotent."""
        self._check_open()
        try:
            return create_table(
                self,
                wait=wait,
                billing_mode=billing_mode,
                read_capacity=read_capacity,
                write_capacity=write_capacity,
                timeout=timeout,
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc, "create the lock table") from exc

    def describe_table(self) -> TableStatus:
        """The lock table's state (raises TableNotFound when missing)."""
        self._check_open()
        try:
            return describe_table(self)
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc, "describe the lock table") from exc

    @property
    def held(self) -> list[Lease]:
        """Leases this client holds in this process."""
        return list(self._held)

    def close(self, *, release: bool = False) -> None:
        """Stop renewing (and optionally release) every lease; returns promptly."""
        if self._closed:
            return
        if release and os.getpid() == self._pid:
            for lease in list(self._held):
                try:
                    self._release(lease)
                except DynLockError as exc:
                    logger.info("while closing, releasing %r failed: %s", lease, exc)
        self._closed = True
        self._heartbeater.stop()
        # Leases we keep are no longer renewed: their holders must not trust them.
        for lease in list(self._held):
            self._lose(lease, "closed", "the lock client was closed")

    @property
    def closed(self) -> bool:
        return self._closed


def _after_fork_in_child() -> None:
    for client in list(_live_clients):
        if not client._closed:
            client._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
