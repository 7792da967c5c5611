"""The lock client: the lease protocol on top of one low-level boto3 DynamoDB client.

Every write is one conditional UpdateItem that carries this acquisition's owner id,
so a retry after a lost reply recognises its own earlier success. See
docs/protocol.md for the design and the reasoning behind each condition, and
docs/architecture.md for where each part of the client lives: this module is its
public face, a facade over the collaborators it builds in each process (``_init_process_state``):
``Events`` (events.py), ``Stamper`` (stamps.py), ``Keeper`` (holding.py), ``Undoer``
(undoing.py), ``Acquirer`` (acquiring.py), ``GroupAcquirer`` (multikey.py), ``Breaker``
(breaking.py) and ``Handovers`` (handover.py); the requests are built in requests.py,
sent by store.py, and the waiting decided in waiting.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import os
import socket
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from ..exceptions import ClientClosed, DynLockError, InvalidArgument, InvalidKey, LockNotAcquired
from . import items as it
from . import requests as rq
from .acquiring import Acquirer
from .breaking import Breaker
from .clock import ServerClock, monotonic
from .election import STANDBY_POLL, Election
from .events import Events, Listener
from .executors import Executors
from .failures import describe_endpoint, safe_endpoint
from .handover import Handover, Handovers
from .heartbeat import Heartbeater
from .holding import Keeper
from .items import LeaseInfo
from .keylocks import KeyLocks
from .keys import MAX_KEY_BYTES, MAX_LIMIT, limit_key
from .lease import Lease, LeaseGroup
from .multikey import MAX_KEYS_PER_TRANSACTION, GroupAcquirer
from .options import ClientOptions, check_seconds
from .semaphore import SEMAPHORE_HOLDER_KEY, SemaphoreAcquirer, stored_limit
from .stamps import Stamper
from .steps import Steps, run, run_async
from .store import Store
from .table import TableStatus, create_table, describe_table
from .undoing import Undoer
from .waiting import WaitPolicy

logger = logging.getLogger("django_dynlock")

__all__ = ["Handover", "Listener", "LockClient"]

T = TypeVar("T")

# What resets each client alive in this process after fork (see the end of this module):
# a weak reference to the client's own method, which goes with the client.
_fork_resets: set[weakref.WeakMethod[Callable[[], None]]] = set()


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
        self._events = Events(self, listeners, alias=options.alias)
        self._closed = False
        # DynamoDB's clock as this client can bound it; see clock.py.
        self.clock = ServerClock(describe=f"DynamoDB at {safe_endpoint(options.endpoint_url)}")
        self._store = Store(options, self.clock, boto_client=boto_client, check_open=self._check_open)
        # Leases keep their keeper for life: it outlives a fork, and is given each process's state.
        self._keeper = Keeper(options, self._events, check_open=self._check_open, is_closed=lambda: self._closed)
        self._init_process_state()
        _fork_resets.add(weakref.WeakMethod(self._reset_in_child, _fork_resets.discard))

    def _init_process_state(self) -> None:
        """The collaborators of this process: a forked child builds its own (see _after_fork)."""
        self._pid = os.getpid()
        self.client_id = f"{socket.gethostname()}:{self._pid}:{uuid.uuid4().hex[:8]}"
        self._keylocks = KeyLocks()
        self.clock = self.clock.fresh_copy()  # a lock a parent thread held at fork stays held
        self._store = self._store.fresh_copy(self.clock)  # and a parent's boto3 client is not the child's
        self._stamper = Stamper(self.options, self.clock, self._store)  # a child reads the clock afresh
        self._keeper.start_process(self._store, self.clock, self._stamper, self._keylocks)
        self._waiting = WaitPolicy(self.options, self.clock)
        # Thread pools for asyncio callers (a parent's threads do not exist in a child).
        self._executors = Executors(f"dynlock-{self.options.alias}")
        self._undoer = Undoer(self.options, self._store, self.clock, self._keeper, is_closed=lambda: self._closed)
        parts: dict[str, Any] = {
            "store": self._store,
            "clock": self.clock,
            "stamper": self._stamper,
            "waiting": self._waiting,
            "keylocks": self._keylocks,
            "keeper": self._keeper,
            "undoer": self._undoer,
            "events": self._events,
            "executors": self._executors,
        }
        self._acquirer = Acquirer(self.options, client=self, client_id=self.client_id, **parts)
        self._group = GroupAcquirer(self.options, client=self, acquirer=self._acquirer, **parts)
        self._semaphores = SemaphoreAcquirer(
            self.options,
            acquirer=self._acquirer,
            store=self._store,
            waiting=self._waiting,
            keeper=self._keeper,
            events=self._events,
        )
        self._breaker = Breaker(self.options, self._store, self.clock, self._keeper, self._events)
        self._handovers = Handovers(
            self.options,
            client=self,
            store=self._store,
            clock=self.clock,
            stamper=self._stamper,
            keeper=self._keeper,
            keylocks=self._keylocks,
            busy_here=self._acquirer.busy_here,
        )

    def _after_fork(self) -> None:
        # A child shares none of its parent's leases: the parent keeps renewing them,
        # and the child must neither renew nor release them. Only the forking thread
        # exists in the child: a lock another thread held at fork stays held for ever,
        # so the child's copies get fresh ones before anything takes them.
        self._keeper.after_fork()
        self._init_process_state()

    def _reset_in_child(self) -> None:
        if not self._closed:
            self._after_fork()

    @property
    def _heartbeater(self) -> Heartbeater:
        """The keeper's heartbeat (tests stop it to play a process paused past its lease)."""
        return self._keeper.heartbeater

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"{self!r} is closed: get a new one with get_lock_client()")
        if os.getpid() != self._pid:
            self._after_fork()

    def _info(self, item: Mapping[str, Any] | None) -> LeaseInfo | None:
        return self._keeper.info(item)

    def _lease_seconds(self, lease: float | None) -> float:
        value = self.options.lease_duration if lease is None else lease
        return check_seconds("lease", value)  # type: ignore[return-value]

    def _wait_seconds(self, wait: float | None) -> float:
        value = self.options.wait_timeout if wait is None else wait
        return check_seconds("wait", value, allow_zero=True)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<LockClient alias={self.options.alias!r} table={self.options.table_name!r}>"

    @property
    def boto(self) -> Any:
        """The low-level boto3 DynamoDB client (thread-safe)."""
        return self._store.boto

    @property
    def has_transactions(self) -> bool | None:
        """Whether the server has TransactWriteItems (None until acquire_many() has asked; dynalite has not)."""
        return self._store.has_transactions

    def where(self) -> str:
        """The endpoint and the region of the table, for messages (never user:password):
        the region as boto3 resolved it, which may come from the host's environment."""
        try:
            region = self.boto.meta.region_name
        except DynLockError:
            region = self.options.region_name
        return describe_endpoint(self.options.endpoint_url, region)

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
        self._events.add(listener)

    def acquire(
        self,
        key: str,
        *,
        wait: float | None = None,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        limit: int = 1,
        metrics_name: str | None = None,
    ) -> Lease:
        """Acquire ``key``, waiting up to ``wait`` seconds; raise LockNotAcquired if busy.

        :param key: the lock key (the alias' ``KEY_PREFIX`` is added when stored).
        :param wait: seconds to wait for a busy key; None: the alias' ``WAIT_TIMEOUT``.
            A hard bound: the call returns within ``wait`` plus one request's timeout.
        :param lease: seconds the lease lasts without renewal; None: ``LEASE_DURATION``.
            The heartbeat renews it while it is held.
        :param holder: metadata stored with the lease (a dict of strings, at most 4 KB),
            shown by ``get()``, ``leases()``, ``showlocks`` and the admin.
        :param limit: how many may hold ``key`` at once (a semaphore, docs/semaphores.md;
            at most 99): the lease holds one of its slots, ``lease.slot``. 1, the
            default, is a lock.
        :param metrics_name: the ``name`` label of this acquisition's metrics and spans
            (``"export:{tenant_id}"``, say: the template the key was filled from). None:
            the key's prefix up to its first ``:``, or ``other``; never the key itself,
            so that one template makes one series (docs/observability.md).
        :raises LockNotAcquired: the key is still busy when ``wait`` runs out.
        :raises SemaphoreConflict: the table stores another limit for ``key``.
        :raises BackendError: DynamoDB could not be asked (``retryable`` says whether
            later may help).
        """
        return run(
            self._acquisition(key, wait, lease, holder, limit, single=False, metrics_name=metrics_name), self._keylocks
        )

    def _acquisition(
        self,
        key: str,
        wait: float | None,
        lease: float | None,
        holder: Mapping[str, Any] | None,
        limit: int,
        *,
        single: bool,
        metrics_name: str | None = None,
    ) -> Steps[Lease]:
        """The steps of one acquire of a lock (``limit`` 1) or a semaphore's slot, checked
        before any request."""
        self._check_open()
        stored = self.options.prefixed(key)
        rq.holder_map(holder)  # refused before any request if too large
        wait_seconds = 0.0 if single else self._wait_seconds(wait)
        lease_seconds = self._lease_seconds(lease)
        if self._semaphore_limit(key, stored, limit) == 1:
            return self._acquirer.acquisition(
                key, stored, wait_seconds, lease_seconds, holder, single=single, metrics_name=metrics_name
            )
        # Says what its slot 0 holds (the key's own item, which a lock holds too), for
        # showlocks and the admin to show the semaphore's holders together.
        holder = {**(holder or {}), SEMAPHORE_HOLDER_KEY: str(limit)}
        rq.holder_map(holder)
        return self._semaphores.acquisition(
            key, stored, limit, wait_seconds, lease_seconds, holder, single=single, metrics_name=metrics_name
        )

    @staticmethod
    def _semaphore_limit(key: str, stored: str, limit: object) -> int:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
        if limit > 1 and len(limit_key(stored).encode("utf-8")) > MAX_KEY_BYTES:
            raise InvalidKey(
                f"semaphore key {key[:40]!r}... leaves no room for its slots' suffixes within DynamoDB's "
                f"{MAX_KEY_BYTES} bytes: hash long keys (e.g. hashlib.sha256)"
            )
        return limit

    async def acquire_async(
        self,
        key: str,
        *,
        wait: float | None = None,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        limit: int = 1,
        metrics_name: str | None = None,
    ) -> Lease:
        """``acquire()`` for a coroutine: it waits with ``asyncio.sleep`` and holds no thread
        while it does; each request runs on this client's own bounded thread pool."""
        steps = self._acquisition(key, wait, lease, holder, limit, single=False, metrics_name=metrics_name)
        return await run_async(steps, self._executors, self._keylocks)

    async def run_for_holder(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)`` (a release, say) on the holders' thread pool, which
        waiters never fill: a release does not queue behind them. Finishes even if the
        caller is cancelled meanwhile."""
        loop = asyncio.get_running_loop()
        return await asyncio.shield(loop.run_in_executor(self._executors.holding, functools.partial(function, *args)))

    def try_acquire(
        self,
        key: str,
        *,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        limit: int = 1,
        metrics_name: str | None = None,
        **kwargs: Any,
    ) -> Lease | None:
        """Exactly one attempt: the Lease, or None when the key is busy.

        A crashed holder's lease whose expiry has passed is taken over. A client's very
        first attempt on a busy key may be followed at once by a second write, once the
        first reply has told it DynamoDB's clock. ``wait=`` is refused (InvalidArgument).
        With ``limit`` (a semaphore), one look at its slots and one write to a free one.
        """
        self._try_arguments(kwargs)
        try:
            return run(
                self._acquisition(key, None, lease, holder, limit, single=True, metrics_name=metrics_name),
                self._keylocks,
            )
        except LockNotAcquired:
            return None

    async def try_acquire_async(
        self,
        key: str,
        *,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        limit: int = 1,
        metrics_name: str | None = None,
        **kwargs: Any,
    ) -> Lease | None:
        """``try_acquire()`` for a coroutine."""
        self._try_arguments(kwargs)
        steps = self._acquisition(key, None, lease, holder, limit, single=True, metrics_name=metrics_name)
        try:
            return await run_async(steps, self._executors, self._keylocks)
        except LockNotAcquired:
            return None

    @staticmethod
    def _try_arguments(kwargs: Mapping[str, Any]) -> None:
        if "wait" in kwargs:
            raise InvalidArgument("try_acquire() makes exactly one attempt and takes no wait=; use acquire(wait=...)")
        if kwargs:
            raise InvalidArgument(f"try_acquire() got unexpected arguments: {', '.join(sorted(kwargs))}")

    def try_acquire_steps(
        self,
        key: str,
        *,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        metrics_name: str | None = None,
    ) -> Steps[Lease]:
        """:meth:`try_acquire`'s one attempt as steps (engine/steps.py), for a recipe
        whose own loop is steps too (an election's campaign): it returns the Lease, or
        raises LockNotAcquired (``holder``: what the refusal showed) when the key is busy.
        Drive it with :meth:`run_steps` or :meth:`run_steps_async`, or ``yield from`` it."""
        return self._acquisition(key, None, lease, holder, 1, single=True, metrics_name=metrics_name)

    def run_steps(self, steps: Steps[T]) -> T:
        """Drive ``steps`` on this thread, with this client's in-process gate (``steps.run``)."""
        return run(steps, self._keylocks)

    async def run_steps_async(self, steps: Steps[T]) -> T:
        """Drive ``steps`` from a coroutine, on this client's thread pools (``steps.run_async``)."""
        return await run_async(steps, self._executors, self._keylocks)

    def acquire_many(
        self,
        keys: Iterable[str],
        *,
        wait: float | None = None,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        metrics_name: str | None = None,
    ) -> LeaseGroup:
        """Acquire all ``keys`` or none: one TransactWriteItems (ordered fallback without transactions).

        At most 100 keys; ``wait``, ``lease`` and ``holder`` as for :meth:`acquire`. Raises
        LockNotAcquired (``key`` names a busy one) if they are not all free within ``wait``.
        """
        by_stored = self._many_keys("acquire_many", keys, holder)
        steps = self._group.acquisition(
            by_stored, self._wait_seconds(wait), self._lease_seconds(lease), holder, metrics_name=metrics_name
        )
        return run(steps, self._keylocks)

    async def acquire_many_async(
        self,
        keys: Iterable[str],
        *,
        wait: float | None = None,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        metrics_name: str | None = None,
    ) -> LeaseGroup:
        """``acquire_many()`` for a coroutine: it waits with ``asyncio.sleep`` and holds no
        thread while it does; each request runs on this client's own bounded thread pool."""
        by_stored = self._many_keys("acquire_many_async", keys, holder)
        steps = self._group.acquisition(
            by_stored, self._wait_seconds(wait), self._lease_seconds(lease), holder, metrics_name=metrics_name
        )
        return await run_async(steps, self._executors, self._keylocks)

    def _many_keys(self, method: str, keys: Iterable[str], holder: Mapping[str, Any] | None) -> dict[str, str]:
        """The checked keys of an acquire_many call, by their stored keys."""
        self._check_open()
        if isinstance(keys, str):
            raise InvalidArgument(f"{method}() takes a list of keys, not one string; use acquire(key)")
        by_stored = {self.options.prefixed(key): key for key in keys}
        rq.holder_map(holder)  # refused before any request if too large
        if not by_stored:
            raise InvalidArgument(f"{method}() needs at least one key")
        if len(by_stored) > MAX_KEYS_PER_TRANSACTION:
            raise InvalidArgument(f"{method}() takes at most {MAX_KEYS_PER_TRANSACTION} keys, got {len(by_stored)}")
        return by_stored

    def adopt(self, handover: Handover, *, lease: float | None = None) -> Lease:
        """Continue a lease another process handed over (``Lease.hand_over``): one write.

        From then on this client renews it and ``release()`` ends it, as if it had
        acquired it; its token is the one the giver got. Raises LockLost when the
        lease is no longer there to adopt (released, broken, taken over after its
        expiry, or adopted by another process first: a message delivered twice).
        """
        self._check_open()
        return self._handovers.adopt(handover, self._lease_seconds(lease))

    def release_handover(self, handover: Handover, *, even_if_adopted: bool = False) -> bool:
        """End a handed-over lease that nobody adopted (one write), e.g. for a task that
        will never run. True once that lease is released (by this call, or before by
        whoever held it under the handover); False if it ended otherwise (broken, or
        taken over after its expiry) or a process adopted it and holds it: a later
        holder's lease, and an adopter's, are never touched.

        ``even_if_adopted=True`` also ends an adopter's lease: only for an adopter known
        to be dead (its process was killed), which can neither renew nor release it.
        """
        self._check_open()
        return self._handovers.release_handover(handover, even_if_adopted=even_if_adopted)

    def election(
        self,
        name: str,
        *,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        poll: float = STANDBY_POLL,
    ) -> Election:
        """A contender in the leader election ``name`` (docs/election.md): ``campaign()``
        blocks until elected and returns the term, a :class:`Lease`.

        :param lease: the term's lease in seconds; None: ``LEASE_DURATION``. A dead
            leader is replaced within it plus 3 s.
        :param holder: metadata stored with each term, shown by ``leader()``,
            ``showlocks`` and the admin (``election`` is added: the election's name).
        :param poll: seconds between a standby's reads of the leader's key.
        """
        self._check_open()
        rq.holder_map(holder)  # refused before any request if too large
        if lease is not None:
            self._lease_seconds(lease)  # refused here, not at the first campaign
        return Election(self, name, lease=lease, holder=holder, poll=poll)

    def takeover_in(self, info: LeaseInfo) -> float | None:
        """Seconds until an acquire may take the lease ``info`` shows over by DynamoDB's
        clock (its earliest reading against the stored expiry): 0 or less once it may
        now, None when that cannot be told (no expiry stored, or DynamoDB's clock not
        yet known). No request: a standby reads the key, and writes only when this says."""
        return self._waiting.takeover_by_clock_in(info.raw, monotonic())

    def server_time(self) -> float:
        """DynamoDB's clock now (epoch seconds), as this client estimates it from its replies."""
        return self.clock.now()

    def server_datetime(self) -> dt.datetime:
        """:meth:`server_time` as an aware UTC datetime: the "now" to show lease times against."""
        return dt.datetime.fromtimestamp(self.clock.now(), tz=dt.UTC)

    def get(self, key: str, *, include_released: bool = False) -> LeaseInfo | None:
        """The live holder of ``key`` (one consistent read), or None if it is free.

        With ``include_released``, the item whatever its state (None only if there is
        none): who released or broke it last, and the token it is at.
        """
        self._check_open()
        info = self._info(self._store.get_item(self.options.prefixed(key)))
        return info if info is not None and (include_released or info.is_held) else None

    def holders(self, key: str) -> list[LeaseInfo]:
        """The holders of a semaphore's (or a lock's) slots that name one, by slot: two
        consistent reads (the stored limit, then the slots). A crashed holder is listed
        until its slot is taken over or broken, as by ``get()``."""
        self._check_open()
        return self._semaphores.holders(self.options.prefixed(key))[1]

    def semaphore_limit(self, key: str) -> int | None:
        """The limit stored for ``key`` (None: none is, ``key`` is a lock): one consistent read."""
        self._check_open()
        return stored_limit(self._store.get_item(limit_key(self.options.prefixed(key))))

    def set_limit(self, key: str, limit: int) -> int | None:
        """Change the limit stored for ``key`` (the operator's, ``manage.py setlocklimit KEY N``):
        one write; returns the old limit. Processes that ask for another then raise
        SemaphoreConflict; holders in slots past a lowered limit keep them until they
        release, so during a change as many as the larger of the two limits hold ``key``."""
        self._check_open()
        stored = self.options.prefixed(key)
        self._semaphore_limit(key, stored, limit)
        return self._semaphores.set_limit(stored, limit)

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
        params = rq.scan(self.options, prefix, include_released=include_released, start=start, limit=limit)
        reply = self._store.call("scan", "list locks", **params)
        # A semaphore's limit item is no lease: semaphore_limit() reads it.
        items = [i for i in reply.get("Items", []) if it.LIMIT not in i or it.FENCE in i]
        page = [info for info in map(self._info, items) if info is not None]
        return page, reply.get("LastEvaluatedKey")

    def break_lease(self, key: str, *, token: int | None = None, reason: str = "", by: str = "operator") -> bool:
        """Force-release ``key``: only if it still has ``token`` when one is given. True if broken.

        A semaphore's holder is broken by its token (``holders()`` lists them); without
        one, the key's own item (its slot 0) is.

        Raises BreakUnconfirmed when every reply was lost and a read cannot tell
        whether the break landed; ``confirm_break`` tells later.
        """
        self._check_open()
        if token is not None and (isinstance(token, bool) or not isinstance(token, int)):
            raise InvalidArgument(f"token must be an int fencing token, got {token!r}")
        broke = self._breaker.break_(key, token, reason, by)
        if broke or token is None:
            return broke
        # Not the key's own item's token: a semaphore's holder in another slot, if any.
        for info in self._semaphores.holders(self.options.prefixed(key))[1]:
            if info.token == token and info.slot:
                return self._breaker.break_(key, token, reason, by, stored=info.stored_key)
        return False

    def confirm_break(
        self, key: str, *, token: int | None, mark: str, reason: str = "", by: str = "operator"
    ) -> bool | None:
        """Whether the break that raised ``BreakUnconfirmed`` (its ``token`` and ``mark``)
        was applied: True (then it is logged and ``broken`` is sent, as by a break that
        got its reply), False, or None when that cannot be told any more (the lease
        ended since, by this break or otherwise). Raises BackendError while DynamoDB
        still cannot be read."""
        self._check_open()
        landed = self._breaker.landed(self.options.prefixed(key), token, mark)
        if landed:
            self._breaker.broken(key, token, reason, by, None)
        return landed

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
                self._store,
                wait=wait,
                billing_mode=billing_mode,
                read_capacity=read_capacity,
                write_capacity=write_capacity,
                timeout=timeout,
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._store.translate(exc, "create the lock table") from exc

    def describe_table(self) -> TableStatus:
        """The lock table's state (raises TableNotFound when missing)."""
        self._check_open()
        try:
            return describe_table(self._store)
        except (ClientError, BotoCoreError) as exc:
            raise self._store.translate(exc, "describe the lock table") from exc

    @property
    def held(self) -> list[Lease]:
        """Leases this client holds in this process."""
        return list(self._keeper.held)

    def close(self, *, release: bool = False) -> None:
        """Stop renewing (and optionally release) every lease; returns promptly."""
        if self._closed:
            return
        if release and os.getpid() == self._pid:
            for lease in list(self._keeper.held):
                try:
                    self._keeper.release(lease)
                except DynLockError as exc:
                    logger.info("while closing, releasing %r failed: %s", lease, exc)
        self._closed = True
        self._keeper.heartbeater.stop()
        self._executors.shutdown()
        self._store.close()
        # Leases we keep are no longer renewed: their holders must not trust them.
        for lease in list(self._keeper.held):
            self._keeper.lose(lease, "closed", "the lock client was closed")

    @property
    def closed(self) -> bool:
        return self._closed


def _after_fork_in_child() -> None:
    for ref in list(_fork_resets):
        reset = ref()
        if reset is not None:
            reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
