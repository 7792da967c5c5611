"""Benchmark of the lease engine against local DynamoDB servers (moto, dynalite).

Run from the repository root::

    python -m bench.engine                 # full run, about 2-3 minutes (bounded by --budget)
    python -m bench.engine --quick         # about 1 minute
    python -m bench.engine --servers dynalite --hold 20

For each server, in one run, it measures:

1. API calls per uncontended acquire+release and per failed try_acquire (botocore
   ``before-call`` hook).
2. Uncontended acquire+release cycles/s with 1 and 8 threads, against a raw boto3
   floor: the same two conditional UpdateItems written by hand, same botocore
   config. Library and floor rounds alternate (ABBA order); medians and their ratio.
3. Handoff latency: a holder process releases, a waiter process blocked in
   ``acquire(wait=...)`` gets the lock. Latency = waiter's time.time() when acquire
   returns minus holder's time.time() just before ``release()``.
4. Contended throughput: N processes loop acquire -> sleep(hold) -> release on one
   key for a fixed window, vs the physical limit 1 / (hold + 2 x median UpdateItem
   round trip) measured in the same run.

It prints a markdown table, writes the raw results as JSON to
``bench/results/engine-<timestamp>.json`` and a plot to ``docs/img/bench-engine.png``.
Everything talks to 127.0.0.1 only; every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import multiprocessing
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django_dynlock.engine import ClientOptions, LockClient
from django_dynlock.engine.items import EMPTY_RING, RING, release_slot, ring_index
from django_dynlock.engine.options import merge_client_config
from django_dynlock.exceptions import LockNotAcquired

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
DEFAULT_PLOT = REPO_ROOT / "docs" / "img" / "bench-engine.png"

TABLE = "dynlock_bench"
REGION = "us-east-1"
SESSION_OPTIONS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
LEASE_DURATION = 10.0
HEARTBEAT_PERIOD = 2.0

# Targets from the issue.
TARGET_CALLS = 2
TARGET_UNCONTENDED_RATIO = 0.85
TARGET_HANDOFF_P50_MS = 30.0
TARGET_CONTENDED_RATIO = 0.85

CHILD_REPLY_TIMEOUT = 30.0  # seconds the orchestrator waits for any one child message
CHILD_START_TIMEOUT = 90.0  # spawned children import boto3: slow on 2 busy cores


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Plan:
    mode: str
    rounds: int  # library rounds (and as many floor rounds), alternating
    round_seconds: float  # target length of one round (sets N from a calibration)
    round_cap: float  # hard time cap of one round
    threads: tuple[int, ...]
    rtt_calls: int
    handoff_samples: int
    handoff_hold: tuple[float, float]  # the holder keeps the lock U(a, b) s after the waiter starts waiting
    handoff_cap: float
    procs: int
    hold: float  # critical section, seconds
    window: float  # contended window, seconds
    budget: float  # whole run; phases that would start after it are skipped
    client_extra: dict  # ClientOptions overrides for every client (e.g. max_retry_delay)


def make_plan(args: argparse.Namespace) -> Plan:
    quick = args.quick
    return Plan(
        mode="quick" if quick else "full",
        rounds=args.rounds or (3 if quick else 7),
        round_seconds=0.4 if quick else 1.0,
        round_cap=2.0 if quick else 4.0,
        threads=(1, 8),
        rtt_calls=100 if quick else 200,
        handoff_samples=args.samples or (30 if quick else 100),
        handoff_hold=(0.1, 0.2),
        handoff_cap=40.0 if quick else 90.0,
        procs=args.procs,
        hold=args.hold / 1000.0,
        window=args.window or (4.0 if quick else 10.0),
        budget=args.budget or (100.0 if quick else 330.0),
        client_extra={
            name: value / 1000.0
            for name, value in (("min_retry_delay", args.min_retry_delay), ("max_retry_delay", args.max_retry_delay))
            if value is not None
        },
    )


# -- small helpers ---------------------------------------------------------------


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: list[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def make_client(endpoint_url: str, **extra: Any) -> LockClient:
    options = dict(
        endpoint_url=endpoint_url,
        table_name=TABLE,
        region_name=REGION,
        session_options=dict(SESSION_OPTIONS),
        lease_duration=LEASE_DURATION,
        heartbeat_period=HEARTBEAT_PERIOD,
        client_config=merge_client_config(None),
    )
    options.update(extra)
    return LockClient(ClientOptions(**options))


class CallCounter:
    """Counts API calls (``before-call``) by operation, and HTTP requests (``before-send``)."""

    def __init__(self, boto: Any):
        self.calls: collections.Counter[str] = collections.Counter()
        self.requests = 0
        self._lock = threading.Lock()
        self._boto = boto
        self._id = f"bench-{uuid.uuid4().hex[:8]}"
        boto.meta.events.register("before-call.dynamodb", self._on_call, unique_id=self._id + "-call")
        boto.meta.events.register("before-send.dynamodb", self._on_send, unique_id=self._id + "-send")

    def _on_call(self, model: Any, **_: Any) -> None:
        with self._lock:
            self.calls[model.name] += 1

    def _on_send(self, **_: Any) -> None:
        with self._lock:
            self.requests += 1

    def take(self) -> tuple[dict[str, int], int]:
        with self._lock:
            calls, requests = dict(self.calls), self.requests
            self.calls.clear()
            self.requests = 0
        return calls, requests

    def close(self) -> None:
        self._boto.meta.events.unregister("before-call.dynamodb", unique_id=self._id + "-call")
        self._boto.meta.events.unregister("before-send.dynamodb", unique_id=self._id + "-send")


def quiet_engine_logs() -> None:
    logging.getLogger("django_dynlock").setLevel(logging.ERROR)


class LogCollector(logging.Handler):
    """Keeps the engine's warnings (e.g. 'no item on a failed condition') for the report."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = f"{record.levelname}: {record.getMessage()}"
        if message not in self.messages and len(self.messages) < 50:
            self.messages.append(message)


# -- the raw boto3 floor ---------------------------------------------------------


