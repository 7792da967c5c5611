"""What every part of the lock client shares: its options, its process state, and its
collaborators: ``Events`` (events.py), ``Stamper`` (stamps.py), ``Keeper`` (holding.py),
``Breaker`` (breaking.py) and ``Handovers`` (handover.py).

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
import uuid
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from ..exceptions import ClientClosed, LockNotAcquired
from .breaking import Breaker
from .clock import ServerClock, monotonic
from .events import Events, Listener
from .executors import Executors
from .failures import safe_endpoint
from .handover import Handovers
from .heartbeat import Heartbeater
from .holding import Keeper
from .items import LeaseInfo
from .keylocks import KeyLocks
from .lease import Lease
from .options import ClientOptions, check_seconds
from .stamps import Stamper
from .store import Store
from .waiting import WaitPolicy

if TYPE_CHECKING:
    from .client import LockClient

logger = logging.getLogger("django_dynlock")

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
        self._events = Events(self, listeners)
        self._closed = False
        # DynamoDB's clock as this client can bound it; see clock.py.
        self.clock = ServerClock(describe=f"DynamoDB at {safe_endpoint(options.endpoint_url)}")
        self._store = Store(options, self.clock, boto_client=boto_client, check_open=self._check_open)
        self._keeper = Keeper(options, self._events, check_open=self._check_open, is_closed=lambda: self._closed)
        self._init_process_state()
        live_clients.add(self)  # type: ignore[arg-type]

    def _init_process_state(self) -> None:
        self._pid = os.getpid()
        self.client_id = f"{socket.gethostname()}:{self._pid}:{uuid.uuid4().hex[:8]}"
        self._keylocks = KeyLocks()
        self.clock = self.clock.fresh_copy()  # a lock a parent thread held at fork stays held
        self._store = self._store.fresh_copy(self.clock)  # and a parent's boto3 client is not the child's
        self._stamper = Stamper(self.options, self.clock, self._store)  # a child reads the clock afresh
        self._keeper.start_process(self._store, self.clock, self._stamper, self._keylocks)
        self._breaker = Breaker(self.options, self._store, self.clock, self._keeper, self._events)
        self._handovers = Handovers(
            self.options,
            client=self._as_client,
            store=self._store,
            clock=self.clock,
            stamper=self._stamper,
            keeper=self._keeper,
            keylocks=self._keylocks,
            busy_here=self._busy_here,
        )
        self._waiting = WaitPolicy(self.options, self.clock)
        # Thread pools for asyncio callers (a parent's threads do not exist in a child).
        self._executors = Executors(f"dynlock-{self.options.alias}")

    def _after_fork(self) -> None:
        # A child shares none of its parent's leases: the parent keeps renewing them,
        # and the child must neither renew nor release them. Only the forking thread
        # exists in the child: a lock another thread held at fork stays held for ever,
        # so the child's copies get fresh ones before anything takes them.
        self._keeper.after_fork()
        self._init_process_state()

    @property
    def _heartbeater(self) -> Heartbeater:
        """The keeper's heartbeat (tests stop it to play a process paused past its lease)."""
        return self._keeper.heartbeater

    @property
    def _as_client(self) -> LockClient:
        """This object as its users know it: leases keep it as their ``client``."""
        return cast("LockClient", self)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"{self!r} is closed: get a new one with get_lock_client()")
        if os.getpid() != self._pid:
            self._after_fork()

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

    def _busy_here(self, key: str, stored: str, started: float, keys: tuple[str, ...] | None = None) -> LockNotAcquired:
        """What an acquire refused by the in-process gate raises (another thread or coroutine
        of this process holds ``stored``, or is acquiring it): the same for one key and
        several, sync and async, with the hint a waiter in another process would work out."""
        lease = next((lease for lease in list(self._keeper.held) if lease.stored_key == stored), None)
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
