"""Code that runs in the child processes of the reliability scenarios (spawned).

Each child is one "host": it builds its own LockClient from plain options (no Django)
and talks to DynamoDB through its own endpoint, usually a FaultProxy run by the test
process. Everything it observes goes to its own JSON-lines file, one line per record,
written as it happens so that a child killed with SIGKILL leaves its history behind:

- ``{"type": "section", ...}``: one critical section (see ``history.Section``);
- ``{"type": "event", "event": "at_risk" | "recovered" | "lost", ...}``: lease events;
- ``{"type": "begin", ...}``: a victim entered its section (crash and pause scenarios);
- ``{"type": "stats", ...}``: counts, written when the worker stops.

Every loop is bounded in count and in time.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django_dynlock.exceptions import DynLockError, LockLost, LockNotAcquired
from tests.reliability.history import Section
from tests.support.clients import client_for
from tests.support.wallclock import shift_wall_clock, true_wall

READY_TIMEOUT = 120.0  # seconds a child waits for the go signal


@dataclass(frozen=True)
class Plan:
    """What one worker process does. Picklable: it crosses the spawn boundary."""

    name: str
    endpoint_url: str
    table: str
    keys: tuple[str, ...]
    counter_dir: str
    out: str
    hold: float = 0.005  # seconds between reading and writing the counter
    lease: float = 4.0
    heartbeat: float = 1.0
    wait: float = 30.0
    connect_timeout: float = 0.5
    read_timeout: float = 0.25
    max_sections: int = 100_000
    max_seconds: float = 120.0
    clock_offset: float = 0.0  # seconds added to this process' wall clock
    seed: int = 0
    announce: bool = False  # write a "begin" record as each section starts
    extra: dict[str, Any] = field(default_factory=dict)  # more ClientOptions fields

    def client(self):
        config = {
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "retries": {"total_max_attempts": 1, "mode": "standard"},
        }
        return client_for(
            self.endpoint_url,
            self.table,
            lease_duration=self.lease,
            heartbeat_period=self.heartbeat,
            client_config=config,
            **self.extra,
        )


class Recorder:
    """Thread-safe, line-buffered JSON-lines writer (the heartbeat thread writes events)."""

    def __init__(self, path: str):
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any] | str) -> None:
        line = record if isinstance(record, str) else json.dumps(record)
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def listener_for(recorder: Recorder, worker: str):
    def on_event(event: str, lease=None, **info: Any) -> None:
        if event not in ("at_risk", "recovered", "lost") or lease is None:
            return
        recorder.write(
            {
                "type": "event",
                "event": event,
                "worker": worker,
                "key": lease.key,
                "token": lease.token,
                "t": true_wall(),
                "m": time.monotonic(),
                "valid_until": lease.valid_until,
                "valid_until_wall": true_wall(lease.valid_until),
                "lease_seconds": lease.lease_seconds,
                "reason": info.get("reason"),
                "error": type(info["error"]).__name__ if info.get("error") else None,
            }
        )

    return on_event


def counter_path(counter_dir: str, key: str) -> Path:
    return Path(counter_dir) / key.replace("/", "_").replace(":", "_")


def read_counter(path: Path) -> int:
    text = path.read_text() if path.exists() else ""
    return int(text) if text else 0


def write_counter(path: Path, value: int, worker: str) -> None:
    # Atomic replace: a reader sees the old or the new value, never a torn file.
    tmp = path.with_name(f".{path.name}.{worker}.tmp")
    tmp.write_text(str(value))
    os.replace(tmp, path)


def log_to_file(plan: Plan) -> None:
    """The engine's log lines (warnings: lost leases, failed releases) go to ``<out>.log``."""
    import logging

    handler = logging.FileHandler(plan.out + ".log")
    handler.setFormatter(logging.Formatter("%(created).6f %(levelname)s %(message)s"))
    logger = logging.getLogger("django_dynlock")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def run_sections(plan: Plan, go: Any, stop: Any) -> None:
    """Critical sections on random keys of ``plan.keys`` until ``stop`` or a bound."""
    log_to_file(plan)
    shift_wall_clock(plan.clock_offset)
    rng = random.Random(plan.seed)
    recorder = Recorder(plan.out)
    client = plan.client()
    client.add_listener(listener_for(recorder, plan.name))
    stats: Counter[str] = Counter()
    client.boto  # noqa: B018 (builds the boto3 client before the start line)
    Path(plan.out + ".ready").touch()
    try:
        if not go.wait(READY_TIMEOUT):
            return
        deadline = time.monotonic() + plan.max_seconds
        while not stop.is_set() and time.monotonic() < deadline and stats["sections"] < plan.max_sections:
            one_section(plan, client, rng.choice(plan.keys), recorder, stats)
    finally:
        client.close()
        recorder.write({"type": "stats", "worker": plan.name, **stats})
        recorder.close()


