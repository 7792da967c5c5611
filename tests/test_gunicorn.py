"""The report behind "no stuck keys", as a test: a Django site under gunicorn (4 workers),
a view decorated ``@dynamo_lock("event:{event_id}", wait=10)``, default settings but a
short lease, and the worker that holds ``event:1`` killed with SIGKILL (a deploy, an OOM
kill). The next request gets the key within lease + 3 s of the dead worker's last write,
and so does a ``wait=0`` view tried every 0.2 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from localdynamo.servers import REPO_ROOT, dummy_client, free_port
from tests.support.polling import wait_for
from tests.support.tables import fresh_table

pytestmark = pytest.mark.slow

LEASE = 3.0
BOUND = LEASE + 3.0


def get(url: str, timeout: float = 30.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, {"retry_after": error.headers.get("Retry-After")}


class Watcher(threading.Thread):
    """Reads the lock item every 20 ms and notes, per holder pid, when it last saw that
    holder write (a new record version): at most one read after the write itself."""

    def __init__(self, endpoint: str, table: str):
        super().__init__(daemon=True)
        self.boto = dummy_client(endpoint)
        self.table = table
        self.item: dict = {}
        self.last_write: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        rvn = None
        while not self.stop.wait(0.02):
            item = self.boto.get_item(TableName=self.table, Key={"key": {"S": "event:1"}}, ConsistentRead=True).get(
                "Item", {}
            )
            if item.get("rvn") != rvn and "owner" in item:
                self.last_write[int(item["pid"]["N"])] = time.time()
            rvn = item.get("rvn")
            self.item = item


@pytest.fixture
def site(server, settings, tmp_path):
    with fresh_table(settings, server.endpoint_url) as client:
        yield from serve_site(server, client.options.table_name, tmp_path)


def serve_site(server, table: str, tmp_path):
    port = free_port()
    # the suite's environment (dummy credentials, or the endpoint's under DYNLOCK_TEST_ENDPOINT)
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.sites.gunicorn_site",
        SITE_ENDPOINT_URL=server.endpoint_url,
        SITE_TABLE=table,
        SITE_LEASE=str(LEASE),
        PYTHONPATH=str(REPO_ROOT),
    )
    log = open(tmp_path / "gunicorn.log", "w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--workers",
            "4",
            "--bind",
            f"127.0.0.1:{port}",
            "--timeout",
            "120",
            "tests.sites.gunicorn_site:application",
        ],
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
        wait_for(up, 60, "gunicorn to serve")
        yield base, server.endpoint_url, table
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)
        log.close()


def hold(url: str) -> None:
    try:
        get(url, timeout=120)
    except OSError:
        pass  # its worker is killed: the connection drops


@pytest.mark.parametrize("view", ["book", "try"], ids=["wait-10", "wait-0-every-200ms"])
def test_a_killed_workers_key_is_free_for_the_next_request_within_lease_plus_3s(site, view):
    base, endpoint, table = site
    watcher = Watcher(endpoint, table)
    watcher.start()
    holding = threading.Thread(target=hold, args=(f"{base}/hold/1/?seconds=100",), daemon=True)
    holding.start()
    try:
        wait_for(lambda: "owner" in watcher.item, 30, "a worker to hold event:1")
        worker = int(watcher.item["pid"]["N"])
        status, reply = get(f"{base}/try/1/")
        assert status == 423 and reply["retry_after"], "the live holder's key must be busy"
        time.sleep(LEASE / 2)  # let it renew: the bound counts from its last write
        os.kill(worker, signal.SIGKILL)
        for _ in range(200):
            status, reply = get(f"{base}/{view}/1/")
            if status == 200:
                break
            assert status == 423
            time.sleep(0.2)
        taken = time.time()
        assert status == 200 and reply["pid"] != worker
        after = taken - watcher.last_write[worker]
        print(f"\n{view}: served {after:.2f}s after the dead worker's last write (lease {LEASE}s)")
        assert after <= BOUND
    finally:
        watcher.stop.set()
