"""``python -m tests.support.semaphore_child SPEC OUT``: one process taking slots of semaphores.

SPEC is JSON: endpoint, table, keys ([[key, limit], ...], one picked at random per
section; on SemaphoreConflict the process goes on with the stored limit, as after a
rolling deploy), timeout (a request's, through a fault proxy), lease, hold (seconds a section lasts), go (a file whose JSON, once there,
says the seconds to run for), clock_offset (seconds this process' wall clock is off),
seed. Each record goes to OUT as one JSON line as it happens, so that a process
killed with SIGKILL leaves its history behind:

- ``{"t": "acq", "key", "slot", "token", "start"}``: a slot acquired (true wall time);
- ``{"t": "valid", "token", "until"}``: the holder's validity, whenever it moves on;
- ``{"t": "end", "token", "end"}``: the holder stops trusting its lease: it releases,
  or its validity ran out first.

Every loop is bounded in count and time.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from django_dynlock.exceptions import DynLockError, LockNotAcquired, SemaphoreConflict
from tests.support.clients import client_for
from tests.support.wallclock import shift_wall_clock, true_wall

MAX_SECTIONS = 10_000
READY_TIMEOUT = 120.0
STEP = 0.02  # seconds between looks at the holder's validity


def main(spec_json: str, out: str) -> None:
    spec = json.loads(spec_json)
    shift_wall_clock(spec.get("clock_offset", 0.0))
    rng = random.Random(spec.get("seed", 0))
    extra = {}
    if spec.get("timeout"):  # through a fault proxy: a delayed reply is a timeout, tried once
        extra["client_config"] = {
            "connect_timeout": spec["timeout"],
            "read_timeout": spec["timeout"],
            "retries": {"total_max_attempts": 1, "mode": "standard"},
        }
    client = client_for(
        spec["endpoint"], spec["table"], lease_duration=spec["lease"], heartbeat_period=spec["lease"] / 4, **extra
    )
    limits = {key: limit for key, limit in spec["keys"]}
    with open(out, "a", buffering=1) as file:

        def write(record: dict) -> None:
            file.write(json.dumps(record) + "\n")

        client.get(spec["keys"][0][0])  # connected before the start: a slow start-up is no slow acquire
        write({"t": "ready", "pid": os.getpid()})
        go = Path(spec["go"])
        waited_until = time.monotonic() + READY_TIMEOUT
        while not go.exists() and time.monotonic() < waited_until:
            time.sleep(0.01)
        until = true_wall() + json.loads(go.read_text())["seconds"]
        for _ in range(MAX_SECTIONS):
            left = until - true_wall()
            if left <= 0:
                break
            key = rng.choice(sorted(limits))
            limit = limits[key]
            try:
                lease = client.acquire(key, limit=limit, wait=min(left, 5.0))
            except LockNotAcquired:
                continue
            except SemaphoreConflict as exc:
                # A rolling deploy of a new limit: this process now runs with the stored one.
                write({"t": "conflict", "key": key, "limit": limit, "stored": exc.stored_limit, "at": true_wall()})
                limits[key] = exc.stored_limit
                continue
            except DynLockError as exc:
                write({"t": "error", "error": repr(exc)})
                time.sleep(0.1)
                continue
            got = true_wall()
            start = true_wall(lease.acquired_monotonic)
            write(
                {
                    "t": "acq",
                    "key": key,
                    "slot": lease.slot,
                    "token": lease.token,
                    "start": start,
                    "got": got,
                    "limit": limit,
                }
            )
            shown = lease.valid_until
            write({"t": "valid", "token": lease.token, "until": true_wall(shown)})
            ends = time.monotonic() + spec["hold"] * rng.uniform(0.5, 1.5)
            while time.monotonic() < ends and lease.is_held:
                time.sleep(STEP)
                if lease.valid_until != shown:
                    shown = lease.valid_until
                    write({"t": "valid", "token": lease.token, "until": true_wall(shown)})
            end = min(time.monotonic(), lease.valid_until)
            write({"t": "end", "token": lease.token, "end": true_wall(end)})
            try:
                lease.release()
            except DynLockError:
                pass
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
