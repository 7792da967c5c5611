"""Observability (issue 39): the Prometheus metrics and the OpenTelemetry spans and
measures, on DynamoDB Local.

- exact counts of a scripted scenario (two acquisitions, a busy try_acquire, a waiter
  served after a release, a SIGKILLed holder taken over, a throttled request through the
  fault proxy, a broken lease), and one count per request the proxy saw;
- one series per template, however many tenants fill it;
- gunicorn with 3 workers in prometheus_client's multiprocess mode: one scrape sums them;
- the acquire span nested under a Django request's span, its busy looks as events, the
  release span, and the measures through OpenTelemetry's metrics API;
- neither library imported unless its app is installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from django_dynlock import dynamo_lock
from django_dynlock.contrib import prometheus as dynlock_prometheus
from django_dynlock.contrib.prometheus import PrometheusObserver
from django_dynlock.engine.events import Events
from django_dynlock.engine.observe import add_observer, remove_observer
from django_dynlock.exceptions import BackendError, LockLost
from django_dynlock.keytemplates import check_templates, resolve_keys
from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import REPO_ROOT, free_port
from tests.support.clients import client_for
from tests.support.polling import wait_for
from tests.support.tables import fresh_table


def value(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric, labels) or 0.0


@pytest.fixture
def prometheus():
    observer = dynlock_prometheus.install()
    yield observer
    dynlock_prometheus.uninstall()


# A holder in another process, killed with SIGKILL once it holds its key: its lease of
# one second is taken over once it has expired by DynamoDB's clock.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from tests.support.clients import client_for
    client = client_for(sys.argv[1], sys.argv[2])
    client.acquire(sys.argv[3], lease=1.0)
    print("HELD", flush=True)
    time.sleep(60)
    """
)


def start_holder(endpoint: str, table: str, key: str) -> tuple[subprocess.Popen, threading.Event, threading.Thread]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, endpoint, table, key],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    held = threading.Event()

    def read() -> None:
        for line in child.stdout:  # type: ignore[union-attr]
            if line.strip() == "HELD":
                held.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return child, held, reader


def test_a_scripted_scenario_gives_exact_counts(dynamodb_local_server, settings, prometheus):
    endpoint = dynamodb_local_server.endpoint_url
    alias = f"obs-{uuid.uuid4().hex[:8]}"
    name = "job:{id}"
    at = {"alias": alias, "name": name}
    with fresh_table(settings, endpoint) as other, FaultProxy(endpoint) as proxy:
        table = other.options.table_name
        child, held, reader = start_holder(endpoint, table, "job:5")  # starts while the rest runs
        client = client_for(proxy.endpoint_url, table, alias=alias)
        try:
            # Two acquisitions: one released at once, one held until it is broken.
            with client.acquire("job:1", metrics_name=name):
                pass
            kept = client.acquire("job:2", metrics_name=name)
            # One busy try_acquire.
            busy = other.acquire("job:3")
            assert client.try_acquire("job:3", metrics_name=name) is None
            busy.release()
            # One waiter that gets the key after a release.
            holding = other.acquire("job:4")
            threading.Timer(0.3, holding.release).start()
            with client.acquire("job:4", wait=5, metrics_name=name):
                pass
            # One SIGKILLed holder taken over.
            assert held.wait(30), "the holder process never held job:5"
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            with client.acquire("job:5", wait=10, metrics_name=name):
                pass
            # One throttled request, through the fault proxy: the acquire's first write.
            proxy.add_fault("throttle", operation="UpdateItem", match=lambda body: "job:6" in json.dumps(body))
            with client.acquire("job:6", wait=5, metrics_name=name):
                pass
            # One broken lease: the operator breaks it, its holder's next write finds out.
            assert other.break_lease("job:2")
            with pytest.raises(LockLost):
                kept.extend()
            stats = proxy.stats
        finally:
            client.close()
            if child.poll() is None:
                child.kill()
                child.wait(10)
            reader.join(10)  # its pipe at its end: closed after the reader is done with it
            child.stdout.close()  # type: ignore[union-attr]

    assert value("dynlock_acquire_seconds_count", **at, outcome="acquired") == 5
    assert value("dynlock_acquire_seconds_count", **at, outcome="busy") == 1
    assert value("dynlock_acquire_seconds_count", **at, outcome="error") == 0
    assert value("dynlock_busy_total", **at) == 1
    assert value("dynlock_hold_seconds_count", **at) == 4
    assert value("dynlock_lost_total", **at, reason="broken") == 1
    assert value("dynlock_at_risk_total", **at) == 0
    assert value("dynlock_held", **at) == 0
    # Every request the proxy saw, counted once, under DynamoDB's name of its operation.
    assert stats["throttle"] == 1
    assert value("dynlock_requests_total", alias=alias, op="UpdateItem", outcome="throttled") == 1
    for op, seen in stats.operations.items():
        counted = sum(
            value("dynlock_requests_total", alias=alias, op=op, outcome=outcome)
            for outcome in ("ok", "condition_failed", "throttled", "error")
        )
        assert (op, counted) == (op, seen)
        assert value("dynlock_request_seconds_count", alias=alias, op=op) == seen
    assert value("dynlock_requests_total", alias=alias, op="UpdateItem", outcome="condition_failed") >= 2
    # job:2 was renewed while held (lease 5 s, renewed every second), each renewal in time.
    renewals = value("dynlock_renewal_headroom_seconds_count", **at)
    assert renewals >= 1
    assert value("dynlock_renewal_headroom_seconds_bucket", **at, le="0.0") == 0
    assert 0 < value("dynlock_renewal_headroom_seconds_sum", **at) / renewals <= 5.0


