"""In-process gates: one local lock per key a client is acquiring or holding.

A thread takes the key's gate before it goes to DynamoDB and keeps it for as long as
it holds the lease. So threads of one process waiting for the same key do not each
poll DynamoDB, and a release in this process hands over to a local waiter at once.
"""

from __future__ import annotations

import threading


class Gates:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[str, list] = {}  # key -> [threading.Lock, users]

    def enter(self, key: str, timeout: float) -> bool:
        with self._lock:
            gate = self._gates.setdefault(key, [threading.Lock(), 0])
            gate[1] += 1
        entered = gate[0].acquire(timeout=timeout) if timeout > 0 else gate[0].acquire(blocking=False)
        if not entered:
            self._unref(key)
        return entered

    def leave(self, key: str) -> None:
        with self._lock:
            gate = self._gates.get(key)
        if gate is not None and gate[0].locked():
            gate[0].release()
            self._unref(key)

    def _unref(self, key: str) -> None:
        with self._lock:
            gate = self._gates.get(key)
            if gate is not None:
                gate[1] -= 1
                if gate[1] <= 0:
                    del self._gates[key]
