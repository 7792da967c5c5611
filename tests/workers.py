"""Code that runs in child processes of the multi-process tests (spawned, not forked).

Each child builds its own LockClient from plain options: exactly what another host
would do. Every loop is bounded.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from django_dynlock.engine import ClientOptions, LockClient
from django_dynlock.engine.options import merge_client_config

OPTIONS = dict(region_name="us-east-1", session_options={"aws_access_key_id": "testing", "aws_secret_access_key": "testing"})


def client_for(endpoint_url: str, table: str, **extra) -> LockClient:
    options = {"lease_duration": 5.0, "heartbeat_period": 1.0, **OPTIONS, **extra}
    options["client_config"] = merge_client_config(options.get("client_config"))
    return LockClient(ClientOptions(endpoint_url=endpoint_url, table_name=table, **options))


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


if __name__ == "__main__":
    hold_and_report(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