def test_an_acquire_that_dynamodb_fails_is_an_error_and_each_of_its_requests_counted(
    dynamodb_local_server, settings, prometheus
):
    alias = f"obs-{uuid.uuid4().hex[:8]}"
    at = {"alias": alias, "name": "job"}
    with (
        fresh_table(settings, dynamodb_local_server.endpoint_url) as other,
        FaultProxy(dynamodb_local_server.endpoint_url) as proxy,
    ):
        client = client_for(proxy.endpoint_url, other.options.table_name, alias=alias)
        try:
            # Every request throttled (none applied: nothing to undo) until the wait is over.
            proxy.add_fault("throttle", times=1000)
            with pytest.raises(BackendError):
                client.acquire("job:1", wait=0.3)
            stats = proxy.stats
        finally:
            client.close()
    assert value("dynlock_acquire_seconds_count", **at, outcome="error") == 1
    assert value("dynlock_acquire_seconds_count", **at, outcome="busy") == 0
    assert value("dynlock_busy_total", **at) == 0
    assert stats["throttle"] == stats.requests >= 2
    counted = sum(value("dynlock_requests_total", alias=alias, op=op, outcome="throttled") for op in stats.operations)
    assert counted == stats.requests


TEMPLATE = "export:{tenant_id}"
REAL = 30


def test_ten_thousand_tenants_through_one_template_make_one_series(dynamodb_local_server, settings):
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    add_observer(observer)
    try:
        with fresh_table(settings, dynamodb_local_server.endpoint_url) as client:

            @dynamo_lock(TEMPLATE)
            def export(tenant_id: int) -> int:
                return dynamo_lock.current().token

            # For real, on DynamoDB Local: thirty tenants through the decorator, and as
            # many raw keys, which are named by their prefix (or "other", without one).
            for tenant in range(REAL):
                export(tenant)
                client.acquire(f"invoice:{tenant}").release()
                client.acquire(f"tenant-{tenant}").release()
            # And ten thousand through the engine's own event path with the name the
            # decorator gives (what a busy acquire emits), without 10,000 requests.
            name = dynamo_lock(TEMPLATE)._name([TEMPLATE])
            signature = check_templates([TEMPLATE], export.__wrapped__)
            events = Events(client, alias="default")
            for tenant in range(10_000):
                (key,) = resolve_keys([TEMPLATE], signature, (tenant,), {})
                events.emit("busy", key=key, holder=None, waited=0.0, name=name)
    finally:
        remove_observer(observer)

    def series(metric: str) -> dict[tuple, float]:
        return {
            tuple(sorted(sample.labels.items())): sample.value
            for family in registry.collect()
            for sample in family.samples
            if sample.name == metric
        }

    acquired = series("dynlock_acquire_seconds_count")
    assert acquired == {
        (("alias", "default"), ("name", TEMPLATE), ("outcome", "acquired")): REAL,
        (("alias", "default"), ("name", TEMPLATE), ("outcome", "busy")): 10_000,
        (("alias", "default"), ("name", "invoice"), ("outcome", "acquired")): REAL,
        (("alias", "default"), ("name", "other"), ("outcome", "acquired")): REAL,
    }
    assert series("dynlock_busy_total") == {(("alias", "default"), ("name", TEMPLATE)): 10_000}
    assert len(series("dynlock_hold_seconds_count")) == 3
    names = {value for labels in acquired for key, value in labels if key == "name"}
    assert names == {TEMPLATE, "invoice", "other"}


