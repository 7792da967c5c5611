"""The measures both exporters take, from the engine's events (engine/observe.py).

Which event makes which measure is decided once, here: ``contrib.prometheus`` and
``contrib.opentelemetry`` only say how each measure is recorded. Imports neither library.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from typing import Any

from ..engine.observe import Observer

__all__ = [
    "ACQUIRE_BUCKETS",
    "HEADROOM_BUCKETS",
    "HOLD_BUCKETS",
    "MEASURED_EVENTS",
    "REQUEST_BUCKETS",
    "MeasuringObserver",
]

# Seconds. A waiter's wait runs from a few milliseconds (free) to WAIT_TIMEOUT; a hold
# from a request's span to a nightly job's hours; a request to DynamoDB is milliseconds.
ACQUIRE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0)
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# What was left of a lease's validity when its renewal landed: with the default 30 s lease,
# its 3 s safety margin and renewals every 8.5-10 s, 17-18.5 s. Near 0 a renewal was almost
# too late: fine below 2 s, where an alert looks (docs/observability.md), short leases too.
HEADROOM_BUCKETS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)


#: The events ``MeasuringObserver.event`` makes measures of; it ignores the others.
MEASURED_EVENTS = frozenset({"acquired", "busy", "released", "lost", "at_risk", "acquire_failed"})


class MeasuringObserver(Observer):
    """Events into measures; a subclass records each measure (``acquire_time``, ...)."""

    def __init__(self) -> None:
        # The leases this process counts as held (the gauge): a lease released and then
        # reported lost by its background release is counted down once.
        self._held: weakref.WeakSet[Any] = weakref.WeakSet()
        self._held_lock = threading.Lock()

    # -- what a subclass records -------------------------------------------------
    def acquire_time(self, alias: str, name: str, outcome: str, seconds: float) -> None:
        raise NotImplementedError

    def hold_time(self, alias: str, name: str, seconds: float) -> None:
        raise NotImplementedError

    def busy(self, alias: str, name: str) -> None:
        raise NotImplementedError

    def lost(self, alias: str, name: str, reason: str) -> None:
        raise NotImplementedError

    def at_risk(self, alias: str, name: str) -> None:
        raise NotImplementedError

    def held_by(self, alias: str, name: str, delta: int) -> None:
        raise NotImplementedError

    def request_done(self, alias: str, op: str, outcome: str, seconds: float) -> None:
        raise NotImplementedError

    def headroom(self, alias: str, name: str, seconds: float) -> None:
        raise NotImplementedError

    # -- the engine's side (engine/observe.py) -----------------------------------
    def event(self, event: str, *, alias: str, name: str, info: Mapping[str, Any]) -> None:
        if event == "acquired":
            self.acquire_time(alias, name, "acquired", info.get("waited") or 0.0)
            self._count_held(alias, name, info["lease"], +1)
        elif event == "busy":
            self.busy(alias, name)
            self.acquire_time(alias, name, "busy", info.get("waited") or 0.0)
        elif event == "released":
            self.hold_time(alias, name, info.get("held") or 0.0)
            self._count_held(alias, name, info["lease"], -1)
        elif event == "lost":
            self.lost(alias, name, str(info.get("reason") or "unknown"))
            self._count_held(alias, name, info["lease"], -1)
        elif event == "at_risk":
            self.at_risk(alias, name)
        elif event == "acquire_failed":
            self.acquire_time(alias, name, "error", info.get("waited") or 0.0)

    def _count_held(self, alias: str, name: str, lease: Any, delta: int) -> None:
        with self._held_lock:
            if (lease in self._held) == (delta > 0):
                return  # counted already (or never: it was held before this observer was added)
            if delta > 0:
                self._held.add(lease)
            else:
                self._held.discard(lease)
        self.held_by(alias, name, delta)

    def request(self, *, alias: str, op: str, outcome: str, seconds: float) -> None:
        self.request_done(alias, op, outcome, seconds)

    def renewed(self, *, alias: str, name: str, headroom: float) -> None:
        self.headroom(alias, name, headroom)
