"""In-process key locks: one threading lock per key a client is acquiring or holding.

A thread takes the key's lock here before it goes to DynamoDB and keeps it for as
long as it holds the lease. So threads of one process waiting for the same key do not each
poll DynamoDB, and a release in this process hands over to a local waiter at once. A
coroutine waits for a key with ``enter_async``, which holds no thread while it waits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from .clock import monotonic


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class KeyLocks:
    """Per-key locks of one client in one process (see above); ``enter`` with a timeout, ``leave`` when done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[str, list[Any]] = {}  # key -> [threading.Lock, users]
        self._watchers: dict[str, set[Callable[[], None]]] = {}  # key -> called when it is left

    def enter(self, key: str, timeout: float) -> bool:
        with self._lock:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        lock: threading.Lock = entry[0]
        entered = lock.acquire(timeout=timeout) if timeout > 0 else lock.acquire(blocking=False)
        if not entered:
            self._unref(key)
        return entered

    async def enter_async(self, key: str, until: float) -> bool:
        """``enter`` for a coroutine, until monotonic ``until``: it is not waited on with a
        blocked thread per coroutine (what the async path exists to avoid); a coroutine
        that finds the key taken sleeps until it is left, or ``until`` has passed."""
        loop = asyncio.get_running_loop()
        while not self.enter(key, 0):
            now = monotonic()
            if now >= until:
                return False
            left: asyncio.Future[None] = loop.create_future()

            def on_leave(left: asyncio.Future[None] = left) -> None:
                try:
                    loop.call_soon_threadsafe(_settle, left)
                except RuntimeError:  # the loop has closed: nobody waits any more
                    pass

            unwatch = self.watch(key, on_leave)
            try:
                if self.enter(key, 0):  # left between our look and the watch
                    return True
                await asyncio.wait([left], timeout=until - now)
            finally:
                unwatch()
        return True

    def leave(self, key: str) -> None:
        with self._lock:
            entry = self._locks.get(key)
        if entry is not None and entry[0].locked():
            entry[0].release()
            self._unref(key)
        with self._lock:
            watchers = list(self._watchers.get(key, ()))
        for watcher in watchers:
            watcher()

    def watch(self, key: str, watcher: Callable[[], None]) -> Callable[[], None]:
        """Call ``watcher`` (on the leaving thread) whenever ``key`` is left, until the
        returned function is called: an async waiter's wake-up, so that it need not block
        a thread in ``enter`` nor poll."""
        with self._lock:
            self._watchers.setdefault(key, set()).add(watcher)

        def unwatch() -> None:
            with self._lock:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(watcher)
                    if not watchers:
                        del self._watchers[key]

        return unwatch

    def _unref(self, key: str) -> None:
        with self._lock:
            entry = self._locks.get(key)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del self._locks[key]
