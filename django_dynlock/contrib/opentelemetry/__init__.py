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

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.context import Context, get_current
from opentelemetry.metrics import Observation
from opentelemetry.trace import NoOpTracer, ProxyTracer, Span, Status, StatusCode, get_current_span

from ...engine.observe import AcquireObservation, ReleaseObservation, add_observer, observer_failed, remove_observer
from ..measures import MEASURED_EVENTS, MeasuringObserver

__all__ = ["DynlockInstrumentor", "OpenTelemetryObserver"]

SCOPE = "django_dynlock"

#: The engine's calls queued before they are measured together (four per uncontended
#: acquire+release: two requests, two events), unless a collection comes first.
RECORD_EVERY = 64


#: For each kind of parent, whether a tracer's sampler drops the span without looking at
#: anything else: (no parent, remote sampled, remote not sampled, local sampled, local not
#: sampled). ``None``: only ``start_span`` can tell (a ratio, a sampler of the project's).
_DropRule = tuple[bool, bool, bool, bool, bool]
_ALWAYS_DROPPED: _DropRule = (True, True, True, True, True)
_PARENT_KINDS = (
    "root",
    "remote_parent_sampled",
    "remote_parent_not_sampled",
    "local_parent_sampled",
    "local_parent_not_sampled",
)


def _drop_rule(tracer: Any) -> _DropRule | None:
    """When a span of ``tracer`` is dropped whatever its name, attributes and trace id.

    Asking ``start_span`` costs about 2.6 µs warm and 10 µs on a lock's path (a trace id,
    the sampler's result, a non-recording span) for a span nobody sees; the SDK's own
    samplers that decide from the parent alone (``ALWAYS_OFF``, ``ParentBased`` with them
    as delegates) can be asked once here. Anything else, or an SDK that counts the spans
    it starts, dropped ones too (``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``), gets None.
    """
    if type(tracer) is NoOpTracer:
        return _ALWAYS_DROPPED
    try:
        from opentelemetry.sdk.trace import Tracer as SdkTracer
        from opentelemetry.sdk.trace.sampling import ParentBased, StaticSampler
    except ImportError:
        return None
    if type(tracer) is not SdkTracer:
        return None
    counted = getattr(tracer, "_tracer_metrics", None)
    if counted is not None and type(counted).__name__ != "NoOpTracerMetrics":
        return None

    def drops(sampler: Any) -> bool:
        return type(sampler) is StaticSampler and sampler.get_description() == "AlwaysOffSampler"

    sampler = tracer.sampler
    if type(sampler) is StaticSampler:
        return _ALWAYS_DROPPED if drops(sampler) else None
    if type(sampler) is not ParentBased:
        return None
    # ParentBased's delegates have no public name; tests/test_observability.py pins them
    # in the SDK installed. Renamed, start_span is asked each time: slower, never wrong.
    delegates = [getattr(sampler, f"_{kind}", None) for kind in _PARENT_KINDS]
    if any(delegate is None for delegate in delegates):
        return None
    rule = tuple(drops(delegate) for delegate in delegates)
    return rule if any(rule) else None  # type: ignore[return-value]


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


#: The context of a measure taken outside any span: never empty, as an empty one is falsy
#: and the SDK would take the recording thread's current context instead (its span as
#: the exemplar of a value measured elsewhere).
_NO_SPAN = Context({"django_dynlock.no-span": True})