def scrape(base: str) -> dict[tuple, float]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
def test_one_scrape_sums_three_gunicorn_workers(dynamodb_local_server, settings, tmp_path):
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with fresh_table(settings, dynamodb_local_server.endpoint_url) as client:
        env = dict(
            os.environ,
            DJANGO_SETTINGS_MODULE="tests.sites.metrics_site",
            SITE_ENDPOINT_URL=dynamodb_local_server.endpoint_url,
            SITE_TABLE=client.options.table_name,
            PROMETHEUS_MULTIPROC_DIR=str(multiproc),
            PYTHONPATH=str(REPO_ROOT),
        )
        log = open(tmp_path / "gunicorn.log", "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--workers", "3", "--bind", f"127.0.0.1:{port}"]
            + ["tests.sites.metrics_site:application"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def get(path: str) -> dict:
            with urllib.request.urlopen(f"{base}{path}", timeout=10) as reply:
                return json.loads(reply.read())

        def up() -> bool:
            try:
                return bool(get("/work/0/"))
            except OSError:
                return False

        try:
            wait_for(up, 60, "gunicorn to serve")
            before = scrape(base)
            # Three at a time, each held 0.2 s: a sync worker serves one request at a
            # time, so each of the three takes one of every three.
            with ThreadPoolExecutor(3) as pool:
                pids = list(pool.map(lambda n: get(f"/work/{n}/?seconds=0.2")["pid"], range(1, 19)))
            after = scrape(base)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(20)
            log.close()

    assert len(set(pids)) == 3, f"the requests went to {len(set(pids))} worker(s), not 3"
    labels = (("alias", "default"), ("name", "work:{n}"), ("outcome", "acquired"))
    count = ("dynlock_acquire_seconds_count", labels)
    assert after[count] - before.get(count, 0) == 18
    hold = ("dynlock_hold_seconds_count", labels[:2])
    assert after[hold] - before.get(hold, 0) == 18
    assert after[("dynlock_held", labels[:2])] == 0


@pytest.fixture
def traced(settings):
    """In-memory spans and metrics; the Django request instrumented as a project would
    (opentelemetry-instrumentation-django), dynlock through its instrumentor."""
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from django_dynlock.contrib.opentelemetry import DynlockInstrumentor

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    settings.ROOT_URLCONF = "tests.support.observed_views"
    settings.ALLOWED_HOSTS = ["testserver"]
    DjangoInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    DynlockInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield exporter, reader
    finally:
        DynlockInstrumentor().uninstrument()
        DjangoInstrumentor().uninstrument()


def test_the_acquire_span_is_nested_under_the_requests_span(dynamodb_local_server, settings, traced, client):
    exporter, reader = traced
    with fresh_table(settings, dynamodb_local_server.endpoint_url) as locks:
        assert client.get("/report/acme/").status_code == 200
        # Busy: another process (another client) holds the key while the view waits 0.6 s.
        other = client_for(dynamodb_local_server.endpoint_url, locks.options.table_name)
        try:
            with other.acquire("report:globex"):
                assert client.get("/report/globex/").status_code == 423
        finally:
            other.close()
        # Several keys at once: one span for the group.
        locks.acquire_many(["pair:1", "pair:2"], metrics_name="pair:{n}").release()

    spans = exporter.get_finished_spans()
    requests = [span for span in spans if span.attributes.get("http.route") == "report/<str:tenant>/"]
    # The views' spans; the other client's acquire (outside any request) is a root span.
    in_requests = {request.context.span_id for request in requests}
    acquires = [span for span in spans if span.name == "dynlock.acquire" and span.parent is not None]
    releases = [span for span in spans if span.name == "dynlock.release" and span.parent is not None]
    roots = [span.name for span in spans if span.name.startswith("dynlock.") and span.parent is None]
    assert len(requests) == 2 and len(acquires) == 2 and len(releases) == 1, [span.name for span in spans]
    assert {span.parent.span_id for span in acquires + releases} <= in_requests
    # The other client's acquire and release; the group's acquire and its two releases.
    assert sorted(roots) == ["dynlock.acquire"] * 2 + ["dynlock.release"] * 3
    (group,) = [
        span for span in spans if span.attributes.get("dynlock.name") == "pair:{n}" and span.name.endswith("acquire")
    ]
    assert group.attributes["dynlock.outcome"] == "acquired"
    assert "dynlock.token" not in group.attributes and "dynlock.looks" not in group.attributes
    for request, acquire in zip(requests, acquires):
        assert acquire.parent is not None and acquire.parent.span_id == request.context.span_id
        assert acquire.context.trace_id == request.context.trace_id
    assert releases[0].parent.span_id == requests[0].context.span_id

    got, busy = acquires
    assert got.attributes["dynlock.alias"] == "default"
    assert got.attributes["dynlock.name"] == "report:{tenant}"
    assert got.attributes["dynlock.outcome"] == "acquired"
    assert got.attributes["dynlock.token"] > 0
    assert got.attributes["dynlock.looks"] >= 1
    assert 0 <= got.attributes["dynlock.waited"] < 0.6
    assert not [event for event in got.events if event.name == "dynlock.busy"]
    assert releases[0].attributes["dynlock.outcome"] == "released"

    assert busy.attributes["dynlock.outcome"] == "busy"
    assert "dynlock.token" not in busy.attributes
    assert busy.attributes["dynlock.waited"] >= 0.6
    looks = [event for event in busy.events if event.name == "dynlock.busy"]
    # Every look found the key held: one event each, numbered in order.
    assert len(looks) == busy.attributes["dynlock.looks"] >= 2
    assert [event.attributes["dynlock.look"] for event in looks] == list(range(1, len(looks) + 1))

    # The same measures through OpenTelemetry's metrics API.
    measured = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            if scope.scope.name != "django_dynlock":
                continue
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    measured[(metric.name, tuple(sorted(point.attributes.items())))] = (
                        point.count if hasattr(point, "count") else point.value
                    )
    named = (("dynlock.alias", "default"), ("dynlock.name", "report:{tenant}"))
    assert measured[("dynlock.acquire.duration", (*named, ("dynlock.outcome", "acquired")))] == 1
    assert measured[("dynlock.acquire.duration", (*named, ("dynlock.outcome", "busy")))] == 1
    assert measured[("dynlock.busy", named)] == 1
    assert measured[("dynlock.hold.duration", named)] == 1
    assert measured[("dynlock.held", named)] == 0
    updates = sum(
        count
        for (metric, labels), count in measured.items()
        if metric == "dynlock.requests" and ("dynlock.op", "UpdateItem") in labels
    )
    assert updates >= 3  # the acquire, the release, the busy view's writes


IMPORTS = textwrap.dedent(
    """
    import sys
    import django
    from django.conf import settings
    apps = sys.argv[1:]
    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
            "django.contrib.sessions", "django.contrib.messages", "django_dynlock", *apps,
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    )
    django.setup()
    import django_dynlock, django_dynlock.decorators, django_dynlock.signals, django_dynlock.registry
    import django_dynlock.admin, django_dynlock.engine, django_dynlock.contrib
    from django_dynlock.engine.observe import OBSERVERS
    print(sorted(name for name in ("prometheus_client", "opentelemetry") if name in sys.modules))
    print(sorted(type(observer).__name__ for observer in OBSERVERS))
    """
)


@pytest.mark.parametrize(
    ("apps", "modules", "observers"),
    [
        ([], [], []),
        (["django_dynlock.contrib.prometheus"], ["prometheus_client"], ["PrometheusObserver"]),
        (["django_dynlock.contrib.opentelemetry"], ["opentelemetry"], ["OpenTelemetryObserver"]),
    ],
    ids=["neither", "prometheus", "opentelemetry"],
)
def test_neither_library_is_imported_unless_its_app_is_installed(apps, modules, observers):
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS, *apps],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert out == [repr(modules), repr(observers)]


