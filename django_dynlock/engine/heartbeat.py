"""One background thread per lock client that renews every lease it holds.

Leases are kept in a heap by due time, each renewed about once per heartbeat
period with jitter, so a thousand leases acquired together do not renew together.
The thread is a daemon, started on first use, and restarted lazily after fork.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lease import Lease

logger = logging.getLogger("django_dynlock")

IDLE_EXIT = 5.0  # seconds with no lease before the thread ends

# Every heartbeat thread's name starts with this (then the alias): the Django layer
# recognises the thread by it, to close the database connections its receivers opened.
THREAD_NAME_PREFIX = "dynlock-heartbeat-"


class Heartbeater:
    def __init__(self, renew: Callable[[Lease], float | None], name: str):
        # `renew` sends one heartbeat and returns the delay until the next, or None
        # when the lease needs no more (released or lost).
        self._renew = renew
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Lease]] = []
        self._seq = itertools.count()
        self._stopping = False
        self._dead = 0
        self._thread: threading.Thread | None = None
        self._alarms = Alarms(name + "-alarms")  # our prefix: see THREAD_NAME_PREFIX

    def add(self, lease: Lease, period: float) -> None:
        self.schedule(lease, time.monotonic() + period * random.uniform(0.8, 1.0))

    def schedule(self, lease: Lease, due: float) -> None:
        with self._cond:
            if self._stopping:
                return
            lease.upkeep.heartbeat_due = due  # an earlier entry of the same lease is now stale
            heapq.heappush(self._heap, (due, next(self._seq), lease))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is lease:
                self._cond.notify()  # only an earlier due time changes what the thread waits for

    def alarm(self, due: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` at monotonic ``due``, on the client's alarm thread: this
        thread may be waiting on a request then (Holding._lose_on_time)."""
        self._alarms.add(due, callback)

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
        self._alarms.stop()
        with self._cond:
            self._stopping = True
            self._heap.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _next(self) -> Lease | None:
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    due, _, lease = heapq.heappop(self._heap)
                    if due == lease.upkeep.heartbeat_due:
                        return lease
                    continue
                if not self._heap:
                    # Idle: let the thread end (schedule() starts a new one), so clients
                    # that hold nothing, or were dropped, keep no thread alive.
                    if not self._cond.wait(IDLE_EXIT) and not self._heap:
                        self._thread = None
                        return None
                    continue
                self._cond.wait(self._heap[0][0] - now)
            return None

    def _run(self) -> None:
        while (lease := self._next()) is not None:
            try:
                delay = self._renew(lease)
            except Exception:  # never let one bad renewal kill the renewals of the others
                logger.exception("heartbeat of %r failed unexpectedly", lease)
                delay = 0.5
            if delay is not None:
                self.schedule(lease, time.monotonic() + delay)


class Alarms:
    """Callbacks at given monotonic times, on one thread per client that ends when idle.

    Beside the heartbeat thread, which may be blocked in a request when an alarm is due.
    Callbacks must not block: they run one after another.
    """

    def __init__(self, name: str):
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def add(self, due: float, callback: Callable[[], None]) -> None:
        with self._cond:
            if self._stopping:
                return
            heapq.heappush(self._heap, (due, next(self._seq), callback))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._heap.clear()
            self._cond.notify()

    def _next(self) -> Callable[[], None] | None:
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    return heapq.heappop(self._heap)[2]
                if not self._heap:
                    if not self._cond.wait(IDLE_EXIT) and not self._heap:
                        self._thread = None
                        return None
                    continue
                self._cond.wait(self._heap[0][0] - now)
            return None

    def _run(self) -> None:
        while (callback := self._next()) is not None:
            try:
                callback()
            except Exception:
                logger.exception("dynlock alarm %r failed", callback)
