"""Prometheus metrics for django-dynlock, through ``prometheus_client``.

Add ``"django_dynlock.contrib.prometheus"`` to ``INSTALLED_APPS`` (extra
``django-dynlock[prometheus]``): at ``ready()`` the metrics are registered on
``prometheus_client``'s default registry, where django-prometheus's ``/metrics`` view and
``prometheus_client``'s multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, gunicorn) find
them. Outside Django: ``install()``. The names are pinned (docs/observability.md).
"""

from __future__ import annotations

import threading

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

    def acquire_time(self, alias: str, name: str, outcome: str, seconds: float) -> None:
        self.acquire_seconds.labels(alias, name, outcome).observe(seconds)

    def hold_time(self, alias: str, name: str, seconds: float) -> None:
        self.hold_seconds.labels(alias, name).observe(seconds)

    def busy(self, alias: str, name: str) -> None:
        self.busy_total.labels(alias, name).inc()

    def lost(self, alias: str, name: str, reason: str) -> None:
        self.lost_total.labels(alias, name, reason).inc()

    def at_risk(self, alias: str, name: str) -> None:
        self.at_risk_total.labels(alias, name).inc()

    def held_by(self, alias: str, name: str, delta: int) -> None:
        self.held.labels(alias, name).inc(delta)

    def request_done(self, alias: str, op: str, outcome: str, seconds: float) -> None:
        self.requests_total.labels(alias, op, outcome).inc()
        self.request_seconds.labels(alias, op).observe(seconds)

    def headroom(self, alias: str, name: str, seconds: float) -> None:
        self.renewal_headroom_seconds.labels(alias, name).observe(seconds)


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