class _Counts:
    """The measures of one meter, taken in batches; the counters kept here.

    The engine's calls (an event, a request, a renewal) are queued as they come, each
    with its context, and measured ``RECORD_EVERY`` at a time, or when a reader collects
    if that comes first: the SDK's ``record()`` takes about 5 µs with its code warm, and
    three to four times that, with dynlock's own work around it, between two requests of
    a lock's path, where boto3's work has pushed both out of the CPU's caches. Measured
    in a batch they stay warm, and the lock's path pays a ``deque.append``.

    The counters are counted here (a dict increment, not the SDK's ``add()``, which
    builds a Measurement and cleans, copies and hashes its attributes) and reported
    through asynchronous instruments when a reader collects: the exporter sees the same
    names, values and attributes (a monotonic sum for the counters, an up-down one for
    ``dynlock.held``). The SDK runs their callbacks before it collects what was recorded,
    so a collection has every measure queued before it.

    One thread measures at a time (``flushing``): a lease's events are measured in the
    order they came (``dynlock.held`` counts a lease down once, after its count up), and
    the counts change only under that lock.

    One per meter, shared by every observer made on it: the SDK hands back the
    instrument registered first when a name is created again (``instrument()`` after
    ``uninstrument()`` on the same provider), with its first callbacks, so the counts
    must be the ones those callbacks read; and a cumulative sum must never go down.
    """

    def __init__(self, meter: Any):
        self.flushing = threading.Lock()
        _EVERY_COUNTS.add(self)
        # (alias, name) or (alias, name, reason) or (alias, op, outcome) -> count
        self.busy: dict[tuple[str, ...], int] = {}
        self.lost: dict[tuple[str, ...], int] = {}
        self.at_risk: dict[tuple[str, ...], int] = {}
        self.requests: dict[tuple[str, ...], int] = {}
        self.held: dict[tuple[str, ...], int] = {}
        named = ("dynlock.alias", "dynlock.name")
        for counts, metric, keys, description, create in (
            (
                self.busy,
                "dynlock.busy",
                named,
                "Acquire calls that gave up on a busy key.",
                meter.create_observable_counter,
            ),
            (
                self.lost,
                "dynlock.lost",
                (*named, "dynlock.reason"),
                "Leases that ended before their release.",
                meter.create_observable_counter,
            ),
            (self.at_risk, "dynlock.at_risk", named, "Renewals that failed in time.", meter.create_observable_counter),
            (
                self.requests,
                "dynlock.requests",
                ("dynlock.alias", "dynlock.op", "dynlock.outcome"),
                "Requests sent to DynamoDB.",
                meter.create_observable_counter,
            ),
            (self.held, "dynlock.held", named, "Leases held by this process.", meter.create_observable_up_down_counter),
        ):
            create(metric, callbacks=[self._callback(counts, keys)], description=description)

        # The calls not yet measured: (measure, its arguments, the context it came in).
        self.pending: deque[tuple[Callable[..., None], tuple[Any, ...], Context]] = deque()
        # The context of the call being measured, for its histogram's exemplar (flushing).
        self.context: Context = _NO_SPAN

    def defer(self, measure: Callable[..., None], args: tuple[Any, ...]) -> None:
        """``measure(*args)`` in the next batch, with the context it has now."""
        pending = self.pending
        pending.append((measure, args, get_current() or _NO_SPAN))
        if len(pending) >= RECORD_EVERY:
            self.flush(wait=False)

    def flush(self, wait: bool = True) -> None:
        """Measure what is queued; ``wait=False``: unless another thread is at it (it
        takes what was queued meanwhile, or the next batch does)."""
        if not self.flushing.acquire(blocking=wait):
            return
        try:
            self._measure_pending()
        finally:
            self.flushing.release()

    def _measure_pending(self) -> None:
        pending = self.pending
        try:
            while True:
                try:
                    measure, args, self.context = pending.popleft()
                except IndexError:
                    return
                try:
                    measure(*args)
                except Exception:
                    observer_failed(measure, "a measure")  # the others are still taken
        finally:
            self.context = _NO_SPAN

    def record(self, histogram: Any, amount: float, attributes: dict[str, str]) -> None:
        """A histogram's value (while flushing), in the context it was measured in."""
        histogram.record(amount, attributes, context=self.context)

    def add(self, counts: dict[tuple[str, ...], int], labels: tuple[str, ...], delta: int) -> None:
        """A count (while flushing)."""
        counts[labels] = counts.get(labels, 0) + delta

    def _callback(
        self, counts: dict[tuple[str, ...], int], keys: tuple[str, ...]
    ) -> Callable[[Any], list[Observation]]:
        def observe(options: Any) -> list[Observation]:
            with self.flushing:
                self._measure_pending()
                items = list(counts.items())
            # Without a span: a count has no exemplar (the SDK would take the collecting
            # thread's span, which has nothing to do with what was counted).
            return [Observation(count, dict(zip(keys, labels)), _NO_SPAN) for labels, count in items]

        return observe


# Every _Counts of this process, for _reset_after_fork.
_EVERY_COUNTS: weakref.WeakSet[_Counts] = weakref.WeakSet()


def _reset_after_fork() -> None:
    # A batch measured by another thread of the parent at the fork leaves ``flushing``
    # held in the child, where no thread will release it: every collection would wait.
    for counts in list(_EVERY_COUNTS):
        counts.flushing = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)

_COUNTS: weakref.WeakKeyDictionary[Any, _Counts] = weakref.WeakKeyDictionary()
_COUNTS_LOCK = threading.Lock()