def otel_points(reader) -> dict[tuple, tuple]:
    """Each django_dynlock data point an in-memory reader collects now:
    (metric, attributes) -> (kind, monotonic, value or count)."""
    points = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            if scope.scope.name != "django_dynlock":
                continue
            for metric in scope.metrics:
                kind = type(metric.data).__name__
                monotonic = getattr(metric.data, "is_monotonic", None)
                for point in metric.data.data_points:
                    amount = point.count if hasattr(point, "count") else point.value
                    points[(metric.name, tuple(sorted(point.attributes.items())))] = (kind, monotonic, amount)
    return points


def test_the_opentelemetry_counters_kept_by_dynlock_reach_the_exporter_as_counters(dynamodb_local_server, settings):
    """The counters are counted by dynlock and reported at collection time (asynchronous
    instruments): an exporter sees the names, kinds, values and attributes a synchronous
    counter would give, the same counts Prometheus takes of the same scenario, and counts
    that keep growing across uninstrument() and instrument() on the same provider."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from django_dynlock.contrib.opentelemetry import DynlockInstrumentor

    registry = CollectorRegistry()
    prometheus = PrometheusObserver(registry)
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    alias = f"obs-{uuid.uuid4().hex[:8]}"
    name = "count:{id}"
    named = (("dynlock.alias", alias), ("dynlock.name", name))

    def scenario(client, other) -> None:
        with client.acquire("count:1", metrics_name=name):
            pass
        kept = client.acquire("count:2", metrics_name=name)
        busy = other.acquire("count:3")
        assert client.try_acquire("count:3", metrics_name=name) is None
        busy.release()
        assert other.break_lease("count:2")
        with pytest.raises(LockLost):
            kept.extend()

    add_observer(prometheus)
    DynlockInstrumentor().instrument(meter_provider=meter_provider)
    try:
        with fresh_table(settings, dynamodb_local_server.endpoint_url) as other:
            client = client_for(dynamodb_local_server.endpoint_url, other.options.table_name, alias=alias)
            try:
                scenario(client, other)
                first = otel_points(reader)
                # Off and on again on the same provider: the SDK keeps the instruments
                # registered first, and their counts go on from where they were.
                DynlockInstrumentor().uninstrument()
                DynlockInstrumentor().instrument(meter_provider=meter_provider)
                scenario(client, other)
                second = otel_points(reader)
            finally:
                client.close()
    finally:
        DynlockInstrumentor().uninstrument()
        remove_observer(prometheus)

    def scraped(metric: str, **labels: str) -> float:
        return registry.get_sample_value(metric, {"alias": alias, **labels}) or 0.0

    assert first[("dynlock.busy", named)] == ("Sum", True, 1)
    assert first[("dynlock.lost", (*named, ("dynlock.reason", "broken")))] == ("Sum", True, 1)
    assert first[("dynlock.held", named)] == ("Sum", False, 0)
    assert ("dynlock.at_risk", named) not in first  # never counted: no point, as a counter never added to
    assert first[("dynlock.acquire.duration", (*named, ("dynlock.outcome", "acquired")))] == ("Histogram", None, 2)
    assert second[("dynlock.busy", named)] == ("Sum", True, 2)
    assert second[("dynlock.lost", (*named, ("dynlock.reason", "broken")))] == ("Sum", True, 2)
    assert second[("dynlock.held", named)] == ("Sum", False, 0)
    # Every request, by operation and outcome, as Prometheus counted it in the same run.
    requests = {
        labels: amount
        for (metric, labels), (_, _, amount) in second.items()
        if metric == "dynlock.requests" and labels[0] == ("dynlock.alias", alias)
    }
    assert len(requests) >= 2  # ok and condition_failed UpdateItems at least
    for labels, amount in requests.items():
        attributes = dict(labels)
        op, outcome = attributes["dynlock.op"], attributes["dynlock.outcome"]
        assert (op, outcome, amount) == (op, outcome, scraped("dynlock_requests_total", op=op, outcome=outcome))
        assert second[("dynlock.requests", labels)][:2] == ("Sum", True)
    assert sum(requests.values()) == sum(
        count
        for (metric, labels), (_, _, count) in second.items()
        if metric == "dynlock.request.duration" and labels[0] == ("dynlock.alias", alias)
    )
    assert scraped("dynlock_busy_total", name=name) == 2
    assert scraped("dynlock_lost_total", name=name, reason="broken") == 2


def test_a_trace_the_sampler_drops_has_no_dynlock_span_and_its_measures_are_taken(dynamodb_local_server, settings):
    """Sampled out, an acquire's and a release's spans are not recorded (dynlock skips
    their attributes and events); the measures do not depend on the sampler."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    from django_dynlock.contrib.opentelemetry import DynlockInstrumentor

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    alias = f"obs-{uuid.uuid4().hex[:8]}"
    named = (("dynlock.alias", alias), ("dynlock.name", "drop:{id}"))
    DynlockInstrumentor().instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    try:
        with fresh_table(settings, dynamodb_local_server.endpoint_url) as other:
            client = client_for(dynamodb_local_server.endpoint_url, other.options.table_name, alias=alias)
            try:
                with client.acquire("drop:1", metrics_name="drop:{id}"):
                    pass
                with other.acquire("drop:2"):
                    assert client.try_acquire("drop:2", metrics_name="drop:{id}") is None
            finally:
                client.close()
    finally:
        DynlockInstrumentor().uninstrument()
    assert [span.name for span in exporter.get_finished_spans()] == []
    points = otel_points(reader)
    assert points[("dynlock.acquire.duration", (*named, ("dynlock.outcome", "acquired")))] == ("Histogram", None, 1)
    assert points[("dynlock.acquire.duration", (*named, ("dynlock.outcome", "busy")))] == ("Histogram", None, 1)
    assert points[("dynlock.hold.duration", named)] == ("Histogram", None, 1)
    assert points[("dynlock.busy", named)] == ("Sum", True, 1)
    assert points[("dynlock.held", named)] == ("Sum", False, 0)