def one_section(plan: Plan, client: Any, key: str, recorder: Recorder, stats: Counter) -> None:
    try:
        lease = client.acquire(key, wait=plan.wait)
    except LockNotAcquired:
        stats["busy"] += 1
        return
    except DynLockError as exc:
        stats[f"acquire_error:{type(exc).__name__}"] += 1
        time.sleep(0.05)
        return
    start = true_wall()
    stats["sections"] += 1
    if plan.announce:
        recorder.write({"type": "begin", "worker": plan.name, "key": key, "token": lease.token, "start": start})
    path = counter_path(plan.counter_dir, key)
    value = read_counter(path)
    time.sleep(plan.hold)  # the window in which a second holder would lose an update
    try:
        lease.raise_if_lost()
    except LockLost as lost:
        end = min(true_wall(), true_wall(lease.valid_until))
        stats["lost"] += 1
        recorder.write(
            Section(
                key, lease.token, start, end, wrote=False, read=value, worker=plan.name, lost_reason=lost.reason
            ).to_json()
        )
        release(lease, stats)
        return
    write_counter(path, value + 1, plan.name)
    end = true_wall()
    stats["wrote"] += 1
    recorder.write(Section(key, lease.token, start, end, wrote=True, read=value, worker=plan.name).to_json())
    release(lease, stats)


def release(lease: Any, stats: Counter) -> None:
    """Release, counting what went wrong (LockLost is documented; other errors are not)."""
    try:
        lease.release()
    except LockLost as exc:
        stats[f"release_lost:{exc.reason}"] += 1
    except DynLockError as exc:
        stats[f"release_error:{type(exc).__name__}"] += 1


def victim(plan: Plan) -> None:
    """Acquire ``plan.keys[0]``, read its counter, say so, then wait for ``<out>.go``.

    The test kills it (SIGKILL) or stops it (SIGSTOP) while it waits. If it lives on,
    it checks its lease before writing, like every other section.
    """
    log_to_file(plan)
    shift_wall_clock(plan.clock_offset)
    recorder = Recorder(plan.out)
    client = plan.client()
    client.add_listener(listener_for(recorder, plan.name))
    key = plan.keys[0]
    lease = client.acquire(key, wait=plan.wait)
    start = true_wall()
    path = counter_path(plan.counter_dir, key)
    value = read_counter(path)
    recorder.write(
        {
            "type": "begin",
            "worker": plan.name,
            "key": key,
            "token": lease.token,
            "start": start,
            "read": value,
            "valid_until_wall": true_wall(lease.valid_until),
        }
    )
    go = Path(plan.out + ".go")
    deadline = time.monotonic() + plan.max_seconds
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        lease.raise_if_lost()
    except LockLost as lost:
        end = min(true_wall(), true_wall(lease.valid_until))
        recorder.write(
            Section(
                key, lease.token, start, end, wrote=False, read=value, worker=plan.name, lost_reason=lost.reason
            ).to_json()
        )
    else:
        write_counter(path, value + 1, plan.name)
        recorder.write(
            Section(key, lease.token, start, true_wall(), wrote=True, read=value, worker=plan.name).to_json()
        )
    recorder.close()
    client.close()


def believe_and_report(plan: Plan, report: str, seconds: float) -> None:
    """Hold ``plan.keys[0]`` and write, every 5 ms, the real wall time and whether
    this holder believes it holds the lock (what a careful holder checks before each
    side effect). Used by the clock-skew scenarios."""
    log_to_file(plan)
    shift_wall_clock(plan.clock_offset)
    client = plan.client()
    recorder = Recorder(plan.out)
    client.add_listener(listener_for(recorder, plan.name))
    lease = client.acquire(plan.keys[0], wait=plan.wait)
    with open(report, "a", buffering=1) as out:
        out.write(f"ACQUIRED {lease.token} {true_wall():.6f}\n")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            held = lease.is_held
            out.write(f"{'HELD' if held else 'LOST'} {true_wall():.6f}\n")
            if not held:
                break
            time.sleep(0.005)
    recorder.close()
    client.close()
