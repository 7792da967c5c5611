"""Prometheus metrics for django-dynlock, through ``prometheus_client``.

Add ``"django_dynlock.contrib.prometheus"`` to ``INSTALLED_APPS`` (extra
``django-dynlock[prometheus]``): at ``ready()`` the metrics are registered on
``prometheus_client``'s default registry, where django-prometheus's ``/metrics`` view and
``prometheus_client``'s multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, gunicorn) find
them. Outside Django: ``install()``. The names are pinned (docs/observability.md).
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ...engine.observe import add_observer, remove_observer
from ..measures import ACQUIRE_BUCKETS, HEADROOM_BUCKETS, HOLD_BUCKETS, REQUEST_BUCKETS, MeasuringObserver

__all__ = ["PrometheusObserver", "install", "uninstall"]


class PrometheusObserver(MeasuringObserver):
    """The pinned metrics, registered on ``registry``, fed by every lock client of the process."""

    def __init__(self, registry: CollectorRegistry = REGISTRY):
        super().__init__()
        named = ["alias", "name"]
        self.acquire_seconds = Histogram(
            "dynlock_acquire_seconds",
            "Time an acquire call took, by how it ended (acquired, busy, error).",
            [*named, "outcome"],
            buckets=ACQUIRE_BUCKETS,
            registry=registry,
        )
        self.hold_seconds = Histogram(
            "dynlock_hold_seconds",
            "Time from acquire to release.",
            named,
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        self.busy_total = Counter("dynlock_busy", "Acquire calls that gave up on a busy key.", named, registry=registry)
        self.lost_total = Counter(
            "dynlock_lost", "Leases that ended before their release, by reason.", [*named, "reason"], registry=registry
        )
        self.at_risk_total = Counter(
            "dynlock_at_risk", "Renewals that failed while the lease was still valid.", named, registry=registry
        )
        self.requests_total = Counter(
            "dynlock_requests",
            "Requests sent to DynamoDB, by operation and outcome (ok, condition_failed, throttled, error).",
            ["alias", "op", "outcome"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "dynlock_request_seconds",
            "Time each request to DynamoDB took.",
            ["alias", "op"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self.held = Gauge(
            "dynlock_held",
            "Leases held by this process.",
            named,
            registry=registry,
            multiprocess_mode="livesum",  # a scrape of gunicorn's workers: those alive, summed
        )
        self.renewal_headroom_seconds = Histogram(
            "dynlock_renewal_headroom_seconds",
            "Validity left on a lease when its renewal landed.",
            named,
            buckets=HEADROOM_BUCKETS,
            registry=registry,
        )

        # Each metric's labelled children by their label values: ``labels()`` checks and
        # joins the values under the metric's lock on every call; a dict lookup does not.
        # As many entries as series, which the name label keeps few.
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def acquire_time(self, alias: str, name: str, outcome: str, seconds: float) -> None:
        self._child(self.acquire_seconds, alias, name, outcome).observe(seconds)

    def hold_time(self, alias: str, name: str, seconds: float) -> None:
        self._child(self.hold_seconds, alias, name).observe(seconds)

    def busy(self, alias: str, name: str) -> None:
        self._child(self.busy_total, alias, name).inc()

    def lost(self, alias: str, name: str, reason: str) -> None:
        self._child(self.lost_total, alias, name, reason).inc()

    def at_risk(self, alias: str, name: str) -> None:
        self._child(self.at_risk_total, alias, name).inc()

    def held_by(self, alias: str, name: str, delta: int) -> None:
        self._child(self.held, alias, name).inc(delta)

    def request_done(self, alias: str, op: str, outcome: str, seconds: float) -> None:
        self._child(self.requests_total, alias, op, outcome).inc()
        self._child(self.request_seconds, alias, op).observe(seconds)

    def headroom(self, alias: str, name: str, seconds: float) -> None:
        self._child(self.renewal_headroom_seconds, alias, name).observe(seconds)


_installed: PrometheusObserver | None = None
_lock = threading.Lock()


def install() -> PrometheusObserver:
    """Register the metrics on the default registry (once per process) and feed them."""
    global _installed
    with _lock:
        if _installed is None:
            _installed = PrometheusObserver()
        add_observer(_installed)
        return _installed


def uninstall() -> None:
    """Stop feeding the metrics (they stay registered, with the values they had)."""
    with _lock:
        if _installed is not None:
            remove_observer(_installed)