def test_a_sampler_that_follows_the_parent_gets_dynlocks_spans_under_a_sampled_parent_only(
    dynamodb_local_server, settings
):
    """With ParentBased(ALWAYS_OFF), dynlock starts no span where the sampler is certain
    to drop it (no parent, or an unsampled one, remote or local); under a sampled parent,
    remote or local, the acquire's and the release's spans are recorded as ever, children
    of that parent, in its trace."""
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    from django_dynlock.contrib.opentelemetry import DynlockInstrumentor

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    # A sampled local parent: a span of this process, recorded (another provider's: its
    # own span is not exported here, only dynlock's are).
    local_sampled = TracerProvider().get_tracer("test").start_span("request")

    def remote(trace_id: int, sampled: bool) -> NonRecordingSpan:
        flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
        return NonRecordingSpan(SpanContext(trace_id, 0xA1B2C3D4E5F6A7B8, is_remote=True, trace_flags=flags))

    parents = {
        "none": None,
        "remote-sampled": remote(0x0123456789ABCDEF0123456789ABCDEF, True),
        "remote-unsampled": remote(0x0123456789ABCDEF0123456789ABCDE0, False),
        "local-sampled": local_sampled,
        "local-unsampled": NonRecordingSpan(
            SpanContext(0x0123456789ABCDEF0123456789ABCDE1, 0xB1B2C3D4E5F6A7B8, is_remote=False)
        ),
    }
    DynlockInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider())
    try:
        with fresh_table(settings, dynamodb_local_server.endpoint_url) as locks:
            for label, parent in parents.items():
                if parent is None:
                    locks.acquire(f"parent:{label}", metrics_name=label).release()
                    continue
                with trace.use_span(parent, end_on_exit=False):
                    locks.acquire(f"parent:{label}", metrics_name=label).release()
    finally:
        DynlockInstrumentor().uninstrument()
        local_sampled.end()
    spans = exporter.get_finished_spans()
    assert sorted((span.attributes["dynlock.name"], span.name) for span in spans) == [
        ("local-sampled", "dynlock.acquire"),
        ("local-sampled", "dynlock.release"),
        ("remote-sampled", "dynlock.acquire"),
        ("remote-sampled", "dynlock.release"),
    ]
    for span in spans:
        parent = parents[span.attributes["dynlock.name"]].get_span_context()
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert span.context.trace_id == parent.trace_id and span.context.trace_flags.sampled
        assert span.attributes["dynlock.outcome"] in ("acquired", "released")


