"""OpenTelemetry traces and metrics for django-dynlock (extra ``django-dynlock[otel]``).

``DynlockInstrumentor().instrument()``, or ``"django_dynlock.contrib.opentelemetry"`` in
``INSTALLED_APPS``, which does the same at ``ready()``:

- a ``dynlock.acquire`` span around each acquire call, a child of the current span (the
  request's, under opentelemetry-instrumentation-django), with ``dynlock.alias``,
  ``dynlock.name`` (the key template), ``dynlock.outcome``, ``dynlock.waited``,
  ``dynlock.token`` and ``dynlock.looks``; a ``dynlock.busy`` event for each look that
  found the key held;
- a ``dynlock.release`` span around each ``release()``;
- the measures of ``contrib.prometheus`` through OpenTelemetry's metrics API
  (docs/observability.md has the names).

Only ``opentelemetry-api`` is needed: the providers are the project's (the global ones
unless ``tracer_provider=``/``meter_provider=`` are given).
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, Status, StatusCode

from ...engine.observe import AcquireObservation, ReleaseObservation, add_observer, remove_observer
from ..measures import MeasuringObserver

__all__ = ["DynlockInstrumentor", "OpenTelemetryObserver"]

SCOPE = "django_dynlock"


class _AcquireSpan(AcquireObservation):
    def __init__(self, observer: OpenTelemetryObserver, span: Span, alias: str, name: str):
        self.observer, self.span, self.alias, self.name = observer, span, alias, name

    def busy_look(self, looks: int, holder: str | None) -> None:
        attributes: dict[str, Any] = {"dynlock.look": looks}
        if holder:
            attributes["dynlock.holder"] = holder
        self.span.add_event("dynlock.busy", attributes)

    def end(self, outcome: str, *, waited: float, looks: int, token: int | None, error: BaseException | None) -> None:
        span = self.span
        attributes: dict[str, Any] = {"dynlock.outcome": outcome, "dynlock.waited": waited}
        if looks:  # acquire_many's transactions are not counted as looks
            attributes["dynlock.looks"] = looks
        if token is not None:
            attributes["dynlock.token"] = token
        span.set_attributes(attributes)  # one call: the SDK takes its lock once
        if outcome == "error" and error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()


class _ReleaseSpan(ReleaseObservation):
    def __init__(self, span: Span):
        self.span = span

    def end(self, outcome: str, *, held: float, error: BaseException | None) -> None:
        self.span.set_attributes({"dynlock.outcome": outcome, "dynlock.held": held})
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self.span.end()


class OpenTelemetryObserver(MeasuringObserver):
    """Spans and the measures, through the given (or global) providers."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None):
        super().__init__()
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self.acquire_duration = meter.create_histogram(
            "dynlock.acquire.duration", unit="s", description="Time an acquire call took, by outcome."
        )
        self.hold_duration = meter.create_histogram(
            "dynlock.hold.duration", unit="s", description="Time from acquire to release."
        )
        self.busy_count = meter.create_counter("dynlock.busy", description="Acquire calls that gave up on a busy key.")
        self.lost_count = meter.create_counter("dynlock.lost", description="Leases that ended before their release.")
        self.at_risk_count = meter.create_counter("dynlock.at_risk", description="Renewals that failed in time.")
        self.requests_count = meter.create_counter("dynlock.requests", description="Requests sent to DynamoDB.")
        self.request_duration = meter.create_histogram(
            "dynlock.request.duration", unit="s", description="Time each request to DynamoDB took."
        )
        self.held_count = meter.create_up_down_counter("dynlock.held", description="Leases held by this process.")
        self.renewal_headroom = meter.create_histogram(
            "dynlock.renewal.headroom", unit="s", description="Validity left on a lease when its renewal landed."
        )

    # spans
    def acquiring(self, *, alias: str, name: str, key: str) -> AcquireObservation | None:
        # A child of the current span: the caller's (a request's), whatever thread runs the steps.
        span = self.tracer.start_span("dynlock.acquire", attributes={"dynlock.alias": alias, "dynlock.name": name})
        return _AcquireSpan(self, span, alias, name)

    def releasing(self, *, alias: str, name: str, key: str) -> ReleaseObservation | None:
        span = self.tracer.start_span("dynlock.release", attributes={"dynlock.alias": alias, "dynlock.name": name})
        return _ReleaseSpan(span)

    # measures
    def acquire_time(self, alias: str, name: str, outcome: str, seconds: float) -> None:
        self.acquire_duration.record(
            seconds, {"dynlock.alias": alias, "dynlock.name": name, "dynlock.outcome": outcome}
        )

    def hold_time(self, alias: str, name: str, seconds: float) -> None:
        self.hold_duration.record(seconds, {"dynlock.alias": alias, "dynlock.name": name})

    def busy(self, alias: str, name: str) -> None:
        self.busy_count.add(1, {"dynlock.alias": alias, "dynlock.name": name})

    def lost(self, alias: str, name: str, reason: str) -> None:
        self.lost_count.add(1, {"dynlock.alias": alias, "dynlock.name": name, "dynlock.reason": reason})

    def at_risk(self, alias: str, name: str) -> None:
        self.at_risk_count.add(1, {"dynlock.alias": alias, "dynlock.name": name})

    def held_by(self, alias: str, name: str, delta: int) -> None:
        self.held_count.add(delta, {"dynlock.alias": alias, "dynlock.name": name})

    def request_done(self, alias: str, op: str, outcome: str, seconds: float) -> None:
        self.requests_count.add(1, {"dynlock.alias": alias, "dynlock.op": op, "dynlock.outcome": outcome})
        self.request_duration.record(seconds, {"dynlock.alias": alias, "dynlock.op": op})

    def headroom(self, alias: str, name: str, seconds: float) -> None:
        self.renewal_headroom.record(seconds, {"dynlock.alias": alias, "dynlock.name": name})


class DynlockInstrumentor:
    """OpenTelemetry's instrumentor convention: ``instrument()`` once per process,
    ``uninstrument()`` to stop. One instance is shared (as ``BaseInstrumentor``'s are)."""

    _instance: DynlockInstrumentor | None = None
    _lock = threading.Lock()

    def __new__(cls) -> DynlockInstrumentor:
        with cls._lock:
            if cls._instance is None:
                instance = super().__new__(cls)
                instance._observer = None
                cls._instance = instance
            return cls._instance

    _observer: OpenTelemetryObserver | None

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        return self._observer is not None

    def instrument(self, *, tracer_provider: Any = None, meter_provider: Any = None, **kwargs: Any) -> None:
        """Spans and measures for every lock client of this process, from now on."""
        with self._lock:
            if self._observer is not None:
                return  # as BaseInstrumentor: instrumenting twice does nothing
            self._observer = OpenTelemetryObserver(tracer_provider, meter_provider)
            add_observer(self._observer)

    def uninstrument(self, **kwargs: Any) -> None:
        with self._lock:
            if self._observer is not None:
                remove_observer(self._observer)
                self._observer = None
