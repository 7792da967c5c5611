"""What every part of the lock client shares: its options, its process state, its events.

``LockClient`` (client.py) is built in layers, one module per role: this base;
``holding.py`` (renewals and releases); ``acquiring.py`` (one key); ``multikey.py``
(all or none of several keys); ``breaking.py`` (operators' breaks). Requests are
built in ``requests.py`` and sent by ``store.py``; ``waiting.py`` decides when a
waiter looks again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from ..exceptions import ClientClosed, DynLockError, LockNotAcquired
from . import requests as rq
from .clock import DRIFT, ServerClock, monotonic
from .executors import Executors
from .failures import safe_endpoint
from .heartbeat import THREAD_NAME_PREFIX, Heartbeater
from .items import LeaseInfo
from .keylocks import KeyLocks
from .lease import Lease
from .options import ClientOptions, check_seconds
from .store import Store
from .waiting import WaitPolicy

if TYPE_CHECKING:
    from .client import LockClient

logger = logging.getLogger("django_dynlock")

Listener = Callable[..., None]

# Every client alive in this process, to reset after fork (see the end of client.py).
live_clients: weakref.WeakSet[LockClient] = weakref.WeakSet()


class ClientBase:
    """The state and the helpers every role of the client uses. Not used on its own."""

    def __init__(
        self,
        options: ClientOptions,
        *,
        boto_client: Any = None,
        listeners: Iterable[Listener] = (),
    ):
        self.options = options
        self._listeners = list(listeners)
        self._closed = False
        # DynamoDB's clock as this client can bound it; see clock.py.
        self.clock = ServerClock(describe=f"DynamoDB at {safe_endpoint(options.endpoint_url)}")
        self._store = Store(options, self.clock, boto_client=boto_client, check_open=self._check_open)
        self._init_process_state()
        live_clients.add(self)  # type: ignore[arg-type]

    def _init_process_state(self) -> None:
        self._pid = os.getpid()
        self.client_id = f"{socket.gethostname()}:{self._pid}:{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._clock_read = False  # whether _learn_clock has asked in this process
        self._keylocks = KeyLocks()
        self._held: set[Lease] = set()
        self.clock = self.clock.fresh_copy()  # a lock a parent thread held at fork stays held
        self._store = self._store.fresh_copy(self.clock)  # and a parent's boto3 client is not the child's
        self._waiting = WaitPolicy(self.options, self.clock)
        self._heartbeater = Heartbeater(self._heartbeat, name=THREAD_NAME_PREFIX + self.options.alias)
        # Thread pools for asyncio callers (a parent's threads do not exist in a child).
        self._executors = Executors(f"dynlock-{self.options.alias}")

    def _after_fork(self) -> None:
        # A child shares none of its parent's leases: the parent keeps renewing them,
        # and the child must neither renew nor release them. Only the forking thread
        # exists in the child: a lock another thread held at fork stays held for ever,
        # so the child's copies get fresh ones before anything takes them.
        for lease in list(self._held):
            lease.upkeep.after_fork()
            lease.upkeep.mark_lost("fork", "a forked child does not own its parent's leases")
        self._init_process_state()

    @property
    def _as_client(self) -> LockClient:
        """This object as its users know it: leases keep it as their ``client``."""
        return cast("LockClient", self)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"{self!r} is closed: get a new one with get_lock_client()")
        if os.getpid() != self._pid:
            self._after_fork()

    def _emit(self, event: str, lease: Lease | None = None, **info: Any) -> None:
        if lease is not None:
            info = {"lease": lease, "key": lease.key, "token": lease.token, "holder": lease.holder, **info}
        for listener in self._listeners:
            try:
                listener(event, client=self, **info)
            except Exception:
                logger.exception("dynlock listener %r failed on %s", listener, event)

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

    def _busy_here(self, key: str, stored: str, started: float, keys: tuple[str, ...] | None = None) -> LockNotAcquired:
        """What an acquire refused by the in-process gate raises (another thread or coroutine
        of this process holds ``stored``, or is acquiring it): the same for one key and
        several, sync and async, with the hint a waiter in another process would work out."""
        lease = next((lease for lease in list(self._held) if lease.stored_key == stored), None)
        return LockNotAcquired(
            key,
            holder=self._local_holder(lease),
            # Still being acquired by the other thread: no holder to estimate from.
            retry_after=self._waiting.retry_after_local(lease) if lease is not None else None,
            waited=monotonic() - started,
            keys=keys,
        )

    @staticmethod
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

    def _start_holding(self, lease: Lease, *, waited: float) -> None:
        with self._lock:
            self._held.add(lease)
        self._heartbeater.add(lease, self._first_heartbeat(lease))
        logger.debug(
            "acquired %r (token %s) after %.3fs and %d look(s)", lease.key, lease.token, waited, lease.upkeep.looks
        )
        self._emit("acquired", lease, waited=waited)

    def _first_heartbeat(self, lease: Lease) -> float:
        # The first renewal comes early if the first write left a short validity.
        return min(self._period(lease.lease_seconds), max(lease.remaining() / 2, self.options.min_retry_delay))

    def _stop_holding(self, lease: Lease) -> None:
        with self._lock:
            if lease not in self._held:
                return
            self._held.discard(lease)
        self._keylocks.leave(lease.stored_key)
        self._heartbeater.discard(lease)

    def _learn_clock(self, stored: str) -> None:
        """Before a client's first write: one read, whose reply's Date tells DynamoDB's clock.

        So that the first write, like every later one, takes its expiry and the base of a
        new fencing counter from DynamoDB's clock, not this host's (a clock a minute slow
        stored an expiry a taker trusted, and started a counter below tokens already
        issued). Half a read unit, once per client and process. The acquire loops
        (acquire's and acquire_many's) ask ``_clock_unread`` and send ``_read_clock`` as
        one of their steps, so that their async forms read too; adopt calls this.
        """
        if self._clock_unread():
            self._read_clock(stored)

    def _clock_unread(self) -> bool:
        """Whether a first write must read the clock first; true once per client and process."""
        with self._lock:
            if self.clock.replies or self._clock_read:
                return False
            self._clock_read = True
            return True

    def _read_clock(self, stored: str) -> None:
        """The read of ``_learn_clock``. Best effort: if it fails, the write goes without
        (see requests.acquire, and _restamp in acquiring.py)."""
        try:
            self._store.call(
                "get_item",
                "learn DynamoDB's clock",
                attempts=1,
                Key=rq.key(self.options, stored),
                ProjectionExpression="#k",
                ExpressionAttributeNames={"#k": self.options.key_attribute},
            )
        except (DynLockError, ClientError) as exc:
            logger.debug("could not read DynamoDB's clock before a first write: %s", exc)

    def _watch_only(self) -> bool:
        """Whether writes store no expiry: DynamoDB's replies carry no Date, so nothing tells its
        clock, and this host's wall clock must not decide when a taker may take a lease."""
        if not self.clock.dateless:
            return False
        self._store.say_once(
            "no-date",
            "replies of DynamoDB server at %s carry no Date header: lock expiries are not stored, "
            "and a dead holder's key is taken over only by a waiter that watches it unchanged for a whole lease",
            safe_endpoint(self.options.endpoint_url),
        )
        return True

    def _fence_base(self, stamp: float) -> float | None:
        """The base of a new fencing counter: the stamp when it is DynamoDB's clock; None while
        that clock is unknown (the write then continues an existing counter only). A server
        without Date headers leaves only this host's wall clock (docs/protocol.md, known limits)."""
        return stamp if self.clock.known or self.clock.dateless else None

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
        now = monotonic()
        latest = self.clock.latest(now)
        if latest is not None:
            end = min(end, now + (expires - latest) / (1.0 + DRIFT))
        return end

    def _heartbeat(self, lease: Lease) -> float | None:
        """Renew one lease for the heartbeat thread; return the delay to the next renewal (holding.py)."""
        raise NotImplementedError