class Floor:
    """The two conditional UpdateItems of an acquire+release, written by hand with boto3.

    Same item layout and expressions as the engine's (so the server does the same
    work), same botocore config, nothing else: no gates, no heartbeat, no Lease.
    Kept in step with ``LockClient._acquire_request`` and ``_release_remote``;
    ``python -m bench`` checks that they still match (``engine_requests_match``).
    """

    ACQUIRE_EXPRESSION = (
        "SET #owner = :me, #rvn = :rvn, #seq = :seq, #lease_ms = :lease_ms, #expires_at = :expires, "
        "#acquired_at = :now, #host = :host, #pid = :pid, #thread = :thread, #holder = :holder, "
        "#gc = :gc, #fence = if_not_exists(#fence, :base) + :one, #ring = if_not_exists(#ring, :ring0) "
        "REMOVE #released_at, #reserved_by"
    )
    # A free key, unless this acquisition was already released (the engine's guard
    # against a delayed duplicate of an acquire landing after its release) or another
    # waiter has reserved the next turn (and not let it lapse); our own earlier attempt;
    # or a holder whose expiry passed by DynamoDB's clock. The engine's steady state: a
    # client that knows DynamoDB's clock from an earlier reply.
    ACQUIRE_CONDITION = (
        "(attribute_not_exists(#owner) AND (attribute_not_exists(#slot) OR NOT contains(#slot, :tag))"
        " AND (attribute_not_exists(#ring) OR NOT contains(#ring, :tag))"
        " AND (attribute_not_exists(#reserved_by) OR #reserved_by = :me OR #released_at < :lapsed))"
        " OR (#owner = :me AND #seq < :seq) OR (attribute_exists(#owner) AND #expires_at < :earliest)"
    )
    RELEASE_EXPRESSION = (
        "SET #released_at = :now, #released_by = :me, #slot = :tag, #ring[{ring}] = :tag, #gc = :gc, #rvn = :rvn "
        "REMOVE #owner"
    )  # {ring}: the index of the lease's fence in the release ring (items.ring_index)
    RELEASE_CONDITION = "#owner = :me"

    def __init__(self, endpoint_url: str, client_config: Any):
        import boto3

        session = boto3.session.Session(**SESSION_OPTIONS)
        self.boto = session.client("dynamodb", endpoint_url=endpoint_url, region_name=REGION, config=client_config)
        self.host = socket.gethostname()
        self.pid = str(os.getpid())
        self.acquire_names = {
            f"#{n}": n
            for n in (
                "owner",
                "rvn",
                "seq",
                "fence",
                "lease_ms",
                "expires_at",
                "acquired_at",
                "host",
                "pid",
                "thread",
                "holder",
                "released_at",
                "reserved_by",
            )
        }
        self.acquire_names["#gc"] = "gc_at"
        self.acquire_names["#ring"] = RING
        self.release_names = {f"#{n}": n for n in ("owner", "rvn", "released_at", "released_by")}
        self.release_names["#gc"] = "gc_at"
        self.release_names["#ring"] = RING
        self.lease_ms = str(int(LEASE_DURATION * 1000))

    def acquire(self, key: str, condition: str | None = None, update: str | None = None) -> tuple[str, str]:
        """The engine's acquire; ``condition`` or ``update`` replace its expressions (to
        measure what a part of them costs the server)."""
        now = time.time()
        owner = uuid.uuid4().hex
        slot, tag = release_slot(owner)
        condition = condition or self.ACQUIRE_CONDITION
        update = update or self.ACQUIRE_EXPRESSION
        names, values = _used_only(
            update + " " + condition,
            {**self.acquire_names, "#slot": slot},
            {
                ":tag": {"S": tag},
                ":lapsed": {"N": repr(round(now - 2.0, 6))},
                ":earliest": {"N": repr(round(now, 6))},
                ":me": {"S": owner},
                ":rvn": {"S": uuid.uuid4().hex},
                ":seq": {"N": "1"},
                ":lease_ms": {"N": self.lease_ms},
                ":expires": {"N": repr(round(now + LEASE_DURATION, 6))},
                ":now": {"N": repr(round(now, 6))},
                ":host": {"S": self.host},
                ":pid": {"N": self.pid},
                ":thread": {"S": "bench"},
                ":holder": {"M": {}},
                ":gc": {"N": str(int(now) + 3600)},
                ":base": {"N": str(int(now * 1_000_000))},
                ":one": {"N": "1"},
                ":ring0": EMPTY_RING,
            },
        )
        reply = self.boto.update_item(
            TableName=TABLE,
            Key={"key": {"S": key}},
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return owner, reply["Attributes"]["fence"]["N"]

    def release(self, key: str, owner: str, token: str) -> None:
        now = time.time()
        slot, tag = release_slot(owner)
        self.boto.update_item(
            TableName=TABLE,
            Key={"key": {"S": key}},
            UpdateExpression=self.RELEASE_EXPRESSION.format(ring=ring_index(int(token))),
            ConditionExpression=self.RELEASE_CONDITION,
            ExpressionAttributeNames={**self.release_names, "#slot": slot},
            ExpressionAttributeValues={
                ":me": {"S": owner},
                ":tag": {"S": tag},
                ":now": {"N": repr(round(now, 6))},
                ":rvn": {"S": uuid.uuid4().hex},
                ":gc": {"N": str(int(now) + 3600)},
            },
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def close(self) -> None:
        self.boto.close()


def _used_only(
    expressions: str, names: dict[str, str], values: dict[str, Any]
) -> tuple[dict[str, str], dict[str, Any]]:
    """The names and values that ``expressions`` use: DynamoDB refuses unused ones."""
    used = set(re.findall(r"[#:][A-Za-z0-9_]+", expressions))
    return {k: v for k, v in names.items() if k in used}, {k: v for k, v in values.items() if k in used}


def engine_requests_match(endpoint_url: str) -> list[str]:
    """Differences between the engine's acquire/release requests and the floor's (empty: same)."""
    client = make_client(endpoint_url)
    seen: list[dict[str, Any]] = []

    def capture(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "UpdateItem":
            seen.append(json.loads(params["body"]))

    client.boto.meta.events.register("before-call.dynamodb", capture, unique_id="bench-floor-check")
    try:
        client.acquire(f"floor-check-{uuid.uuid4().hex[:6]}").release()  # learns DynamoDB's clock
        seen.clear()
        client.acquire(f"floor-check-{uuid.uuid4().hex[:6]}").release()
    finally:
        client.close()
    problems = []
    if len(seen) != 2:
        return [f"expected 2 UpdateItems per acquire+release, saw {len(seen)}"]
    ours = [(Floor.ACQUIRE_EXPRESSION, Floor.ACQUIRE_CONDITION), (Floor.RELEASE_EXPRESSION, Floor.RELEASE_CONDITION)]
    for what, body, (update, condition) in zip(("acquire", "release"), seen, ours):
        if re.sub(r"#ring\[\d+\]", "#ring[{ring}]", body.get("UpdateExpression", "")) != update:
            problems.append(f"{what} UpdateExpression: engine {body.get('UpdateExpression')!r}, floor {update!r}")
        if body.get("ConditionExpression") != condition:
            problems.append(
                f"{what} ConditionExpression: engine {body.get('ConditionExpression')!r}, floor {condition!r}"
            )
    return problems


# -- 1. calls per operation ------------------------------------------------------


def measure_calls(endpoint_url: str, extra: dict, cycles: int = 20) -> dict[str, Any]:
    client = make_client(endpoint_url, **extra)
    other = make_client(endpoint_url, **extra)
    counter = CallCounter(client.boto)
    try:
        client.acquire("calls-warm").release()
        counter.take()

        for _ in range(cycles):  # the same key again and again: the item exists
            client.acquire("calls-reused").release()
        reused, reused_requests = counter.take()

        for i in range(cycles):  # a new key each time: the acquire creates the item
            client.acquire(f"calls-new-{uuid.uuid4().hex[:8]}-{i}").release()
        fresh, _ = counter.take()

        held = other.acquire("calls-busy")
        for _ in range(cycles):
            if client.try_acquire("calls-busy") is not None:
                raise BenchError("try_acquire got a key that another client holds")
        failed, failed_requests = counter.take()

        # The same key held by this very client: the in-process gate answers.
        mine = client.acquire("calls-mine")
        counter.take()
        for _ in range(cycles):
            if client.try_acquire("calls-mine") is not None:
                raise BenchError("try_acquire got a key this client holds")
        local, _ = counter.take()
        mine.release()
        held.release()
    finally:
        counter.close()
        client.close()
        other.close()

    def per(calls: dict[str, int]) -> dict[str, float]:
        return {op: n / cycles for op, n in sorted(calls.items())}

    return {
        "cycles": cycles,
        "acquire_release": per(reused),
        "acquire_release_total": sum(reused.values()) / cycles,
        "acquire_release_http_requests": reused_requests / cycles,
        "acquire_release_new_key": per(fresh),
        "acquire_release_new_key_total": sum(fresh.values()) / cycles,
        "failed_try_acquire": per(failed),
        "failed_try_acquire_total": sum(failed.values()) / cycles,
        "failed_try_acquire_http_requests": failed_requests / cycles,
        "failed_try_acquire_same_process_total": sum(local.values()) / cycles,
    }


# -- 2. uncontended throughput ---------------------------------------------------


def run_round(make_cycle: Callable[[int], Callable[[], None]], threads: int, cycles: int, cap: float) -> dict[str, Any]:
    """``cycles`` acquire+release cycles split over ``threads`` threads; stops early at ``cap`` s."""
    per_thread = max(1, cycles // threads)
    done = [0] * threads
    errors: list[str] = []
    barrier = threading.Barrier(threads + 1, timeout=30)
    stop_at = [0.0]

    def worker(index: int) -> None:
        try:
            cycle = make_cycle(index)
            barrier.wait()
            for _ in range(per_thread):
                cycle()
                done[index] += 1
                if time.perf_counter() >= stop_at[0]:
                    break
        except Exception as exc:  # reported, the round is discarded
            errors.append(f"{type(exc).__name__}: {exc}")
            barrier.abort()

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for thread in workers:
        thread.start()
    stop_at[0] = time.perf_counter() + cap + 1.0
    barrier.wait()
    started = time.perf_counter()
    cpu_started = time.process_time()  # this whole process: all threads, heartbeat thread too
    stop_at[0] = started + cap
    for thread in workers:
        thread.join(cap + 30)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    if errors:
        raise BenchError(f"round failed: {errors[0]}")
    if any(thread.is_alive() for thread in workers):
        raise BenchError("round did not finish in time")
    total = sum(done)
    return {
        "cycles": total,
        "seconds": elapsed,
        "rate": total / elapsed,
        "cpu_us_per_cycle": cpu / total * 1e6 if total else None,
        "capped": total < per_thread * threads,
    }


def measure_uncontended(endpoint_url: str, plan: Plan, threads: int) -> dict[str, Any]:
    client = make_client(endpoint_url, **plan.client_extra)
    floor = Floor(endpoint_url, client.options.client_config)
    run_id = uuid.uuid4().hex[:6]

    def library_cycle(index: int) -> Callable[[], None]:
        key = f"u{threads}-lib-{run_id}-{index}"

        def cycle() -> None:
            client.acquire(key).release()

        return cycle

    def floor_cycle(index: int) -> Callable[[], None]:
        key = f"u{threads}-floor-{run_id}-{index}"

        def cycle() -> None:
            owner, token = floor.acquire(key)
            floor.release(key, owner, token)

        return cycle

    try:
        # Warm-up (connections, items, code paths) and calibration of N from the floor.
        run_round(library_cycle, threads, 10 * threads, 1.0)
        calibration = run_round(floor_cycle, threads, 100_000, min(plan.round_seconds, 0.5))
        cycles = int(max(10 * threads, min(20_000, calibration["rate"] * plan.round_seconds)))
        cycles -= cycles % threads
        library: list[dict[str, Any]] = []
        floor_rounds: list[dict[str, Any]] = []
        for index in range(plan.rounds):
            order = [("library", library_cycle, library), ("floor", floor_cycle, floor_rounds)]
            if index % 2:
                order.reverse()  # ABBA: drift in the machine's load hits both sides alike
            for _name, make_cycle, sink in order:
                sink.append(run_round(make_cycle, threads, cycles, plan.round_cap))
    finally:
        floor.close()
        client.close()
    lib_rates = [r["rate"] for r in library]
    floor_rates = [r["rate"] for r in floor_rounds]
    paired = [a / b for a, b in zip(lib_rates, floor_rates)]
    return {
        "threads": threads,
        "cycles_per_round": cycles,
        "rounds": plan.rounds,
        "library_rounds": library,
        "floor_rounds": floor_rounds,
        "library_median": median(lib_rates),
        "floor_median": median(floor_rates),
        "ratio": ratio(median(lib_rates), median(floor_rates)),
        "paired_ratios": paired,
        "paired_ratio_median": median(paired),
        "library_cpu_us_per_cycle": median([r["cpu_us_per_cycle"] for r in library]),
        "floor_cpu_us_per_cycle": median([r["cpu_us_per_cycle"] for r in floor_rounds]),
    }


# -- round trip of one UpdateItem ------------------------------------------------


def measure_rtt(endpoint_url: str, calls: int, cap: float = 15.0) -> dict[str, Any]:
    floor = Floor(endpoint_url, merge_client_config(None))
    acquires: list[float] = []
    releases: list[float] = []
    try:
        owner, token = floor.acquire("rtt")  # warm-up
        floor.release("rtt", owner, token)
        stop_at = time.perf_counter() + cap
        for _ in range(calls // 2):
            t0 = time.perf_counter()
            owner, token = floor.acquire("rtt")
            t1 = time.perf_counter()
            floor.release("rtt", owner, token)
            t2 = time.perf_counter()
            acquires.append(t1 - t0)
            releases.append(t2 - t1)
            if t2 >= stop_at:
                break
    finally:
        floor.close()
    both = acquires + releases
    return {
        "calls": len(both),
        "median_ms": median(both) * 1000,
        "p95_ms": percentile(both, 95) * 1000,
        "acquire_median_ms": median(acquires) * 1000,
        "release_median_ms": median(releases) * 1000,
    }


# -- 3. handoff latency (child processes) -----------------------------------------


def _send_error(conn: Any) -> None:
    try:
        conn.send(("error", traceback.format_exc(limit=5)))
    except Exception:
        pass


def handoff_holder(endpoint_url: str, extra: dict, conn: Any, max_messages: int) -> None:
    """Child: acquire on request, release on request (time.time() taken just before)."""
    quiet_engine_logs()
    client = None
    try:
        client = make_client(endpoint_url, **extra)
        client.get("warm-holder")
        conn.send(("ready",))
        lease = None
        for _ in range(max_messages):
            if not conn.poll(CHILD_REPLY_TIMEOUT * 4):
                return
            message = conn.recv()
            if message[0] == "acquire":
                lease = client.acquire(message[1], wait=5)
                conn.send(("held", lease.token))
            elif message[0] == "release" and lease is not None:
                sent = time.time()
                lease.release()
                conn.send(("released", sent))
                lease = None
            else:
                return
    except Exception:
        _send_error(conn)
    finally:
        if client is not None:
            client.close(release=True)


def handoff_waiter(endpoint_url: str, extra: dict, conn: Any, max_messages: int) -> None:
    """Child: on request, block in acquire(wait=...) and report when it returned."""
    quiet_engine_logs()
    client = None
    try:
        client = make_client(endpoint_url, **extra)
        counter = CallCounter(client.boto)
        client.get("warm-waiter")
        conn.send(("ready",))
        for _ in range(max_messages):
            if not conn.poll(CHILD_REPLY_TIMEOUT * 4):
                return
            message = conn.recv()
            if message[0] != "wait":
                return
            counter.take()
            conn.send(("waiting",))
            began = time.monotonic()
            lease = client.acquire(message[1], wait=10)
            got = time.time()
            waited = time.monotonic() - began
            calls, _ = counter.take()
            lease.release()
            conn.send(("got", got, waited, calls, lease.token))
    except Exception:
        _send_error(conn)
    finally:
        if client is not None:
            client.close(release=True)


def _expect(conn: Any, what: str, timeout: float = CHILD_REPLY_TIMEOUT) -> tuple:
    if not conn.poll(timeout):
        raise BenchError(f"no {what!r} from a child within {timeout:.0f}s")
    message = conn.recv()
    if message[0] == "error":
        raise BenchError(f"child failed:\n{message[1]}")
    if message[0] != what:
        raise BenchError(f"expected {what!r} from a child, got {message!r}")
    return message


def _stop_children(processes: list[Any], conns: list[Any]) -> None:
    for conn in conns:
        try:
            conn.send(("stop",))
        except Exception:
            pass
    for process in processes:
        process.join(15)
    for process in processes:
        if process.is_alive():  # our own child, by its handle; a peer's threads may ignore SIGTERM
            process.kill()
            process.join(5)


def measure_handoff(endpoint_url: str, plan: Plan, ctx: Any) -> dict[str, Any]:
    holder_conn, holder_child = ctx.Pipe()
    waiter_conn, waiter_child = ctx.Pipe()
    max_messages = 4 * plan.handoff_samples + 10
    processes = [
        ctx.Process(
            target=handoff_holder, args=(endpoint_url, plan.client_extra, holder_child, max_messages), daemon=True
        ),
        ctx.Process(
            target=handoff_waiter, args=(endpoint_url, plan.client_extra, waiter_child, max_messages), daemon=True
        ),
    ]
    rng = random.Random(1234)
    samples: list[dict[str, Any]] = []
    run_id = uuid.uuid4().hex[:6]
    try:
        for process in processes:
            process.start()
        _expect(holder_conn, "ready", CHILD_START_TIMEOUT)
        _expect(waiter_conn, "ready", CHILD_START_TIMEOUT)
        stop_at = time.monotonic() + plan.handoff_cap
        for index in range(plan.handoff_samples):
            if time.monotonic() >= stop_at:
                break
            key = f"handoff-{run_id}-{index}"
            holder_conn.send(("acquire", key))
            _expect(holder_conn, "held")
            waiter_conn.send(("wait", key))
            _expect(waiter_conn, "waiting")
            hold = rng.uniform(*plan.handoff_hold)
            time.sleep(hold)
            holder_conn.send(("release",))
            _, sent = _expect(holder_conn, "released")
            _, got, waited, calls, token = _expect(waiter_conn, "got")
            samples.append(
                {
                    "latency_ms": (got - sent) * 1000,
                    "held_ms": hold * 1000,
                    "waited_ms": waited * 1000,
                    "waiter_calls": calls,
                    "waiter_calls_total": sum(calls.values()),
                }
            )
    finally:
        _stop_children(processes, [holder_conn, waiter_conn])
    latencies = [s["latency_ms"] for s in samples]
    polls = [s["waiter_calls_total"] for s in samples]
    return {
        "samples": samples,
        "n": len(samples),
        "hold_range_ms": [x * 1000 for x in plan.handoff_hold],
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "mean_ms": statistics.fmean(latencies) if latencies else None,
        "min_ms": min(latencies) if latencies else None,
        "max_ms": max(latencies) if latencies else None,
        "waiter_calls_median": median(polls),
    }


# -- 4. contended throughput (child processes) -------------------------------------


def contended_worker(endpoint_url: str, extra: dict, key: str, hold: float, conn: Any) -> None:
    """Child: acquire -> sleep(hold) -> release on one key until the window ends."""
    quiet_engine_logs()
    client = None
    try:
        client = make_client(endpoint_url, **extra)
        counter = CallCounter(client.boto)
        client.get(key)  # warm the connection
        conn.send(("ready", os.getpid()))
        if not conn.poll(CHILD_START_TIMEOUT * 2):
            return
        _, start_at, end_at = conn.recv()
        time.sleep(max(0.0, min(start_at - time.time(), 10.0)))
        counter.take()
        sections = []
        for _ in range(int((end_at - start_at) / max(hold, 0.001)) + 10):
            tried = time.time()
            if tried >= end_at:
                break
            try:
                lease = client.acquire(key, wait=end_at - tried)
            except LockNotAcquired:
                break
            acquired = time.time()
            time.sleep(hold)
            releasing = time.time()
            lease.release()
            released = time.time()
            sections.append((lease.token, tried, acquired, releasing, released))
        calls, requests = counter.take()
        conn.send(("result", os.getpid(), sections, calls, requests))
    except Exception:
        _send_error(conn)
    finally:
        if client is not None:
            client.close(release=True)


def measure_contended(endpoint_url: str, plan: Plan, rtt_ms: float, ctx: Any) -> dict[str, Any]:
    key = f"contended-{uuid.uuid4().hex[:6]}"
    pairs = [ctx.Pipe() for _ in range(plan.procs)]
    processes = [
        ctx.Process(target=contended_worker, args=(endpoint_url, plan.client_extra, key, plan.hold, child), daemon=True)
        for _, child in pairs
    ]
    results = []
    try:
        for process in processes:
            process.start()
        for conn, _ in pairs:
            _expect(conn, "ready", CHILD_START_TIMEOUT)
        start_at = time.time() + 0.3
        end_at = start_at + plan.window
        for conn, _ in pairs:
            conn.send(("go", start_at, end_at))
        for conn, _ in pairs:
            results.append(_expect(conn, "result", plan.window + CHILD_REPLY_TIMEOUT))
    finally:
        _stop_children(processes, [conn for conn, _ in pairs])

    sections = []  # (token, tried, acquired, releasing, released, pid)
    per_process = []
    calls: collections.Counter[str] = collections.Counter()
    for _, pid, mine, worker_calls, _requests in results:
        inside = [(*s, pid) for s in mine if start_at <= s[2] < end_at]
        per_process.append(len(inside))
        sections.extend(inside)
        calls.update(worker_calls)
    sections.sort()
    # Mutual exclusion: each holder's release was sent before the next holder got the lock.
    overlaps = sum(1 for a, b in zip(sections, sections[1:]) if b[2] < a[3])
    duplicate_tokens = len(sections) - len({s[0] for s in sections})
    waits = [(s[2] - s[1]) * 1000 for s in sections]
    # Gap: the previous holder's release sent -> the next holder's acquire returned.
    # Split by who got it: the releasing process itself (it asks again at once) or a
    # waiter (which only notices at its next poll).
    gaps = [(b[2] - a[3]) * 1000 for a, b in zip(sections, sections[1:])]
    same = [(b[2] - a[3]) * 1000 for a, b in zip(sections, sections[1:]) if a[5] == b[5]]
    other = [(b[2] - a[3]) * 1000 for a, b in zip(sections, sections[1:]) if a[5] != b[5]]
    release_rtts = [(s[4] - s[3]) * 1000 for s in sections]
    rate = len(sections) / plan.window
    limit = 1.0 / (plan.hold + 2 * rtt_ms / 1000.0)
    return {
        "processes": plan.procs,
        "hold_ms": plan.hold * 1000,
        "window_s": plan.window,
        "sections": len(sections),
        "sections_per_s": rate,
        "rtt_ms_used": rtt_ms,
        "limit_per_s": limit,
        "ratio": rate / limit,
        "per_process": sorted(per_process),
        "overlaps": overlaps,
        "duplicate_tokens": duplicate_tokens,
        "acquire_wait_p50_ms": percentile(waits, 50),
        "acquire_wait_p95_ms": percentile(waits, 95),
        "acquire_wait_max_ms": max(waits) if waits else None,
        "gap_p50_ms": percentile(gaps, 50),
        "gap_p95_ms": percentile(gaps, 95),
        "gap_mean_ms": statistics.fmean(gaps) if gaps else None,
        "reacquired_by_releaser": len(same) / len(gaps) if gaps else None,
        "gap_same_process_p50_ms": percentile(same, 50),
        "gap_other_process_p50_ms": percentile(other, 50),
        "release_rtt_under_load_p50_ms": percentile(release_rtts, 50),
        "limit_under_load_per_s": 1.0 / (plan.hold + 2 * percentile(release_rtts, 50) / 1000.0)
        if release_rtts
        else None,
        "hold_measured_p50_ms": percentile([(s[3] - s[2]) * 1000 for s in sections], 50),
        "calls": dict(calls),
        "calls_per_section": sum(calls.values()) / len(sections) if sections else None,
    }


# -- one server -------------------------------------------------------------------


def start_server(kind: str) -> Any:
    from localdynamo.servers import start_dynalite, start_dynamodb_local, start_moto_server

    if kind == "moto":
        return start_moto_server(timeout=60)
    if kind == "dynalite":
        return start_dynalite(timeout=60, extra_args=["--createTableMs", "0"])
    if kind == "dynamodb-local":
        return start_dynamodb_local(timeout=90)
    raise SystemExit(f"unknown server {kind!r}: use dynamodb-local, moto or dynalite")


def bench_server(kind: str, plan: Plan, deadline: float, ctx: Any, say: Callable[[str], None]) -> dict[str, Any]:
    result: dict[str, Any] = {"server": kind, "errors": {}, "skipped": []}
    began = time.monotonic()
    server = start_server(kind)
    try:
        result["endpoint"] = server.endpoint_url
        setup = make_client(server.endpoint_url)
        try:
            result["table"] = str(setup.create_table(wait=True))
        finally:
            setup.close()

        def phase(name: str, fn: Callable[[], Any]) -> Any:
            return run_phase(result, kind, name, fn, deadline, say)

        result["calls"] = phase("calls", lambda: measure_calls(server.endpoint_url, plan.client_extra))
        result["uncontended"] = {}
        for threads in plan.threads:
            value = phase(f"uncontended-{threads}", lambda t=threads: measure_uncontended(server.endpoint_url, plan, t))
            if value is not None:
                result["uncontended"][str(threads)] = value
        result["handoff"] = phase("handoff", lambda: measure_handoff(server.endpoint_url, plan, ctx))
        rtt_before = phase("rtt", lambda: measure_rtt(server.endpoint_url, plan.rtt_calls))
        result["rtt"] = rtt_before
        if rtt_before is not None:
            result["contended"] = phase(
                "contended", lambda: measure_contended(server.endpoint_url, plan, rtt_before["median_ms"], ctx)
            )
    finally:
        server.stop()
    result["seconds"] = time.monotonic() - began
    return result


def run_phase(
    result: dict[str, Any], kind: str, name: str, fn: Callable[[], Any], deadline: float, say: Callable[[str], None]
) -> Any:
    """Run one measurement unless over the time budget; a failure is noted, not raised."""
    if time.monotonic() >= deadline:
        result["skipped"].append(name)
        say(f"  {kind}: {name} skipped (over the time budget)")
        return None
    t0 = time.monotonic()
    try:
        value = fn()
    except Exception as exc:
        result["errors"][name] = f"{type(exc).__name__}: {exc}"
        say(f"  {kind}: {name} FAILED: {type(exc).__name__}: {exc}")
        return None
    say(f"  {kind}: {name} done in {time.monotonic() - t0:.1f}s")
    return value


def write_results(results: dict[str, Any], path: Path | None, prefix: str) -> Path:
    """The raw results as JSON: at ``path``, or bench/results/<prefix>-<timestamp>.json."""
    json_path = path or RESULTS_DIR / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1, default=str))
    return json_path


def print_problems(results: dict[str, Any], engine_log: list[str]) -> bool:
    """Print failed and skipped phases and the engine's log lines; whether any phase failed."""
    failed = False
    for s in results["servers"]:
        for name, error in s["errors"].items():
            failed = True
            print(f"\n{s['server']}: {name} failed: {error}")
        if s["skipped"]:
            print(f"\n{s['server']}: skipped (time budget): {', '.join(s['skipped'])}")
    if engine_log:
        print("\nengine log:\n" + "\n".join(f"- {m}" for m in engine_log))
    return failed


# -- report -----------------------------------------------------------------------


def _get(data: Any, *path: Any) -> Any:
    for part in path:
        if data is None:
            return None
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _f(value: Any, fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def _calls(per: dict[str, float] | None, total: float | None) -> str:
    if not per:
        return "–"
    parts = " + ".join(f"{n:g} {op}" for op, n in per.items())
    return f"{total:g} ({parts})"


def _met(ok: bool | None) -> str:
    return "–" if ok is None else ("**met**" if ok else "**missed**")


def targets(server: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    rows: list[tuple[str, str, bool | None]] = []
    total = _get(server, "calls", "acquire_release_total")
    rows.append(("calls per acquire+release = 2", _f(total, "{:g}"), None if total is None else total == TARGET_CALLS))
    for threads in ("1", "8"):
        r = _get(server, "uncontended", threads, "ratio")
        rows.append(
            (
                f"uncontended {threads} thread(s) ≥ 0.85 × floor",
                _f(r, "{:.2f} ×"),
                None if r is None else r >= TARGET_UNCONTENDED_RATIO,
            )
        )
    p50 = _get(server, "handoff", "p50_ms")
    rows.append(("handoff p50 ≤ 30 ms", _f(p50, "{:.1f} ms"), None if p50 is None else p50 <= TARGET_HANDOFF_P50_MS))
    r = _get(server, "contended", "ratio")
    rows.append(
        ("contended within 15% of the limit", _f(r, "{:.2f} ×"), None if r is None else r >= TARGET_CONTENDED_RATIO)
    )
    return rows


def markdown(results: dict[str, Any]) -> str:
    servers = results["servers"]
    names = [s["server"] for s in servers]
    plan = results["plan"]
    head = "| figure | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names)
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        (
            "API calls per acquire+release (uncontended)",
            lambda s: _calls(_get(s, "calls", "acquire_release"), _get(s, "calls", "acquire_release_total")),
        ),
        (
            "API calls per failed try_acquire (held by another client)",
            lambda s: _calls(_get(s, "calls", "failed_try_acquire"), _get(s, "calls", "failed_try_acquire_total")),
        ),
        (
            "UpdateItem round trip, median / p95 (ms)",
            lambda s: f"{_f(_get(s, 'rtt', 'median_ms'), '{:.2f}')} / {_f(_get(s, 'rtt', 'p95_ms'), '{:.2f}')}",
        ),
    ]
    for threads in ("1", "8"):
        rows += [
            (
                f"cycles/s, {threads} thread(s): library (median of {plan['rounds']})",
                lambda s, t=threads: _f(_get(s, "uncontended", t, "library_median"), "{:.0f}"),
            ),
            (
                f"cycles/s, {threads} thread(s): raw boto3 floor (median of {plan['rounds']})",
                lambda s, t=threads: _f(_get(s, "uncontended", t, "floor_median"), "{:.0f}"),
            ),
            (
                f"library / floor, {threads} thread(s)",
                lambda s, t=threads: _f(_get(s, "uncontended", t, "ratio"), "{:.2f}"),
            ),
            (
                f"client CPU per cycle, {threads} thread(s): library / floor (µs)",
                lambda s, t=threads: (
                    f"{_f(_get(s, 'uncontended', t, 'library_cpu_us_per_cycle'), '{:.0f}')} / {_f(_get(s, 'uncontended', t, 'floor_cpu_us_per_cycle'), '{:.0f}')}"
                ),
            ),
        ]
    rows += [
        (
            "handoff latency p50 / p95 (ms)",
            lambda s: f"{_f(_get(s, 'handoff', 'p50_ms'))} / {_f(_get(s, 'handoff', 'p95_ms'))}",
        ),
        (
            "handoff latency min / max (ms), samples",
            lambda s: (
                f"{_f(_get(s, 'handoff', 'min_ms'))} / {_f(_get(s, 'handoff', 'max_ms'))}, n={_f(_get(s, 'handoff', 'n'), '{}')}"
            ),
        ),
        ("waiter's API calls per handoff (median)", lambda s: _f(_get(s, "handoff", "waiter_calls_median"), "{:g}")),
        (
            f"contended sections/s ({plan['procs']} procs, hold {plan['hold'] * 1000:g} ms, {plan['window']:g} s)",
            lambda s: _f(_get(s, "contended", "sections_per_s")),
        ),
        ("physical limit 1 / (hold + 2 × RTT), sections/s", lambda s: _f(_get(s, "contended", "limit_per_s"))),
        ("contended / limit", lambda s: _f(_get(s, "contended", "ratio"), "{:.2f}")),
        (
            "contended: sections per process (min–max)",
            lambda s: (
                "–"
                if not _get(s, "contended", "per_process")
                else f"{s['contended']['per_process'][0]}–{s['contended']['per_process'][-1]}"
            ),
        ),
        (
            "contended: acquire wait p50 / p95 (ms)",
            lambda s: (
                f"{_f(_get(s, 'contended', 'acquire_wait_p50_ms'))} / {_f(_get(s, 'contended', 'acquire_wait_p95_ms'))}"
            ),
        ),
        ("contended: release sent → next acquire returned, p50 (ms)", lambda s: _f(_get(s, "contended", "gap_p50_ms"))),
        (
            "contended: … when the releaser re-acquired / a waiter got it, p50 (ms)",
            lambda s: (
                f"{_f(_get(s, 'contended', 'gap_same_process_p50_ms'))} / {_f(_get(s, 'contended', 'gap_other_process_p50_ms'))}"
            ),
        ),
        (
            "contended: handoffs where the releaser re-acquired",
            lambda s: _f(_get(s, "contended", "reacquired_by_releaser"), "{:.0%}"),
        ),
        (
            "contended: release round trip under load, p50 (ms)",
            lambda s: _f(_get(s, "contended", "release_rtt_under_load_p50_ms"), "{:.2f}"),
        ),
        (
            "contended: measured hold (sleep), p50 (ms)",
            lambda s: _f(_get(s, "contended", "hold_measured_p50_ms"), "{:.2f}"),
        ),
        (
            "contended: limit with the loaded round trip, 1 / (hold + 2 × loaded RTT)",
            lambda s: _f(_get(s, "contended", "limit_under_load_per_s")),
        ),
        ("contended: API calls per section", lambda s: _f(_get(s, "contended", "calls_per_section"), "{:.2f}")),
        (
            "contended: overlapping sections / duplicate tokens",
            lambda s: (
                f"{_f(_get(s, 'contended', 'overlaps'), '{}')} / {_f(_get(s, 'contended', 'duplicate_tokens'), '{}')}"
            ),
        ),
    ]
    defaults = ClientOptions()
    extra = plan.get("client_extra") or {}
    delays = ", ".join(
        f"{name.upper()} {extra.get(name, getattr(defaults, name)) * 1000:g} ms{' (override)' if name in extra else ''}"
        for name in ("min_retry_delay", "max_retry_delay")
    )
    lines = [f"Engine settings: lease {LEASE_DURATION:g} s, heartbeat {HEARTBEAT_PERIOD:g} s, {delays}.\n", head]
    for label, fn in rows:
        lines.append(f"| {label} | " + " | ".join(fn(s) for s in servers) + " |")
    out = "\n".join(lines)
    out += "\n\n| target | " + " | ".join(names) + " |\n|---|" + "---|" * len(names)
    by_server = [targets(s) for s in servers]
    for i, (label, _, _) in enumerate(by_server[0] if by_server else []):
        out += f"\n| {label} | " + " | ".join(f"{t[i][1]} {_met(t[i][2])}" for t in by_server) + " |"
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = results["servers"]
    colours = {"moto": "#1f77b4", "dynalite": "#ff7f0e"}
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [1.1, 1.4, 0.9]})

    ax = axes[0]
    all_latencies = [x["latency_ms"] for s in servers for x in (_get(s, "handoff", "samples") or [])]
    # Clip the axis at the largest p99 so that one outlier does not squash the curves.
    right = (
        max(
            [
                percentile([x["latency_ms"] for x in _get(s, "handoff", "samples")], 99) or 0
                for s in servers
                if _get(s, "handoff", "samples")
            ]
            + [TARGET_HANDOFF_P50_MS]
        )
        * 1.1
    )
    for s in servers:
        samples = sorted(x["latency_ms"] for x in (_get(s, "handoff", "samples") or []))
        if not samples:
            continue
        ys = [(i + 1) / len(samples) for i in range(len(samples))]
        colour = colours.get(s["server"])
        beyond = sum(1 for x in samples if x > right)
        note = f"\n{beyond} beyond axis (max {samples[-1]:.0f} ms)" if beyond else ""
        ax.step(
            samples,
            ys,
            where="post",
            color=colour,
            lw=2,
            label=f"{s['server']}: p50 {s['handoff']['p50_ms']:.1f} ms\np95 {s['handoff']['p95_ms']:.1f} ms, n={len(samples)}{note}",
        )
    ax.axvline(TARGET_HANDOFF_P50_MS, color="grey", ls="--", lw=1)
    ax.axhline(0.5, color="grey", ls=":", lw=1)
    ax.text(TARGET_HANDOFF_P50_MS, 0.96, "target: p50 ≤ 30 ms ", color="dimgrey", fontsize=9, ha="right")
    ax.set_xlabel("handoff latency (ms): holder's release sent → waiter's acquire returns")
    ax.set_ylabel("fraction of handoffs ≤ x")
    ax.set_title("Handoff latency (cumulative distribution)")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(0, right if all_latencies else None)
    ax.legend(loc="lower right", fontsize=8.5)
    ax.grid(alpha=0.3)

    ax = axes[1]
    labels, lib, floor, lib_err, floor_err, ratios = [], [], [], [[], []], [[], []], []
    for s in servers:
        for threads in ("1", "8"):
            u = _get(s, "uncontended", threads)
            if not u:
                continue
            labels.append(f"{s['server']}\n{threads} thread{'s' if threads != '1' else ''}")
            for sink, err, rounds, med in (
                (lib, lib_err, u["library_rounds"], u["library_median"]),
                (floor, floor_err, u["floor_rounds"], u["floor_median"]),
            ):
                rates = [r["rate"] for r in rounds]
                sink.append(med)
                err[0].append(med - min(rates))
                err[1].append(max(rates) - med)
            ratios.append(u["ratio"])
    xs = list(range(len(labels)))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], lib, width, yerr=lib_err, capsize=3, label="django-dynlock", color="#2ca02c")
    ax.bar(
        [x + width / 2 for x in xs], floor, width, yerr=floor_err, capsize=3, label="raw boto3 floor", color="#7f7f7f"
    )
    for x, i in zip(xs, range(len(xs))):
        top = max(lib[i] + lib_err[1][i], floor[i] + floor_err[1][i])
        ax.annotate(
            f"library/floor {ratios[i]:.2f}×",
            (x, top),
            textcoords="offset points",
            xytext=(0, 4),
            ha="center",
            fontsize=9,
            fontweight="bold",
        )
    ax.set_xticks(xs, labels)
    ax.set_ylabel("acquire+release cycles/s (median; whiskers: min–max of rounds)")
    ax.set_title(f"Uncontended throughput, library vs floor (target ≥ {TARGET_UNCONTENDED_RATIO}×)")
    ax.legend(fontsize=9, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(
        0, max([a + b for a, b in zip(lib, lib_err[1])] + [a + b for a, b in zip(floor, floor_err[1])] + [1]) * 1.18
    )

    ax = axes[2]
    names, measured, limits, loaded, cratios = [], [], [], [], []
    for s in servers:
        c = s.get("contended")
        if not c:
            continue
        names.append(s["server"])
        measured.append(c["sections_per_s"])
        limits.append(c["limit_per_s"])
        loaded.append(c.get("limit_under_load_per_s") or 0.0)
        cratios.append(c["ratio"])
    xs = list(range(len(names)))
    third = 0.27
    ax.bar([x - third for x in xs], measured, third, label="measured", color="#9467bd")
    ax.bar(xs, limits, third, label="limit 1/(hold + 2·RTT), idle RTT", color="#c7c7c7", edgecolor="#7f7f7f")
    ax.bar(
        [x + third for x in xs],
        loaded,
        third,
        label="same with the RTT under load",
        color="white",
        edgecolor="#7f7f7f",
        hatch="//",
    )
    for x, value, r in zip(xs, measured, cratios):
        ax.annotate(
            f"{r:.2f}× limit",
            (x - third, value),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
            fontsize=9,
            fontweight="bold",
        )
    plan = results["plan"]
    ax.set_xticks(xs, names)
    ax.set_ylabel("critical sections/s")
    ax.set_title(f"Contended: {plan['procs']} processes, one key, hold {plan['hold'] * 1000:g} ms")
    ax.legend(fontsize=9, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(0, max(limits + measured + [1]) * 1.3)

    fig.suptitle(
        f"django-dynlock engine benchmark ({results['meta']['started']}, {results['meta']['cpus']} cores, {plan['mode']} mode)",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def meta() -> dict[str, Any]:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    dynalite = None
    try:
        dynalite = json.loads((REPO_ROOT / "node_modules" / "dynalite" / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        pass
    node = None
    try:
        node = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    import django_dynlock

    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django_dynlock": django_dynlock.__version__,
        "boto3": _version("boto3"),
        "botocore": _version("botocore"),
        "moto": _version("moto"),
        "django": _version("Django"),
        "matplotlib": _version("matplotlib"),
        "dynalite": dynalite,
        "node": node,
        "command": " ".join(["python -m bench.engine", *sys.argv[1:]]),
        # Other work on the machine skews absolute figures (ratios less so).
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 1 minute instead of 2-3")
    parser.add_argument("--servers", default="moto,dynalite", help="comma-separated: moto, dynalite")
    parser.add_argument("--hold", type=float, default=10.0, help="contended critical section, ms (default 10)")
    parser.add_argument("--procs", type=int, default=6, help="contended processes (default 6)")
    parser.add_argument("--window", type=float, default=None, help="contended window, s (default 10; quick 4)")
    parser.add_argument("--rounds", type=int, default=None, help="uncontended rounds per side (default 7; quick 3)")
    parser.add_argument("--samples", type=int, default=None, help="handoff samples per server (default 100; quick 30)")
    parser.add_argument(
        "--min-retry-delay",
        type=float,
        default=None,
        metavar="MS",
        help="override the engine's MIN_RETRY_DELAY (ms) in every client",
    )
    parser.add_argument(
        "--max-retry-delay",
        type=float,
        default=None,
        metavar="MS",
        help="override the engine's MAX_RETRY_DELAY (ms) in every client",
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds after which phases not yet started are skipped"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="raw results (default bench/results/engine-<timestamp>.json)"
    )
    parser.add_argument(
        "--plot", type=Path, default=DEFAULT_PLOT, help=f"PNG output (default {DEFAULT_PLOT.relative_to(REPO_ROOT)})"
    )
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--replot", type=Path, default=None, metavar="JSON", help="only redraw the table and plot from a results file"
    )
    args = parser.parse_args(argv)

    if args.replot:
        results = json.loads(args.replot.read_text())
        print(markdown(results))
        if not args.no_plot:
            plot(results, args.plot)
            print(f"\nplot: {args.plot}")
        return 0

    if not 1 <= args.procs <= 32 or args.hold < 0 or (args.window is not None and not 0 < args.window <= 120):
        parser.error("need 1 <= --procs <= 32, --hold >= 0 and 0 < --window <= 120")
    kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    if not kinds or any(k not in ("moto", "dynalite") for k in kinds):
        parser.error("--servers takes a comma-separated list of moto and dynalite")
    plan = make_plan(args)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    collector = LogCollector()
    logging.getLogger("django_dynlock").addHandler(collector)
    logging.getLogger("django_dynlock").propagate = False
    ctx = multiprocessing.get_context("spawn")
    started = time.monotonic()
    deadline = started + plan.budget
    results: dict[str, Any] = {"meta": meta(), "plan": asdict(plan), "servers": []}
    say(f"bench.engine: {plan.mode} mode, servers {', '.join(kinds)}, budget {plan.budget:.0f}s")
    for kind in kinds:
        say(f"{kind}: starting")
        results["servers"].append(bench_server(kind, plan, deadline, ctx, say))
    results["meta"]["seconds"] = time.monotonic() - started
    results["meta"]["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    results["engine_log"] = collector.messages

    json_path = write_results(results, args.json, "engine")
    print(markdown(results))
    failed = print_problems(results, collector.messages)
    print(f"\nraw results: {json_path}")
    if not args.no_plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    print(f"total: {results['meta']['seconds']:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
