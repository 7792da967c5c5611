"""One background thread per lock client that renews every lease it holds, one for alarms,
and one for retries.

Leases are kept in a heap by due time, each renewed about once per heartbeat
period with jitter, so a thousand leases acquired together do not renew together.
Alarms (what must happen on time while the renewing thread waits for a reply) have
a heap and a thread of their own, and so do retries (an undo that could not reach
DynamoDB, tried again until it does). Each thread is a daemon, started on first use,
ended when idle, and restarted lazily after fork.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from .clock import monotonic

if TYPE_CHECKING:
    from .lease import Lease

logger = logging.getLogger("django_dynlock")

IDLE_EXIT = 5.0  # seconds with nothing due before a thread ends

# Every heartbeat thread's name starts with this (then the alias): the Django layer
# recognises the thread by it, to close the database connections its receivers opened.
THREAD_NAME_PREFIX = "dynlock-heartbeat-"


T = TypeVar("T")


class _Timeline(Generic[T]):
    """Items due at monotonic times, served in order by one daemon thread."""

    def __init__(self, name: str):
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def _push(self, due: float, item: T) -> None:
        """Add an entry; the caller holds ``self._cond`` and has checked ``_stopping``."""
        heapq.heappush(self._heap, (due, next(self._seq), item))
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        elif self._heap[0][2] is item:
            self._cond.notify()  # only an earlier due time changes what the thread waits for

    def stop(self, timeout: float = 0.5) -> None:
        """Stop promptly: wait at most `timeout` for the item being served."""
        with self._cond:
            self._stopping = True
            self._heap.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _current(self, due: float, item: T) -> bool:
        """Whether a due entry still stands (an item rescheduled since has a later one)."""
        return True

    def _next(self) -> T | None:
        with self._cond:
            while not self._stopping:
                now = monotonic()
                if self._heap and self._heap[0][0] <= now:
                    due, _, item = heapq.heappop(self._heap)
                    if self._current(due, item):
                        return item
                    continue
                if not self._heap:
                    # Idle: let the thread end (_push starts a new one), so clients that
                    # hold nothing, or were dropped, keep no thread alive.
                    if not self._cond.wait(IDLE_EXIT) and not self._heap:
                        self._thread = None
                        return None
                    continue
                self._cond.wait(self._heap[0][0] - now)
            return None

    def _run(self) -> None:
        while (item := self._next()) is not None:
            self._serve(item)

    def _serve(self, item: T) -> None:
        raise NotImplementedError


class Heartbeater(_Timeline["Lease"]):
    def __init__(self, renew: Callable[[Lease], float | None], name: str):
        # `renew` sends one heartbeat and returns the delay until the next, or None
        # when the lease needs no more (released or lost).
        super().__init__(name)
        self._renew = renew
        self._dead = 0
        self._alarms = Alarms(name + "-alarms")  # our prefix: see THREAD_NAME_PREFIX
        self._retries = Retries(name + "-retries")

    def add(self, lease: Lease, period: float) -> None:
        self.schedule(lease, monotonic() + period * random.uniform(0.8, 1.0))

    def schedule(self, lease: Lease, due: float) -> None:
        with self._cond:
            if self._stopping:
                return
            lease.upkeep.heartbeat_due = due  # an earlier entry of the same lease is now stale
            self._push(due, lease)

    def alarm(self, due: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` at monotonic ``due``, on the client's alarm thread: this
        thread may be waiting on a request then (Keeper._lose_on_time)."""
        self._alarms.add(due, callback)

    def retry(self, due: float, task: Callable[[], float | None]) -> None:
        """Call ``task`` at monotonic ``due`` on the client's retry thread, and again after
        the delay it returns, until it returns None."""
        self._retries.add(due, task)

    def discard(self, lease: Lease) -> None:
        """Note that a lease needs no more renewals (released or lost).

        Its heap entry is dropped lazily when due; when dead entries pile up (many
        short leases under a long heartbeat period) the heap is rebuilt without them.
        """
        with self._cond:
            self._dead += 1
            if self._dead > max(64, len(self._heap) // 2):
                self._heap = [entry for entry in self._heap if entry[2].needs_heartbeat]
                heapq.heapify(self._heap)
                self._dead = 0

    def stop(self, timeout: float = 0.5) -> None:
        """Stop promptly: wait at most `timeout` for a renewal that is in flight."""
        self._alarms.stop(0.0)
        self._retries.stop(0.0)
        super().stop(timeout)

    def _current(self, due: float, item: Lease) -> bool:
        return due == item.upkeep.heartbeat_due

    def _serve(self, item: Lease) -> None:
        try:
            delay = self._renew(item)
        except Exception:  # never let one bad renewal kill the renewals of the others
            logger.exception("heartbeat of %r failed unexpectedly", item)
            delay = 0.5
        if delay is not None:
            self.schedule(item, monotonic() + delay)


class Alarms(_Timeline[Callable[[], None]]):
    """Callbacks at monotonic times, beside the heartbeat thread, which may be blocked
    in a request when one is due. Callbacks must not block: they run one after another."""

    def add(self, due: float, callback: Callable[[], None]) -> None:
        with self._cond:
            if not self._stopping:
                self._push(due, callback)

    def _serve(self, item: Callable[[], None]) -> None:
        try:
            item()
        except Exception:
            logger.exception("dynlock alarm %r failed", item)


class Retries(_Timeline[Callable[[], "float | None"]]):
    """Tasks tried again until they are done (Undoer._undo_later). Not on the heartbeat
    thread: a try that hangs until its request times out, in an outage, must not hold up
    the renewals of the leases held."""

    def add(self, due: float, task: Callable[[], float | None]) -> None:
        with self._cond:
            if not self._stopping:
                self._push(due, task)

    def _serve(self, item: Callable[[], float | None]) -> None:
        try:
            delay = item()
        except Exception:
            logger.exception("dynlock retry %r failed", item)
            return
        if delay is not None:
            self.add(monotonic() + delay, item)