def test_dynlock_knows_what_the_sdks_samplers_drop_and_asks_the_others():
    """What the shortcut of contrib.opentelemetry relies on in the SDK installed: the
    samplers it reads (a change of ParentBased's fields fails here, not silently slower),
    and the ones it leaves to start_span: a ratio at the root, a sampler of the project's,
    and a tracer whose SDK counts every span it starts, dropped ones too."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import (
        ALWAYS_OFF,
        ALWAYS_ON,
        DEFAULT_OFF,
        DEFAULT_ON,
        ParentBased,
        ParentBasedTraceIdRatio,
        TraceIdRatioBased,
    )

    from django_dynlock.contrib.opentelemetry import _drop_rule

    def rule(sampler):
        return _drop_rule(TracerProvider(sampler=sampler).get_tracer("test"))

    # (no parent, remote sampled, remote unsampled, local sampled, local unsampled)
    assert rule(ALWAYS_OFF) == (True,) * 5
    assert rule(DEFAULT_OFF) == rule(ParentBased(ALWAYS_OFF)) == (True, False, True, False, True)
    assert rule(DEFAULT_ON) == (False, False, True, False, True)
    assert rule(ParentBased(TraceIdRatioBased(0.1))) == (False, False, True, False, True)
    assert rule(ParentBased(ALWAYS_OFF, remote_parent_sampled=ALWAYS_OFF)) == (True, True, True, False, True)
    assert rule(ALWAYS_ON) is None  # nothing to skip
    assert rule(TraceIdRatioBased(0.5)) is None
    assert rule(ParentBasedTraceIdRatio(0.5)) is None  # a subclass: its own rules
    assert rule(ParentBased(ALWAYS_OFF, local_parent_sampled=TraceIdRatioBased(0.5))) == (
        True,
        False,
        True,
        False,
        True,
    )
    assert _drop_rule(trace.NoOpTracer()) == (True,) * 5
    assert _drop_rule(object()) is None


def test_an_sdk_that_counts_started_spans_sees_dynlocks_dropped_ones(dynamodb_local_server, settings, monkeypatch):
    """With the SDK's own metrics on (otel.sdk.span.started counts spans dropped by the
    sampler too), dynlock starts its spans as it did before it knew the sampler: the
    count is the same."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    from django_dynlock.contrib.opentelemetry import DynlockInstrumentor, _drop_rule

    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    reader = InMemoryMetricReader()
    tracer_provider = TracerProvider(
        sampler=ParentBased(ALWAYS_OFF), meter_provider=MeterProvider(metric_readers=[reader])
    )
    assert _drop_rule(tracer_provider.get_tracer("django_dynlock")) is None
    DynlockInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider())
    try:
        with fresh_table(settings, dynamodb_local_server.endpoint_url) as locks:
            for _ in range(3):
                locks.acquire("started:1").release()
    finally:
        DynlockInstrumentor().uninstrument()
    started = {
        tuple(sorted(point.attributes.items())): point.value
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "otel.sdk.span.started"
        for point in metric.data.data_points
    }
    assert started == {(("otel.span.parent.origin", "none"), ("otel.span.sampling_result", "DROP")): 6}


