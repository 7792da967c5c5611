"""Leader election and hot standby: one leader among many processes, on one lease.

The leader holds an ordinary lease on the key ``election:{name}``: renewed by the
heartbeat, taken over by DynamoDB's clock once its holder is dead, and with a token
that grows with every term. Nothing in the protocol is new. What is new is how a
standby waits: a leader holds for days, and the acquire loop's pause follows the
hold's age, so a standby keeps a cadence of its own (see :class:`Election`).

Built on the lock client's public API only (``try_acquire_steps``, ``run_steps``,
``run_steps_async``, ``get``, ``takeover_in``, ``add_listener``), typed by
:class:`ElectionClient`, so that this module imports nothing of the client's. A
campaign is one generator of steps (engine/steps.py), as an acquisition is: its write
is ``try_acquire``'s own steps, and the two drivers run the whole.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

from ..exceptions import DynLockError, InvalidArgument, LockLost, LockNotAcquired
from .clock import monotonic
from .items import LeaseInfo
from .lease import Lease, LeaseState
from .options import check_seconds
from .steps import Send, Sleep, Steps

logger = logging.getLogger("django_dynlock")

__all__ = ["ELECTION_HOLDER_KEY", "KEY_PREFIX", "STANDBY_POLL", "Election", "ElectionClient", "Observation"]

T = TypeVar("T")

#: A standby looks at the leader's key this often (seconds, on average): one
#: consistent read, the cheapest request, so 0.5 requests a second.
STANDBY_POLL = 2.0
# Each pause is poll times 1 ± this: standbys started together drift apart, the mean
# stays poll (the rate bound), and the longest pause, poll + 5 %, keeps a resigned
# leader's successor within 2.5 s (the pause, a read and a write).
STANDBY_JITTER = 0.05
#: The lease of election ``name`` is stored under this prefix, apart from plain locks.
KEY_PREFIX = "election:"
#: The holder metadata that names a term's election: the admin, ``showlocks`` and the
#: Django signals tell an election's terms from plain leases by it.
ELECTION_HOLDER_KEY = "election"


class ElectionClient(Protocol):
    """What an :class:`Election` needs of its lock client (a ``LockClient``)."""

    def try_acquire_steps(
        self, key: str, *, lease: float | None = None, holder: Mapping[str, Any] | None = None
    ) -> Steps[Lease]: ...

    def run_steps(self, steps: Steps[T]) -> T: ...

    async def run_steps_async(self, steps: Steps[T]) -> T: ...

    def get(self, key: str, *, include_released: bool = False) -> LeaseInfo | None: ...

    def takeover_in(self, info: LeaseInfo) -> float | None: ...

    def add_listener(self, listener: Callable[..., None]) -> None: ...


def check_wait(wait: float | None) -> None:
    """Refuse a wait that is not None or a number of seconds, 0 or more, before any request."""
    if wait is not None:
        check_seconds("wait", wait, allow_zero=True)


def jittered(poll: float) -> float:
    return poll * random.uniform(1.0 - STANDBY_JITTER, 1.0 + STANDBY_JITTER)


def election_of(lease: Lease) -> str | None:
    """The name of the election whose term ``lease`` is, or None for a plain lease."""
    name = lease.holder.get(ELECTION_HOLDER_KEY)
    return name if name is not None and lease.key == KEY_PREFIX + name else None


# Terms handed out in this process, to tell their elections of a loss (each term maps to
# its election's handler). One engine listener per client dispatches to them: an
# Election per request must not add one each.
_terms: weakref.WeakKeyDictionary[Lease, Callable[[Lease, str], None]] = weakref.WeakKeyDictionary()
_listening: weakref.WeakSet[Any] = weakref.WeakSet()
_registry_lock = threading.Lock()


def _dispatch(event: str, *, lease: Lease | None = None, **info: Any) -> None:
    if event != "lost" or lease is None:
        return
    term_lost = _terms.get(lease)
    if term_lost is not None:
        term_lost(lease, str(info.get("reason", "expired")))


class Election:
    """One contender in the election ``name``: ``client.election(name)``.

    :meth:`campaign` blocks until elected and returns the term, a :class:`Lease`:
    ``term.token`` (greater than every earlier term's), ``term.is_held`` and
    ``term.raise_if_lost()`` (local checks, no request), ``term.release()`` to resign,
    ``with term:`` to resign on exit. The heartbeat renews it while the process lives.

    A standby's cadence, instead of the acquire loop's: one consistent read of the key
    every ``poll`` seconds (``STANDBY_POLL``, 2 s), and a write (``try_acquire``) only
    when a read shows the key free, or the leader's stored expiry less than ``poll``
    ahead by DynamoDB's clock: then it sleeps until that expiry and writes once, which
    the engine applies only if the expiry has passed by DynamoDB's clock. A live
    leader renews every third of its lease, so with a lease over ``1.5 * poll`` its
    expiry is never that close, and its standbys only read: 0.5 requests a second.

    One contender per object: campaign from one thread (or task) at a time.
    """

    def __init__(
        self,
        client: ElectionClient,
        name: str,
        *,
        lease: float | None = None,
        holder: Mapping[str, Any] | None = None,
        poll: float = STANDBY_POLL,
    ):
        if not name or not isinstance(name, str):
            raise InvalidArgument(f"an election needs a name (a non-empty string), got {name!r}")
        check_seconds("poll", poll)
        self.client = client
        #: The election's name, as given.
        self.name = name
        #: The lock key its leader holds.
        self.key = KEY_PREFIX + name
        self.lease = lease
        self.poll = poll
        self.holder = {**(holder or {}), ELECTION_HOLDER_KEY: name}
        self._term: Lease | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._on_elected: list[Callable[[Lease], None]] = []
        self._on_lost: list[Callable[[Lease, str], None]] = []
        self._reported: weakref.WeakSet[Lease] = weakref.WeakSet()  # terms whose loss was told
        # The standby's state between calls, so that repeated campaign(wait=0) calls (a
        # scheduler's tick) keep the cadence too: when the next look is due, and
        # whether it writes.
        self._next_look = 0.0
        self._write_next = True
        with _registry_lock:
            if client not in _listening:
                client.add_listener(_dispatch)
                _listening.add(client)

    def __repr__(self) -> str:
        return f"<Election {self.name!r} term={self._term!r}>"

    # -- callbacks -------------------------------------------------------------------------
    def on_elected(self, callback: Callable[[Lease], None]) -> Callable[[Lease], None]:
        """Call ``callback(term)`` each time this contender is elected, before
        :meth:`campaign` returns (usable as a decorator)."""
        self._on_elected.append(callback)
        return callback

    def on_lost(self, callback: Callable[[Lease, str], None]) -> Callable[[Lease, str], None]:
        """Call ``callback(term, reason)`` when a term ends before its resignation
        (usable as a decorator).

        ``reason`` as for ``LockLost``: ``"expired"`` (the local validity ran out: no
        renewal got through, or the process was paused), ``"taken"``, ``"broken"``,
        ``"closed"``, ``"fork"``. Sent from the engine's ``lost`` event, often on the
        heartbeat thread: keep it short. It comes at the term's local validity end at
        the latest, before any other contender may be elected (docs/protocol.md),
        except in a process that was paused then: that one learns it on waking, and its
        ``term.is_held`` is already False when it does.
        """
        self._on_lost.append(callback)
        return callback

    def _term_lost(self, lease: Lease, reason: str) -> None:
        with self._lock:
            if lease in self._reported:
                return
            self._reported.add(lease)
        logger.warning("leadership of %r lost (term %s): %s", self.name, lease.token, reason)
        for callback in list(self._on_lost):
            try:
                callback(lease, reason)
            except Exception:
                logger.exception("election %r: on_lost callback %r failed", self.name, callback)

    def _elected(self, lease: Lease) -> Lease:
        with _registry_lock:
            _terms[lease] = self._term_lost
        with self._lock:
            self._term = lease
        self._write_next = True  # after this term, the first look writes
        logger.info("elected leader of %r (term %s)", self.name, lease.token)
        for callback in list(self._on_elected):
            try:
                callback(lease)
            except Exception:
                logger.exception("election %r: on_elected callback %r failed", self.name, callback)
        if not lease.is_held:  # a loss raced with the callbacks: it was sent before we knew the term
            self._term_lost(lease, lease.lost_reason or "expired")
        return lease

    # -- the term --------------------------------------------------------------------------
    @property
    def term(self) -> Lease | None:
        """This contender's last term (held or not), or None before its first election.

        What :meth:`run`'s function checks: ``election.term.raise_if_lost()``.
        """
        return self._term

    @property
    def is_leader(self) -> bool:
        """Whether this contender holds a term now (a local check: it sends nothing)."""
        term = self._term
        return term is not None and term.is_held

    def resign(self) -> None:
        """End the current term (one write), if it was not ended already.

        A term that ran out locally (``expired``) is released too: if the table still
        names it, the others need not wait for its expiry. One taken over or broken
        sends nothing.
        """
        term = self._term
        if term is not None and term.state is not LeaseState.RELEASED:
            try:
                term.release()
            except LockLost:
                pass  # it had ended: nothing left to resign

    def cancel(self) -> None:
        """Stop this contender, from any thread: a :meth:`campaign` in progress raises
        ``LockNotAcquired``, :meth:`run` returns None once its function does, and the
        term, if held, is resigned. A later :meth:`campaign` starts afresh."""
        self._stop.set()
        self.resign()

    # -- campaigning -----------------------------------------------------------------------
    def campaign(self, wait: float | None = None) -> Lease:
        """Block until elected; return the term (a :class:`Lease`).

        :param wait: seconds to campaign; None: no limit. ``0`` makes at most the look
            the standby cadence allows now (none if the last look was under ``poll``
            ago and saw a live leader): a scheduler may call it on every tick.
        :raises LockNotAcquired: ``wait`` ran out (``holder`` is the leader last seen),
            or :meth:`cancel` was called.
        :raises BackendError: DynamoDB refused for good (a missing table, access
            denied); failures that may pass (an outage, throttling) are retried at the
            standby's cadence.

        Already leader: the current term.
        """
        check_wait(wait)
        self._stop.clear()
        return self.client.run_steps(self._campaign_steps(wait))

    async def campaign_async(self, wait: float | None = None) -> Lease:
        """:meth:`campaign` for a coroutine: the same steps, driven with ``asyncio.sleep``
        (it holds no thread while it waits; a :meth:`cancel` from another thread is seen
        within a second) and each request on the client's thread pool for its time."""
        check_wait(wait)
        self._stop.clear()
        return await self.client.run_steps_async(self._campaign_steps(wait))

    def _campaign_steps(self, wait: float | None) -> Steps[Lease]:
        """The campaign as steps (engine/steps.py): :meth:`campaign` drives them on its
        thread, :meth:`campaign_async` from a coroutine, :meth:`run` again after each
        loss, so that the three share one cadence and one set of decisions."""
        started = monotonic()
        give_up = None if wait is None else started + wait
        term = self._term
        if term is not None and term.is_held:
            return term
        seen: LeaseInfo | None = None
        while True:
            now = monotonic()
            if self._stop.is_set() or (give_up is not None and now >= give_up and now < self._next_look):
                raise LockNotAcquired(
                    self.key, holder=seen, retry_after=max(0.0, self._next_look - now), waited=now - started
                )
            if now >= self._next_look:
                # One request at the standby's cadence: a write if the last look asked
                # for one, else a read.
                try:
                    if self._write_next:
                        try:
                            lease = yield from self.client.try_acquire_steps(
                                self.key, lease=self.lease, holder=self.holder
                            )
                        except LockNotAcquired as busy:
                            seen = busy.holder or seen
                            self._after_write(busy.holder)
                        else:
                            return self._elected(lease)
                    else:
                        seen = yield Send(functools.partial(self.client.get, self.key))
                        self._after_read(seen)
                except DynLockError as error:
                    self._after_error(error)
                continue
            pause = self._next_look - now if give_up is None else min(self._next_look, give_up) - now
            yield Sleep(pause, wake=self._stop)  # cancel() wakes it

    def _pause(self) -> float:
        return jittered(self.poll)

    def _after_write(self, holder: LeaseInfo | None) -> None:
        # Refused: a live leader, or a rival standby was quicker. Back to reading.
        self._write_next = False
        self._next_look = monotonic() + self._pause()

    def _after_read(self, info: LeaseInfo | None) -> None:
        now = monotonic()
        if info is None:
            self._write_next, self._next_look = True, now  # free: take it at once
            return
        due = self.client.takeover_in(info)
        if due is None:
            # No expiry to judge by (a server whose replies carry no Date): only a
            # write's watch of the holder's record version can take it over.
            self._write_next, self._next_look = True, now + self._pause()
        elif due < self.poll:
            # The leader's expiry comes before our next read would: be there when it does.
            self._write_next, self._next_look = True, now + max(0.0, due)
        else:
            self._write_next, self._next_look = False, now + self._pause()

    def _after_error(self, error: DynLockError) -> None:
        if not getattr(error, "retryable", False):
            raise error
        logger.warning("election %r: a standby's look failed, trying again in %.0fs: %s", self.name, self.poll, error)
        self._next_look = monotonic() + self._pause()

    # -- who leads -------------------------------------------------------------------------
    def leader(self) -> LeaseInfo | None:
        """The live leader's :class:`LeaseInfo` (one consistent read), or None.

        None too for a leader that died and whose lease has run out by DynamoDB's
        clock, before anyone took over. ``info.token`` is its term, ``info.holder`` the
        metadata it campaigned with.
        """
        info = self.client.get(self.key)
        if info is None:
            return None
        due = self.client.takeover_in(info)
        return None if due is not None and due <= 0 else info

    def observe(self, *, poll: float | None = None) -> Observation:
        """An iterator, and an async iterator, over the leaders of this election.

        The first item is the leader now; then one item per change: the new leader's
        :class:`LeaseInfo` (a new term, so a new token), or None once there is no live
        leader. One consistent read per ``poll`` seconds (this election's, 2 s by
        default), whatever the number of items: a change is seen within ``poll``. It
        never ends by itself: ``break``, or :meth:`Observation.close` from another thread.
        """
        return Observation(self, self.poll if poll is None else poll)

    # -- running while leader ------------------------------------------------------------
    def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """Campaign, call ``func(*args, **kwargs)`` while leader, and campaign again after a loss.

        ``func`` learns of a loss from the term: ``election.term.raise_if_lost()``
        before each side effect (it raises ``LockLost``), or ``election.term.is_held``
        in its loop; :meth:`on_lost` callbacks run as well. Then:

        - ``func`` raises ``LockLost``, or returns or raises after its term was lost:
          campaign again, and call ``func`` again once elected (the RedBeat #306 failure
          was a process that stayed up and never led again);
        - ``func`` returns while leader: resign, and return its result;
        - ``func`` raises anything else while leader: resign, and let it propagate;
        - :meth:`cancel`: return None once ``func`` has returned.
        """
        self._stop.clear()
        while True:
            try:
                # Not campaign(), which clears the stop: a cancel() meanwhile must stand.
                term = self.client.run_steps(self._campaign_steps(None))
            except LockNotAcquired:
                if self._stop.is_set():
                    return None
                raise
            try:
                result = func(*args, **kwargs)
            except LockLost:
                if self._stop.is_set():
                    return None
                logger.warning(
                    "election %r: term %s lost while running %r; campaigning again", self.name, term.token, func
                )
                continue
            except BaseException:
                if term.state is LeaseState.LOST and not self._stop.is_set():
                    logger.exception(
                        "election %r: %r failed after its term was lost; campaigning again", self.name, func
                    )
                    continue
                self.resign()
                raise
            if self._stop.is_set():
                self.resign()
                return None
            if term.state is LeaseState.LOST:
                logger.warning("election %r: %r returned after its term was lost; campaigning again", self.name, func)
                continue
            self.resign()
            return result


class Observation:
    """What :meth:`Election.observe` returns: iterate it with ``for`` or ``async for``."""

    def __init__(self, election: Election, poll: float):
        check_seconds("poll", poll)
        self.election = election
        self.poll = poll
        self._started = False
        self._last: tuple[int | None, str | None] | None = None
        self._next_read = 0.0
        self._closed = threading.Event()

    def close(self) -> None:
        """End the iteration (from any thread): the next item is never given."""
        self._closed.set()

    def _changed(self, info: LeaseInfo | None) -> bool:
        current = None if info is None else (info.token, info.owner)
        first, self._started = not self._started, True
        if first or current != self._last:
            self._last = current
            return True
        return False

    def _read_done(self) -> None:
        self._next_read = monotonic() + jittered(self.poll)

    def __iter__(self) -> Iterator[LeaseInfo | None]:
        return self

    def __next__(self) -> LeaseInfo | None:
        while True:
            pause = self._next_read - monotonic()
            if pause > 0 and self._closed.wait(pause):
                raise StopIteration
            if self._closed.is_set():
                raise StopIteration
            info = self.election.leader()
            self._read_done()
            if self._changed(info):
                return info

    def __aiter__(self) -> AsyncIterator[LeaseInfo | None]:
        return self

    async def __anext__(self) -> LeaseInfo | None:
        loop = asyncio.get_running_loop()
        while True:
            while (pause := self._next_read - monotonic()) > 0 and not self._closed.is_set():
                await asyncio.sleep(min(pause, 1.0))
            if self._closed.is_set():
                raise StopAsyncIteration
            info = await loop.run_in_executor(None, self.election.leader)
            self._read_done()
            if self._changed(info):
                return info
