"""Child processes of tests/test_partition_priority.py: a holder and its waiters on one
key, each a process of its own with its own LockClient (spawned by ``python -m``).

Each writes one JSON report when it is done. Every loop is bounded in time.

    python -m tests.support.partition_children holder ENDPOINT TABLE KEY LEASE SECONDS REPORT
    python -m tests.support.partition_children waiter ENDPOINT TABLE KEY WAIT SECONDS REPORT GO_FILE
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from django_dynlock import BackendError, LockLost, LockNotAcquired
from django_dynlock.engine.options import default_heartbeat_period, fitted_client_config
from tests.support.calls import count_calls
from tests.support.clients import client_for


def _client(endpoint: str, table: str, lease: float) -> Any:
    # What an alias with only LEASE_DURATION set gets (conf.py): the heartbeat and the
    # timeouts fitted to the lease.
    return client_for(
        endpoint,
        table,
        lease_duration=lease,
        heartbeat_period=default_heartbeat_period(lease),
        client_config=fitted_client_config(lease),
    )


def holder(endpoint: str, table: str, key: str, lease_seconds: float, seconds: float, report: Path) -> None:
    """Hold ``key`` on a lease of ``lease_seconds`` until the file REPORT.release appears
    (at most ``seconds``); report its events, whether ``is_held`` ever said no, and how
    the release went."""
    client = _client(endpoint, table, lease_seconds)
    events: list[tuple[float, str, str]] = []
    client.add_listener(lambda event, **info: events.append((time.time(), event, str(info.get("error") or ""))))
    result: dict[str, Any] = {}
    try:
        lease = client.acquire(key, wait=10)
        result["token"] = lease.token
        result["acquired"] = time.time()
        Path(str(report) + ".ready").write_text("ready")
        deadline = time.monotonic() + seconds
        release = Path(str(report) + ".release")
        not_held = 0
        while time.monotonic() < deadline and not release.exists():
            not_held += not lease.is_held
            time.sleep(0.01)
        result["not_held"] = not_held
        result["released"] = time.time()
        try:
            lease.release()
            result["release"] = "ok"
        except LockLost as lost:
            result["release"] = f"lost: {lost}"
    finally:
        client.close()
        result["events"] = events
        report.write_text(json.dumps(result))


def waiter(endpoint: str, table: str, key: str, wait: float, seconds: float, report: Path, start: str) -> None:
    """Once the file ``start`` appears (REPORT.ready says we wait for it), for ``seconds``:
    ``acquire(key, wait=wait)`` over and over, as a task or a view that waits a little
    and is tried again. Counts the requests it sends and what each call ended with."""
    client = _client(endpoint, table, 30.0)
    outcomes: dict[str, int] = {}
    tokens: list[int] = []
    try:
        client.acquire(f"{key}-warm-{os.getpid()}").release()  # the boto3 client is built, DynamoDB's clock known
        Path(str(report) + ".ready").write_text("ready")
        go = Path(start)
        deadline = time.monotonic() + 120
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with count_calls(client) as calls:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    lease = client.acquire(key, wait=wait)
                except LockNotAcquired:
                    outcomes["busy"] = outcomes.get("busy", 0) + 1
                except BackendError:
                    outcomes["error"] = outcomes.get("error", 0) + 1
                else:
                    outcomes["acquired"] = outcomes.get("acquired", 0) + 1
                    tokens.append(lease.token)
                    lease.release()
    finally:
        client.close()
    report.write_text(json.dumps({"outcomes": outcomes, "calls": dict(calls), "tokens": tokens}))


if __name__ == "__main__":
    role, endpoint, table, key = sys.argv[1:5]
    if role == "holder":
        holder(endpoint, table, key, float(sys.argv[5]), float(sys.argv[6]), Path(sys.argv[7]))
    elif role == "waiter":
        waiter(endpoint, table, key, float(sys.argv[5]), float(sys.argv[6]), Path(sys.argv[7]), sys.argv[8])
    else:
        raise SystemExit(f"unknown role {role!r}: holder or waiter")
