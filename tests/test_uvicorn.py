"""Async decorated views under a real uvicorn (1 worker): 423 with Retry-After when the key
is busy, 503 with Retry-After and a log line when DynamoDB is paused, failing or throttling.

The site (tests/sites/uvicorn_site.py) reaches DynamoDB through a fault proxy; the test's
own lock client goes straight to the server.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import REPO_ROOT, free_port
from tests.support.polling import wait_for
from tests.support.tables import fresh_table


def get(url: str, timeout: float = 10.0) -> tuple[int, str | None]:
    """The status and the Retry-After header."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.headers.get("Retry-After")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Retry-After")


@pytest.fixture
def site(server, settings, tmp_path):
    with (
        fresh_table(settings, server.endpoint_url) as client,
        FaultProxy(server.endpoint_url, max_seconds=120) as proxy,
    ):
        port = free_port()
        env = dict(
            os.environ,
            DJANGO_SETTINGS_MODULE="tests.sites.uvicorn_site",
            SITE_ENDPOINT_URL=proxy.endpoint_url,
            SITE_TABLE=client.options.table_name,
            PYTHONPATH=str(REPO_ROOT),
        )
        log_path = tmp_path / "uvicorn.log"
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--workers", "1", "--host", "127.0.0.1", "--port", str(port)]
                + ["--no-access-log", "tests.sites.uvicorn_site:application"],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return get(f"{base}/try/99/", timeout=2)[0] == 200
            except OSError:
                return False

        try:
            wait_for(up, 60, "uvicorn to serve")
            yield base, proxy, client, log_path
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(20)


def test_a_busy_async_view_answers_423_with_retry_after(site):
    base, proxy, client, _ = site
    held = client.acquire("event:1", lease=8)
    try:
        status, retry_after = get(f"{base}/try/1/")
        assert status == 423 and retry_after is not None and 1 <= int(retry_after) <= 8
    finally:
        held.release()
    assert get(f"{base}/try/1/")[0] == 200


def test_dynamodb_in_trouble_makes_an_async_view_answer_503_with_retry_after(site):
    base, proxy, client, log_path = site
    for kind, retry_after in [("paused", "5"), ("http500", "5"), ("throttle", "1")]:
        if kind == "paused":
            proxy.pause()
        else:
            proxy.set_rates({kind: 1.0})
        assert get(f"{base}/try/2/") == (503, retry_after), kind
        assert get(f"{base}/hold/2/?seconds=0") == (503, retry_after), kind  # a waiting view alike
        proxy.resume()
        proxy.set_rates({})
        assert get(f"{base}/try/2/")[0] == 200
    logged = [line for line in log_path.read_text().splitlines() if "answered 503" in line]
    assert len(logged) == 6 and "uvicorn_site.try_book" in logged[0] and "uvicorn_site.hold" in logged[1]
    assert "Traceback" not in log_path.read_text()


def test_requests_on_a_key_another_request_of_the_process_holds_get_an_estimated_retry_after(site):
    # issue 35: under one uvicorn process, 50 requests on a key held 50 ms answered
    # Retry-After: 30 (the whole lease); a holder in another process got the estimate.
    base, _, client, _ = site
    sent = time.monotonic()
    holding = threading.Thread(target=lambda: get(f"{base}/hold/3/?seconds=3"))
    holding.start()
    try:
        wait_for(lambda: client.get("event:3") is not None, 10, "the site to hold event:3")
        replies: list[tuple[int, str | None, float]] = []

        def busy() -> None:
            status, retry_after = get(f"{base}/try/3/")
            replies.append((status, retry_after, time.monotonic() - sent))

        requests = [threading.Thread(target=busy) for _ in range(50)]
        for request in requests:
            request.start()
        for request in requests:
            request.join(20)
    finally:
        holding.join(20)
    assert len(replies) == 50 and all(status == 423 for status, _, _ in replies), replies
    # As long again as the key had been held when refused: at most the time since the
    # holding request was sent, rounded up to a whole second.
    late = [
        (retry_after, after)
        for _, retry_after, after in replies
        if retry_after is None or not 1 <= int(retry_after) <= max(1, math.ceil(after))
    ]
    assert not late, late
