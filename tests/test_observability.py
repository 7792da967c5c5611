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
from django_dynlock.exceptions import LockLost
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