def test_a_histograms_exemplars_are_the_trace_its_value_was_measured_in(dynamodb_local_server, settings):
    """Values are handed to the SDK later than measured, in batches, by whichever thread
    fills the batch or collects: each keeps the context it was measured in. A value
    measured in a sampled span has that trace as its exemplar; one measured outside any
    span has none, even when the thread that records it is inside a sampled span."""
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from django_dynlock.contrib.opentelemetry import DynlockInstrumentor

    reader = InMemoryMetricReader()
    tracer = TracerProvider().get_tracer("test")
    alias = f"obs-{uuid.uuid4().hex[:8]}"

    def exemplars() -> dict[str, set[int]]:
        """The trace ids of this alias's histograms' exemplars, by histogram."""
        found: dict[str, set[int]] = {}
        for resource in reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        if dict(point.attributes).get("dynlock.alias") == alias:
                            for exemplar in getattr(point, "exemplars", ()):
                                found.setdefault(metric.name, set()).add(exemplar.trace_id)
        return found

    DynlockInstrumentor().instrument(meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        with fresh_table(settings, dynamodb_local_server.endpoint_url) as other:
            client = client_for(dynamodb_local_server.endpoint_url, other.options.table_name, alias=alias)
            try:
                client.acquire("exemplar:1", metrics_name="exemplar:{n}").release()  # outside any span
                with tracer.start_as_current_span("another request") as elsewhere:
                    outside = exemplars()  # recorded by this thread, in this span
                with tracer.start_as_current_span("request") as request:
                    client.acquire("exemplar:2", metrics_name="exemplar:{n}").release()
                inside = exemplars()  # recorded outside any span
            finally:
                client.close()
    finally:
        DynlockInstrumentor().uninstrument()
    assert outside == {}, f"the recording thread's trace {elsewhere.get_span_context().trace_id:x} as exemplar"
    trace_id = request.get_span_context().trace_id
    assert set(inside) == {"dynlock.acquire.duration", "dynlock.hold.duration", "dynlock.request.duration"}
    assert all(ids == {trace_id} for ids in inside.values()), inside
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_a_child_forked_while_another_thread_measures_a_batch_can_measure_and_collect():
    """A batch being measured by another thread at the fork holds its lock in the child
    too, where that thread does not exist: the child gets a free one, and measures and
    collects (without it, the child's collection waits forever: killed after 10 s)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from django_dynlock.contrib.opentelemetry import OpenTelemetryObserver

    reader = InMemoryMetricReader()
    observer = OpenTelemetryObserver(meter_provider=MeterProvider(metric_readers=[reader]))
    observer.request(alias="fork", op="UpdateItem", outcome="ok", seconds=0.002)
    measuring, forked = threading.Event(), threading.Event()

    def measure_slowly() -> None:
        with observer.counts.flushing:  # as a thread in the middle of a batch
            measuring.set()
            forked.wait(10)

    holder = threading.Thread(target=measure_slowly)
    holder.start()
    try:
        assert measuring.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: collect, then leave without pytest's teardown
            code = 1
            try:
                counted = [
                    amount
                    for (metric, labels), (_, _, amount) in otel_points(reader).items()
                    if metric in ("dynlock.requests", "dynlock.request.duration")
                    and ("dynlock.alias", "fork") in labels
                ]
                code = 0 if counted == [1, 1] else 2
            finally:
                os._exit(code)
        forked.set()
        ended, status = 0, 0
        for _ in range(100):  # bounded: 10 s
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                break
            time.sleep(0.1)
        if not ended:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert ended and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the child's collection never ended"
    finally:
        forked.set()
        holder.join(10)


def test_an_acquire_that_dynamodb_fails_reaches_opentelemetry_as_an_error(dynamodb_local_server, settings):
    """The failed acquire's event is queued without its exception (the batch would keep
    its traceback alive) and measured as an error; each throttled try counted."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from django_dynlock.contrib.opentelemetry import DynlockInstrumentor

    reader = InMemoryMetricReader()
    alias = f"obs-{uuid.uuid4().hex[:8]}"
    named = (("dynlock.alias", alias), ("dynlock.name", "job"))
    DynlockInstrumentor().instrument(meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        with (
            fresh_table(settings, dynamodb_local_server.endpoint_url) as other,
            FaultProxy(dynamodb_local_server.endpoint_url) as proxy,
        ):
            client = client_for(proxy.endpoint_url, other.options.table_name, alias=alias)
            try:
                proxy.add_fault("throttle", times=1000)
                with pytest.raises(BackendError):
                    client.acquire("job:1", wait=0.3)
                stats = proxy.stats
                observer = DynlockInstrumentor()._observer
                assert observer is not None
                queued = [args for _, args, _ in observer.counts.pending]
            finally:
                client.close()
    finally:
        DynlockInstrumentor().uninstrument()
    failed = [args[3] for args in queued if args[0] == "acquire_failed"]
    assert len(failed) == 1 and "error" not in failed[0] and failed[0]["waited"] >= 0.3
    points = otel_points(reader)
    assert points[("dynlock.acquire.duration", (*named, ("dynlock.outcome", "error")))] == ("Histogram", None, 1)
    assert ("dynlock.acquire.duration", (*named, ("dynlock.outcome", "busy"))) not in points
    throttled = sum(
        amount
        for (metric, labels), (_, _, amount) in points.items()
        if metric == "dynlock.requests"
        and ("dynlock.alias", alias) in labels
        and ("dynlock.outcome", "throttled") in labels
    )
    assert stats["throttle"] == stats.requests == throttled >= 2


def test_histogram_values_recorded_in_batches_from_many_threads_are_all_counted(dynamodb_local_server, settings):
    """contrib.opentelemetry takes its measures in batches (every RECORD_EVERY calls from
    the engine, and at each collection): from four threads at once, past several
    batches, each acquire, hold and request is counted once."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from django_dynlock.contrib import opentelemetry as dynlock_otel

    reader = InMemoryMetricReader()
    alias = f"obs-{uuid.uuid4().hex[:8]}"
    named = (("dynlock.alias", alias), ("dynlock.name", "batch:{n}"))
    dynlock_otel.DynlockInstrumentor().instrument(meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        with fresh_table(settings, dynamodb_local_server.endpoint_url) as other:
            client = client_for(dynamodb_local_server.endpoint_url, other.options.table_name, alias=alias)

            def cycles(thread: int) -> None:
                for cycle in range(25):
                    client.acquire(f"batch:{thread}:{cycle}", metrics_name="batch:{n}").release()

            try:
                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(cycles, range(4)))
                middle = otel_points(reader)  # what was pending, recorded by the collection
                with client.acquire("batch:last", metrics_name="batch:{n}"):
                    pass
            finally:
                client.close()
    finally:
        dynlock_otel.DynlockInstrumentor().uninstrument()
    assert 100 * 4 > dynlock_otel.RECORD_EVERY * 2
    assert middle[("dynlock.acquire.duration", (*named, ("dynlock.outcome", "acquired")))][2] == 100
    assert middle[("dynlock.hold.duration", named)][2] == 100
    last = otel_points(reader)
    assert last[("dynlock.acquire.duration", (*named, ("dynlock.outcome", "acquired")))][2] == 101
    assert last[("dynlock.hold.duration", named)][2] == 101
    # Counted up and down in the batches, by one thread at a time, in the order heard.
    assert last[("dynlock.held", named)] == ("Sum", False, 0)
    requests = sum(
        amount
        for (metric, labels), (_, _, amount) in last.items()
        if metric == "dynlock.requests" and labels[0][1] == alias
    )
    timed = sum(
        amount
        for (metric, labels), (_, _, amount) in last.items()
        if metric == "dynlock.request.duration" and labels[0][1] == alias
    )
    assert requests == timed >= 202
