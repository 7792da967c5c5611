"""Code that runs in child processes of the multi-process tests (spawned, not forked).

Each child builds its own LockClient from plain options: exactly what another host
would do. Every loop is bounded.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from localdynamo.servers import DUMMY_REGION
from tests.support.clients import OPTIONS, client_for


def critical_sections(endpoint_url: str, table: str, counter: str, rounds: int, hold: float) -> list[tuple]:
    """Increment a counter file non-atomically under the lock; return (token, start, end) per section."""
    client = client_for(endpoint_url, table)
    history = []
    try:
        for _ in range(rounds):
            with client.acquire("counter", wait=60) as lease:
                start = time.time()
                value = int(Path(counter).read_text() or 0)
                time.sleep(hold)  # the window in which a second holder would lose an update
                lease.raise_if_lost()
                Path(counter).write_text(str(value + 1))
                history.append((lease.token, start, time.time()))
    finally:
        client.close()
    return history


def hold_and_report(endpoint_url: str, table: str, lease_seconds: float, report: str, seconds: float) -> None:
    """Hold one lease and write a line every 10 ms saying whether we believe we hold it."""
    client = client_for(endpoint_url, table, lease_duration=lease_seconds, heartbeat_period=lease_seconds / 4)
    lease = client.acquire("victim", wait=10)
    with open(report, "a", buffering=1) as out:
        out.write(f"ACQUIRED {lease.token}\n")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            # The check a careful holder makes just before each side effect.
            out.write(f"{'HELD' if lease.is_held else 'LOST'} {time.time():.6f}\n")
            time.sleep(0.01)
    os._exit(0)


def decorated_sections(endpoint_url: str, table: str, counter: str, rounds: int) -> list[tuple]:
    """The same non-atomic counter, guarded by @dynamo_lock in a Django process."""
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    django.setup()
    from django.conf import settings

    from django_dynlock import dynamo_lock, get_lock_client

    settings.DYNLOCK = {
        "default": {
            "ENDPOINT_URL": endpoint_url,
            "TABLE_NAME": table,
            "LEASE_DURATION": 5.0,
            "HEARTBEAT_PERIOD": 1.0,
            "WAIT_TIMEOUT": 60.0,
            "REGION_NAME": DUMMY_REGION,
            "SESSION_OPTIONS": OPTIONS["session_options"],
        }
    }

    @dynamo_lock("counter:{name}")
    def increment(name: str) -> tuple:
        start = time.time()
        value = int(Path(counter).read_text() or 0)
        time.sleep(0.005)
        Path(counter).write_text(str(value + 1))
        return (dynamo_lock.current().token, start, time.time())

    try:
        return [increment("shared") for _ in range(rounds)]
    finally:
        get_lock_client().close()


def fenced_write_after_pause(endpoint_url: str, table: str, report: str) -> None:
    """Acquire, stall (the parent SIGSTOPs us past the lease), then write DynamoDB data
    in a transaction guarded by the lease's ConditionCheck, without looking at is_held."""
    from botocore.exceptions import ClientError

    client = client_for(endpoint_url, table, lease_duration=1.5, heartbeat_period=0.5)
    lease = client.acquire("fenced", wait=10)
    Path(report).write_text(f"ACQUIRED {lease.token}\n")
    deadline = time.monotonic() + 30
    while not Path(report + ".go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    data = {"TableName": table, "Item": {"key": {"S": "data:invoice"}, "value": {"S": "stale"}}}
    try:
        client.boto.transact_write_items(TransactItems=[lease.condition_check(), {"Put": data}])
        outcome = "APPLIED"
    except ClientError as exc:
        outcome = exc.response["Error"]["Code"]
    with open(report, "a") as out:
        out.write(f"{outcome}\n")
    os._exit(0)


def hold_then_release(endpoint_url: str, table: str, key: str, report: str, seconds: float) -> None:
    """Hold ``key`` with the default lease (renewed by the heartbeat) for ``seconds``, then
    release it; report when it acquired and when it began to release (wall clock, to
    compare across processes)."""
    client = client_for(endpoint_url, table, lease_duration=30.0, heartbeat_period=10.0)
    lease = client.acquire(key, wait=10)
    with open(report, "a", buffering=1) as out:
        out.write(f"ACQUIRED {time.time():.6f}\n")
        time.sleep(seconds)
        out.write(f"RELEASING {time.time():.6f}\n")
        lease.release()
    client.close()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "fenced":
        fenced_write_after_pause(*sys.argv[2:5])
    if sys.argv[1] == "hold":
        hold_then_release(*sys.argv[2:6], float(sys.argv[6]))
    hold_and_report(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