def _counts_of(meter: Any) -> _Counts:
    with _COUNTS_LOCK:
        try:
            counts = _COUNTS.get(meter)
        except TypeError:  # a meter that cannot be weakly referenced: its own counts
            return _Counts(meter)
        if counts is None:
            counts = _COUNTS[meter] = _Counts(meter)
        return counts


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
        self.request_duration = meter.create_histogram(
            "dynlock.request.duration", unit="s", description="Time each request to DynamoDB took."
        )
        self.renewal_headroom = meter.create_histogram(
            "dynlock.renewal.headroom", unit="s", description="Validity left on a lease when its renewal landed."
        )
        self.counts = _counts_of(meter)
        # One attributes dict per label set, built once: the SDK copies what it keeps.
        self._attributes: dict[tuple[str, ...], dict[str, str]] = {}
        # (tracer, its sampler, their drop rule): worked out again if either changes.
        self._rule: tuple[Any, Any, _DropRule | None] = (None, None, None)

    def _dropped(self) -> bool:
        """Whether a span started now is certain to be dropped by the sampler (then it is
        not started: nobody would see it). Follows the parent as ``ParentBased`` does: a
        span under a sampled parent is started, and recorded."""
        tracer = self.tracer
        if type(tracer) is ProxyTracer:  # the global provider's, resolved once it is set
            tracer = tracer._tracer  # noqa: SLF001 (the API's own resolution: the no-op tracer until a provider is set)
        sampler = getattr(tracer, "sampler", None)
        cached, cached_sampler, rule = self._rule
        if cached is not tracer or cached_sampler is not sampler:
            rule = _drop_rule(tracer)
            self._rule = (tracer, sampler, rule)
        if rule is None:
            return False
        context = get_current()
        if not context:  # nothing current, no span: a root
            return rule[0]
        parent = get_current_span(context).get_span_context()
        if not parent.is_valid:
            return rule[0]
        sampled = parent.trace_flags.sampled
        if parent.is_remote:
            return rule[1] if sampled else rule[2]
        return rule[3] if sampled else rule[4]

    def _named(self, alias: str, name: str, outcome: str | None = None) -> dict[str, str]:
        key = (alias, name) if outcome is None else (alias, name, outcome)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = {"dynlock.alias": alias, "dynlock.name": name}
            if outcome is not None:
                attributes["dynlock.outcome"] = outcome
            self._attributes[key] = attributes
        return attributes

    def _op(self, alias: str, op: str) -> dict[str, str]:
        key = ("op", alias, op)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = self._attributes[key] = {"dynlock.alias": alias, "dynlock.op": op}
        return attributes

    # spans
    def acquiring(self, *, alias: str, name: str, key: str) -> AcquireObservation | None:
        if self._dropped():
            return None
        # A child of the current span: the caller's (a request's), whatever thread runs the steps.
        span = self.tracer.start_span("dynlock.acquire", attributes=self._named(alias, name))
        if not span.is_recording():
            # Sampled out (or no SDK): its attributes, events and end would be dropped,
            # so the engine is told nobody follows this call and skips them.
            return None
        return _AcquireSpan(self, span, alias, name)

    def releasing(self, *, alias: str, name: str, key: str) -> ReleaseObservation | None:
        if self._dropped():
            return None
        span = self.tracer.start_span("dynlock.release", attributes=self._named(alias, name))
        if not span.is_recording():
            return None
        return _ReleaseSpan(span)

    # The engine's calls: queued as they come (with their context), measured in batches.
    def event(self, event: str, *, alias: str, name: str, info: Mapping[str, Any]) -> None:
        if event not in MEASURED_EVENTS:
            return
        if "error" in info:  # acquire_failed, at_risk: not the exception, whose traceback would be kept
            info = {key: value for key, value in info.items() if key != "error"}
        self.counts.defer(self._measure_event, (event, alias, name, info))

    def _measure_event(self, event: str, alias: str, name: str, info: Mapping[str, Any]) -> None:
        MeasuringObserver.event(self, event, alias=alias, name=name, info=info)

    def request(self, *, alias: str, op: str, outcome: str, seconds: float) -> None:
        self.counts.defer(self.request_done, (alias, op, outcome, seconds))

    def renewed(self, *, alias: str, name: str, headroom: float) -> None:
        self.counts.defer(self.headroom, (alias, name, headroom))

    # The measures (called while a batch is measured).
    def acquire_time(self, alias: str, name: str, outcome: str, seconds: float) -> None:
        self.counts.record(self.acquire_duration, seconds, self._named(alias, name, outcome))

    def hold_time(self, alias: str, name: str, seconds: float) -> None:
        self.counts.record(self.hold_duration, seconds, self._named(alias, name))

    def busy(self, alias: str, name: str) -> None:
        self.counts.add(self.counts.busy, (alias, name), 1)

    def lost(self, alias: str, name: str, reason: str) -> None:
        self.counts.add(self.counts.lost, (alias, name, reason), 1)

    def at_risk(self, alias: str, name: str) -> None:
        self.counts.add(self.counts.at_risk, (alias, name), 1)

    def held_by(self, alias: str, name: str, delta: int) -> None:
        self.counts.add(self.counts.held, (alias, name), delta)

    def request_done(self, alias: str, op: str, outcome: str, seconds: float) -> None:
        self.counts.add(self.counts.requests, (alias, op, outcome), 1)
        self.counts.record(self.request_duration, seconds, self._op(alias, op))

    def headroom(self, alias: str, name: str, seconds: float) -> None:
        self.counts.record(self.renewal_headroom, seconds, self._named(alias, name))


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
                self._observer.counts.flush()  # what it heard is measured, not left pending
                self._observer = None
