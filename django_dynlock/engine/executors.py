"""The client's own thread pools for asyncio callers.

An async acquire waits with ``asyncio.sleep`` and hops to a thread only for each
request (steps.py). Those hops run here, never on the event loop's default executor:
that one has min(32, cores + 4) threads, which the application's own ``to_thread``
work shares, and a few dozen waiters holding them stalled everything (issue 28).
Holders' work (a release) has a pool of its own, so that a release never queues
behind waiters' requests: the key frees as soon as its holder is done.
"""

from __future__ import annotations

import concurrent.futures
import threading

# A waiter's request takes a round trip (milliseconds) and its sleeps hold no thread:
# a few threads carry many waiters. Waiters of one key in one process poll as one.
WAITING_THREADS = 8
HOLDING_THREADS = 4


class Executors:
    """Two bounded pools, built on first use; ``shutdown`` when the client closes (or forks)."""

    def __init__(self, name: str, *, waiting_threads: int = WAITING_THREADS, holding_threads: int = HOLDING_THREADS):
        self._name = name
        self._sizes = {"waiting": waiting_threads, "holding": holding_threads}
        self._pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    @property
    def waiting(self) -> concurrent.futures.ThreadPoolExecutor:
        """Where waiters' requests run."""
        return self._pool("waiting")

    @property
    def holding(self) -> concurrent.futures.ThreadPoolExecutor:
        """Where holders' releases (and an abandoned attempt's undo) run."""
        return self._pool("holding")

    def _pool(self, role: str) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            pool = self._pools.get(role)
            if pool is None:
                pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._sizes[role], thread_name_prefix=f"{self._name}-{role}"
                )
                self._pools[role] = pool
            return pool

    def shutdown(self) -> None:
        """Stop taking work; requests already running finish in their threads."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False)
