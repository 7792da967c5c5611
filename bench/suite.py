"""The side-by-side measurements: django-dynlock, the raw boto3 floor and the peers.

Every function here measures one figure for several contenders against one server,
in one run; ``bench.run`` (``python -m bench``) runs them per server and ``bench.report`` turns the
results into tables and plots. Every loop is bounded in count and in time.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bench import targets
from bench.children import (
    CHILD_REPLY_TIMEOUT,
    CHILD_START_TIMEOUT,
    BenchError,
    child_lane,
    close_quietly,
    expect,
    stop_children,
)
from bench.clients import TABLE, make_client, raw_client
from bench.contenders import (
    DYNLOCK,
    MUTEX,
    PDL_DEFAULT,
    PDL_FASTEST,
    Contender,
    EventCounter,
    Spec,
    crash_spec,
    make_contender,
    new_fresh_mutex_calls,
)
from bench.floor import Floor
from bench.rounds import rotated, run_round
from bench.stats import jain, latency_summary, median, percentile
from django_dynlock.engine.options import merge_client_config

# -- 1. API calls --------------------------------------------------------------------


def measure_calls(endpoint_url: str, specs: list[Spec], cycles: int = 20) -> dict[str, Any]:
    """Per contender: calls per uncontended acquire+release, and per failed attempt."""
    out: dict[str, Any] = {}
    for spec in specs:
        contender = make_contender(spec, endpoint_url)
        other = make_contender(spec, endpoint_url)
        try:
            lane = contender.lane(0)
            key = f"calls-{spec.name}-{uuid.uuid4().hex[:6]}"
            lane.prepare(key)
            handle = lane.acquire(key, 0)  # warm-up; creates the item
            if handle is None:
                raise BenchError(f"{spec.name}: a free key was busy")
            lane.release(handle)
            contender.counter.take()
            for _ in range(cycles):
                handle = lane.acquire(key, 0)
                if handle is None:
                    raise BenchError(f"{spec.name}: a free key was busy")
                lane.release(handle)
            reused = contender.counter.take()

            busy_key = f"calls-busy-{spec.name}-{uuid.uuid4().hex[:6]}"
            other_lane = other.lane(0)
            other_lane.prepare(busy_key)
            held = other_lane.acquire(busy_key, 0)
            if held is None:
                raise BenchError(f"{spec.name}: a free key was busy")
            lane.prepare(busy_key)
            contender.counter.take()
            for _ in range(cycles):
                if lane.acquire(busy_key, 0) is not None:
                    raise BenchError(f"{spec.name}: got a key that another client holds")
            failed = contender.counter.take()
            other_lane.release(held)

            row: dict[str, Any] = {
                "acquire_release": {op: n / cycles for op, n in sorted(reused.items())},
                "acquire_release_total": sum(reused.values()) / cycles,
                "failed_attempt": {op: n / cycles for op, n in sorted(failed.items())},
                "failed_attempt_total": sum(failed.values()) / cycles,
            }
            if spec.kind == "mutex":
                fresh: collections.Counter[str] = collections.Counter()
                for i in range(cycles):
                    fresh.update(new_fresh_mutex_calls(contender, f"calls-fresh-{uuid.uuid4().hex[:6]}-{i}"))
                row["fresh_object"] = {op: n / cycles for op, n in sorted(fresh.items())}
                row["fresh_object_total"] = sum(fresh.values()) / cycles
            out[spec.name] = row
        finally:
            close_quietly(contender)
            close_quietly(other)
    return out


def measure_dynlock_calls(endpoint_url: str, cycles: int = 20) -> dict[str, Any]:
    """django-dynlock in more detail: calls per acquire+release of a new key (the acquire
    creates the item), per failed try_acquire on a key another client holds, and on a
    key this same client holds (its in-process gate answers)."""
    client, other = make_client(endpoint_url), make_client(endpoint_url)
    counter = EventCounter()
    counter.attach(client.boto.meta.events)
    try:
        client.acquire("calls-warm").release()
        counter.take()
        for i in range(cycles):
            client.acquire(f"calls-new-{uuid.uuid4().hex[:8]}-{i}").release()
        fresh = counter.take()

        held = other.acquire("calls-busy")
        for _ in range(cycles):
            if client.try_acquire("calls-busy") is not None:
                raise BenchError("try_acquire got a key that another client holds")
        failed = counter.take()

        mine = client.acquire("calls-mine")
        counter.take()
        for _ in range(cycles):
            if client.try_acquire("calls-mine") is not None:
                raise BenchError("try_acquire got a key this client holds")
        local = counter.take()
        mine.release()
        held.release()
    finally:
        client.close()
        other.close()

    def per(calls: dict[str, int]) -> dict[str, float]:
        return {op: n / cycles for op, n in sorted(calls.items())}

    return {
        "cycles": cycles,
        "acquire_release_new_key": per(fresh),
        "acquire_release_new_key_total": sum(fresh.values()) / cycles,
        "failed_try_acquire": per(failed),
        "failed_try_acquire_total": sum(failed.values()) / cycles,
        "failed_try_acquire_same_process_total": sum(local.values()) / cycles,
    }


# -- 2. calls per heartbeat --------------------------------------------------------------


def _bursts(stamps: list[float], gap: float) -> int:
    if not stamps:
        return 0
    stamps = sorted(stamps)
    return 1 + sum(1 for a, b in zip(stamps, stamps[1:]) if b - a > gap)


def measure_heartbeats(endpoint_url: str, specs: list[Spec], hold: float) -> dict[str, Any]:
    """Each contender holds one key, all at once, for ``hold`` s doing nothing: the calls
    its background renewals make, grouped into heartbeats (bursts)."""
    import threading

    out: dict[str, Any] = {}
    errors: list[str] = []

    def hold_one(spec: Spec) -> None:
        contender = make_contender(spec, endpoint_url)
        try:
            lane = contender.lane(0)
            key = f"hb-{spec.name}-{uuid.uuid4().hex[:6]}"
            handle = lane.acquire(key, 0)
            if handle is None:
                raise BenchError(f"{spec.name}: a free key was busy")
            contender.counter.take()
            time.sleep(hold)
            calls, stamps = contender.counter.take_stamps()
            lane.release(handle)
            beats = _bursts(stamps, (spec.heartbeat or 1.0) / 2)
            total = sum(calls.values())
            out[spec.name] = {
                "held_s": hold,
                "period_s": spec.heartbeat,
                "calls": calls,
                "heartbeats": beats,
                "calls_per_heartbeat": total / beats if beats else None,
                "calls_per_hour_per_lease": (3600.0 / spec.heartbeat) * (total / beats)
                if beats and spec.heartbeat
                else None,
            }
        except Exception as exc:
            errors.append(f"{spec.name}: {type(exc).__name__}: {exc}")
        finally:
            close_quietly(contender)

    threads = [threading.Thread(target=hold_one, args=(spec,), daemon=True) for spec in specs if spec.heartbeat]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(hold + 30)
    for spec in specs:
        if not spec.heartbeat:
            out[spec.name] = {"none": True}
    if errors:
        raise BenchError("; ".join(errors))
    return out


# -- 3. uncontended throughput -------------------------------------------------------------


def measure_uncontended(
    endpoint_url: str, specs: list[Spec], threads: int, rounds: int, round_seconds: float, round_cap: float
) -> dict[str, Any]:
    """``threads`` threads, each on its own key, acquire+release in a loop. The
    contenders' rounds are interleaved (order rotated and reversed every other round)
    so that drift in the machine's load hits all alike; medians over the rounds."""
    run_id = uuid.uuid4().hex[:6]
    contenders = {spec.name: make_contender(spec, endpoint_url) for spec in specs}

    def cycles_of(contender: Contender) -> Callable[[int], Callable[[], None]]:
        def make_cycle(index: int) -> Callable[[], None]:
            lane = contender.lane(index)
            key = f"u{threads}-{contender.spec.name}-{run_id}-{index}"
            lane.prepare(key)

            def cycle() -> None:
                handle = lane.acquire(key, 0)
                if handle is None:
                    raise BenchError(f"{contender.spec.name}: own key busy")
                lane.release(handle)

            return cycle

        return make_cycle

    names = [spec.name for spec in specs]
    per_round: dict[str, int] = {}
    rounds_of: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    try:
        for name in names:  # warm-up (connections, items, lanes) and calibration of N
            make_cycle = cycles_of(contenders[name])
            run_round(make_cycle, threads, 5 * threads, 5.0)
            calibration = run_round(make_cycle, threads, 100_000, min(round_seconds, 0.5))
            n = int(max(5 * threads, min(20_000, calibration["rate"] * round_seconds)))
            per_round[name] = n - n % threads
        for index in range(rounds):
            for name in rotated(names, index):
                rounds_of[name].append(run_round(cycles_of(contenders[name]), threads, per_round[name], round_cap))
    finally:
        for contender in contenders.values():
            close_quietly(contender)
    out: dict[str, Any] = {"threads": threads, "rounds": rounds, "contenders": {}}
    for name in names:
        rates = [r["rate"] for r in rounds_of[name]]
        out["contenders"][name] = {
            "cycles_per_round": per_round[name],
            "rounds": rounds_of[name],
            "median": median(rates),
            "min": min(rates) if rates else None,
            "max": max(rates) if rates else None,
            "cpu_us_per_cycle": median([r["cpu_us_per_cycle"] for r in rounds_of[name] if r["cpu_us_per_cycle"]]),
        }
    if "dynlock" in rounds_of and "floor" in rounds_of:
        out["paired_ratio_vs_floor"] = [a["rate"] / b["rate"] for a, b in zip(rounds_of["dynlock"], rounds_of["floor"])]
    return out


# -- 3b. round trip of one UpdateItem, idle ------------------------------------------------


def measure_rtt(endpoint_url: str, calls: int, cap: float = 15.0) -> dict[str, Any]:
    """The floor's acquire and release, one after the other on one key: the round trip
    of the engine's UpdateItems on an idle server (the contended limit's RTT)."""
    floor = Floor(endpoint_url, merge_client_config(None))
    acquires: list[float] = []
    releases: list[float] = []
    try:
        floor.cycle("rtt")  # warm-up
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


# -- 3c. what each request costs the server -----------------------------------------------

MINIMAL_ACQUIRE_CONDITION = "attribute_not_exists(#owner) OR #owner = :me"
MINIMAL_ACQUIRE_UPDATE = "SET #owner = :me, #fence = if_not_exists(#fence, :base) + :one"


def request_kind(operation: str, params: dict[str, Any], status: int) -> str:
    """Which of the library's requests this is, by its operation and update expression."""
    update = params.get("UpdateExpression", "")
    if operation != "UpdateItem":
        return operation
    if update.startswith("SET #owner"):
        return "acquire" if status < 300 else "acquire, busy key (condition fails)"
    if "#break_reason" in update:
        return "break"
    if "REMOVE #owner" in update:
        return "release"
    if update.startswith("SET #rvn = :rvn, #seq"):
        return "renew (heartbeat, extend)"
    return f"UpdateItem {update.split(',')[0]}"


class RequestTimer:
    """Times every request a boto3 client sends, from botocore's ``before-call`` to its
    ``after-call`` (signing, the round trip and parsing the reply; not building the
    request), under ``kind(operation, body, status)``: ``request_kind`` by default."""

    def __init__(self, boto: Any, kind: Callable[[str, dict[str, Any], int], str] = request_kind) -> None:
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self.kind = kind
        self.events = boto.meta.events
        self.events.register("before-call.dynamodb", self._before)
        self.events.register("after-call.dynamodb", self._after)

    def _before(self, context: dict[str, Any], params: dict[str, Any], **_: Any) -> None:
        context["bench_started"] = time.perf_counter()
        context["bench_body"] = params.get("body")

    def _after(self, context: dict[str, Any], model: Any, http_response: Any, **_: Any) -> None:
        import json

        took = time.perf_counter() - context.pop("bench_started")
        body = context.pop("bench_body") or b"{}"
        self.times[self.kind(model.name, json.loads(body), http_response.status_code)].append(took)

    def close(self) -> None:
        self.events.unregister("before-call.dynamodb", self._before)
        self.events.unregister("after-call.dynamodb", self._after)


def measure_request_costs(endpoint_url: str, rounds: int = 6, per_round: int = 20) -> dict[str, Any]:
    """Median time of each request the library sends, beside the simplest lock's requests
    and variants of the acquire that leave out parts of its expressions.

    Rounds alternate between the library's cycle and the raw variants (ABBA), on one
    client each, so the server's drift hits all alike. The library's cycle: acquire,
    extend (a renewal), a failed try_acquire from a second client, get, release; then
    an operator's break of a held key. Every request, the library's and the raw ones, is
    timed by the same botocore hooks (``RequestTimer``).
    """
    run_id = uuid.uuid4().hex[:6]
    lib, rival, operator = (make_client(endpoint_url) for _ in range(3))
    timer = RequestTimer(lib.boto)
    rival_timer, operator_timer = RequestTimer(rival.boto), RequestTimer(operator.boto)
    floor = Floor(endpoint_url, merge_client_config(None))
    raw = raw_client(endpoint_url)
    # The raw requests are timed by the same hooks as the library's, under the name of
    # the variant being sent; the floor's releases are not counted.
    label: list[str | None] = [None]
    raw_timers = [RequestTimer(c, lambda *_: label[0] or "untimed") for c in (floor.boto, raw)]

    def timed(name: str, call: Callable[[], Any]) -> Any:
        label[0] = name
        try:
            return call()
        finally:
            label[0] = None

    def library_round() -> None:
        key = f"req-lib-{run_id}"
        for _ in range(per_round):
            lease = lib.acquire(key)
            lease.extend()
            if rival.try_acquire(key) is not None:
                raise BenchError("a second client acquired a held key")
            lib.get(key)
            lease.release()
        # held by the floor (the engine's own acquire, sent raw): no lease in this process
        # to learn of the break and warn about it
        floor.acquire(f"req-break-{run_id}")
        if not operator.break_lease(f"req-break-{run_id}", reason="bench"):
            raise BenchError("the operator's break found nothing to break")

    def raw_round() -> None:
        key = f"req-raw-{run_id}"
        for _ in range(per_round):
            for name, condition, update in (
                ("acquire, minimal condition", MINIMAL_ACQUIRE_CONDITION, None),
                ("acquire, minimal update", None, MINIMAL_ACQUIRE_UPDATE),
                ("acquire, minimal update and condition", MINIMAL_ACQUIRE_CONDITION, MINIMAL_ACQUIRE_UPDATE),
            ):
                owner, token = timed(name, lambda: floor.acquire(key, condition, update))  # noqa: B023 (called in this iteration)
                floor.release(key, owner, token)
            # The simplest lock (python-dynamodb-lock's and dyndbmutex's shape): a
            # conditional PutItem of the whole item and a conditional DeleteItem.
            simple = {"key": {"S": f"{key}-put"}, "owner": {"S": "me"}, "expires_at": {"N": "1"}}
            timed(
                "PutItem, attribute_not_exists",
                lambda: raw.put_item(
                    TableName=TABLE,
                    Item=simple,  # noqa: B023 (called in this iteration)
                    ConditionExpression="attribute_not_exists(#k)",
                    ExpressionAttributeNames={"#k": "key"},
                ),
            )
            timed(
                "DeleteItem, owner = :me",
                lambda: raw.delete_item(
                    TableName=TABLE,
                    Key={"key": simple["key"]},  # noqa: B023 (called in this iteration)
                    ConditionExpression="#o = :me",
                    ExpressionAttributeNames={"#o": "owner"},
                    ExpressionAttributeValues={":me": {"S": "me"}},
                ),
            )
            for name, item_key in (
                ("UpdateItem, one attribute, owner = :me", f"{key}-one"),
                ("UpdateItem, one attribute, on the lock's item", key),
            ):
                # the second: the item the acquires above wrote (slots, ring, holder), to
                # tell the item's size from the expression's cost
                timed(
                    name,
                    lambda k=item_key: raw.update_item(
                        TableName=TABLE,
                        Key={"key": {"S": k}},
                        UpdateExpression="SET #x = :me",
                        ConditionExpression="attribute_not_exists(#x) OR #x = :me",
                        ExpressionAttributeNames={"#x": "bench_x"},
                        ExpressionAttributeValues={":me": {"S": "me"}},
                    ),
                )

    try:
        library_round()  # warm-up: connections, the server's code paths
        raw_round()
        for timer_ in (timer, rival_timer, operator_timer, *raw_timers):
            timer_.times.clear()
        for index in range(rounds):
            for do in (library_round, raw_round) if index % 2 == 0 else (raw_round, library_round):
                do()
    finally:
        for timer_ in (timer, rival_timer, operator_timer, *raw_timers):
            timer_.close()
        for client in (lib, rival, operator):
            client.close()
        floor.close()
        raw.close()

    def merged(timers: list[RequestTimer]) -> dict[str, dict[str, float]]:
        times: dict[str, list[float]] = collections.defaultdict(list)
        for timer_ in timers:
            for kind, values in timer_.times.items():
                times[kind] += values
        return {
            kind: {"median_ms": median(v) * 1000, "n": len(v)} for kind, v in sorted(times.items()) if kind != "untimed"
        }

    return {
        "library": merged([timer, rival_timer, operator_timer]),
        "raw": merged(raw_timers),
        "engine_condition": Floor.ACQUIRE_CONDITION,
        "minimal_condition": MINIMAL_ACQUIRE_CONDITION,
        "engine_update": Floor.ACQUIRE_EXPRESSION,
        "minimal_update": MINIMAL_ACQUIRE_UPDATE,
    }


# -- 4. handoff latency ------------------------------------------------------------------------


def handoff_holder(spec: Spec, endpoint_url: str, conn: Any, max_messages: int) -> None:
    """Child: acquire on request, release on request (time.time() taken just before)."""
    with child_lane(spec, endpoint_url, conn) as (_, lane):
        conn.send(("ready",))
        handle = None
        for _ in range(max_messages):
            if not conn.poll(CHILD_REPLY_TIMEOUT * 4):
                return
            message = conn.recv()
            if message[0] == "acquire":
                lane.prepare(message[1])
                handle = lane.acquire(message[1], 5.0)
                if handle is None:
                    raise BenchError("holder could not get a free key")
                conn.send(("held",))
            elif message[0] == "release" and handle is not None:
                sent = time.time()
                lane.release(handle)
                conn.send(("released", sent))
                handle = None
            else:
                return


def waiter_child(spec: Spec, endpoint_url: str, conn: Any, max_messages: int, idle_timeout: float) -> None:
    """Child: on request, block in acquire (with wait) and report when it returned."""
    with child_lane(spec, endpoint_url, conn) as (contender, lane):
        conn.send(("ready",))
        for _ in range(max_messages):
            if not conn.poll(idle_timeout):
                return
            message = conn.recv()
            if message[0] != "wait":
                return
            _, key, wait = message
            lane.prepare(key)
            contender.counter.take()
            conn.send(("waiting", time.time()))
            handle = lane.acquire(key, wait)
            got = time.time()
            calls = contender.counter.take()
            if handle is None:
                conn.send(("timeout", got, calls))
                continue
            lane.release(handle)
            conn.send(("got", got, calls))


def handoff_waiter(spec: Spec, endpoint_url: str, conn: Any, max_messages: int) -> None:
    waiter_child(spec, endpoint_url, conn, max_messages, CHILD_REPLY_TIMEOUT * 4)


def measure_handoff(
    endpoint_url: str,
    spec: Spec,
    ctx: Any,
    samples: int,
    cap: float,
    hold: tuple[float, float] = (0.1, 0.2),
    wait: float = 12.0,
) -> dict[str, Any]:
    holder_conn, holder_child = ctx.Pipe()
    waiter_conn, waiter_child = ctx.Pipe()
    max_messages = 4 * samples + 10
    processes = [
        ctx.Process(target=handoff_holder, args=(spec, endpoint_url, holder_child, max_messages), daemon=True),
        ctx.Process(target=handoff_waiter, args=(spec, endpoint_url, waiter_child, max_messages), daemon=True),
    ]
    rng = random.Random(1234)
    rows: list[dict[str, Any]] = []
    timeouts = 0
    run_id = uuid.uuid4().hex[:6]
    began = time.monotonic()
    try:
        for process in processes:
            process.start()
        expect(holder_conn, "ready", CHILD_START_TIMEOUT)
        expect(waiter_conn, "ready", CHILD_START_TIMEOUT)
        stop_at = time.monotonic() + cap
        for index in range(samples):
            if time.monotonic() >= stop_at:
                break
            key = f"handoff-{spec.name}-{run_id}-{index}"
            holder_conn.send(("acquire", key))
            expect(holder_conn, "held")
            waiter_conn.send(("wait", key, wait))
            expect(waiter_conn, "waiting")
            held = rng.uniform(*hold)
            time.sleep(held)
            holder_conn.send(("release",))
            _, sent = expect(holder_conn, "released")
            message = expect(waiter_conn, ("got", "timeout"), wait + CHILD_REPLY_TIMEOUT)
            if message[0] == "timeout":
                timeouts += 1
                continue
            _, got, calls = message
            rows.append(
                {
                    "latency_ms": (got - sent) * 1000,
                    "held_ms": held * 1000,
                    "waiter_calls": calls,
                    "waiter_calls_total": sum(calls.values()),
                }
            )
    finally:
        stop_children(processes, [holder_conn, waiter_conn])
    latencies = [r["latency_ms"] for r in rows]
    return {
        "samples": rows,
        "n": len(rows),
        "n_planned": samples,
        "capped": len(rows) + timeouts < samples,
        "timeouts": timeouts,
        "seconds": time.monotonic() - began,
        "hold_range_ms": [x * 1000 for x in hold],
        **latency_summary(latencies),
        "waiter_calls_median": median([r["waiter_calls_total"] for r in rows]),
    }


# -- 5. contended throughput ------------------------------------------------------------------


def contended_worker(spec: Spec, endpoint_url: str, key: str, hold: float, conn: Any) -> None:
    """Child: acquire -> sleep(hold) -> release on one key until the window ends."""
    with child_lane(spec, endpoint_url, conn) as (contender, lane):
        lane.prepare(key)
        conn.send(("ready", os.getpid()))
        if not conn.poll(CHILD_START_TIMEOUT * 2):
            return
        _, start_at, end_at = conn.recv()
        time.sleep(max(0.0, min(start_at - time.time(), 10.0)))
        contender.counter.take()
        sections = []
        for _ in range(int((end_at - start_at) / max(hold, 0.001)) + 10):
            tried = time.time()
            if tried >= end_at:
                break
            handle = lane.acquire(key, end_at - tried)
            if handle is None:
                break
            acquired = time.time()
            time.sleep(hold)
            releasing = time.time()
            lane.release(handle)
            released = time.time()
            sections.append((lane.token(handle), tried, acquired, releasing, released))
        calls = contender.counter.take()
        conn.send(("result", os.getpid(), sections, calls))


def measure_contended(
    endpoint_url: str, spec: Spec, ctx: Any, procs: int, hold: float, window: float, rtt_ms: float | None
) -> dict[str, Any]:
    key = f"contended-{spec.name}-{uuid.uuid4().hex[:6]}"
    pairs = [ctx.Pipe() for _ in range(procs)]
    processes = [
        ctx.Process(target=contended_worker, args=(spec, endpoint_url, key, hold, child), daemon=True)
        for _, child in pairs
    ]
    results = []
    try:
        for process in processes:
            process.start()
        for conn, _ in pairs:
            expect(conn, "ready", CHILD_START_TIMEOUT)
        start_at = time.time() + 0.3
        end_at = start_at + window
        for conn, _ in pairs:
            conn.send(("go", start_at, end_at))
        for conn, _ in pairs:
            results.append(expect(conn, "result", window + 60))
    finally:
        stop_children(processes, [conn for conn, _ in pairs])

    sections = []  # (tried, acquired, releasing, released, pid, token)
    per_process = []
    calls: collections.Counter[str] = collections.Counter()
    for _, pid, mine, worker_calls in results:
        inside = [(s[1], s[2], s[3], s[4], pid, s[0]) for s in mine if start_at <= s[2] < end_at]
        per_process.append(len(inside))
        sections.extend(inside)
        calls.update(worker_calls)
    sections.sort(key=lambda s: s[1])
    overlaps = sum(1 for a, b in zip(sections, sections[1:]) if b[1] < a[2])
    tokens = [s[5] for s in sections if s[5] is not None]
    duplicate_tokens = len(tokens) - len(set(tokens)) if tokens else None
    waits = [(s[1] - s[0]) * 1000 for s in sections]
    gaps = [(b[1] - a[2]) * 1000 for a, b in zip(sections, sections[1:])]
    same = [(b[1] - a[2]) * 1000 for a, b in zip(sections, sections[1:]) if a[4] == b[4]]
    other = [(b[1] - a[2]) * 1000 for a, b in zip(sections, sections[1:]) if a[4] != b[4]]
    release_rtts = [(s[3] - s[2]) * 1000 for s in sections]
    rate = len(sections) / window
    limit = 1.0 / (hold + 2 * rtt_ms / 1000.0) if rtt_ms else None
    loaded_rtt = percentile(release_rtts, 50)
    counts = sorted(per_process)
    return {
        "processes": procs,
        "hold_ms": hold * 1000,
        "window_s": window,
        "sections": len(sections),
        "sections_per_s": rate,
        "rtt_ms_used": rtt_ms,
        "limit_per_s": limit,
        "ratio": rate / limit if limit else None,
        "per_process": counts,
        "fairness_jain": jain(counts),
        "overlaps": overlaps,
        "duplicate_tokens": duplicate_tokens,
        "acquire_wait_p50_ms": percentile(waits, 50),
        "acquire_wait_p95_ms": percentile(waits, 95),
        "acquire_wait_max_ms": max(waits) if waits else None,
        "gap_p50_ms": percentile(gaps, 50),
        "gap_p95_ms": percentile(gaps, 95),
        "reacquired_by_releaser": len(same) / len(gaps) if gaps else None,
        "gap_same_process_p50_ms": percentile(same, 50),
        "gap_other_process_p50_ms": percentile(other, 50),
        "release_rtt_under_load_p50_ms": loaded_rtt,
        "limit_under_load_per_s": 1.0 / (hold + 2 * loaded_rtt / 1000.0) if loaded_rtt else None,
        "hold_measured_p50_ms": percentile([(s[2] - s[1]) * 1000 for s in sections], 50),
        "calls": dict(calls),
        "calls_per_section": sum(calls.values()) / len(sections) if sections else None,
    }


def combine_handoff(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool the samples of interleaved blocks into one distribution."""
    rows = [row for block in blocks for row in block["samples"]]
    latencies = [r["latency_ms"] for r in rows]
    return {
        "samples": rows,
        "n": len(rows),
        "blocks": len(blocks),
        "block_p50_ms": [b["p50_ms"] for b in blocks],
        "n_planned": sum(b["n_planned"] for b in blocks),
        "capped": any(b["capped"] for b in blocks),
        "timeouts": sum(b["timeouts"] for b in blocks),
        "seconds": sum(b["seconds"] for b in blocks),
        "hold_range_ms": blocks[0]["hold_range_ms"] if blocks else None,
        **latency_summary(latencies),
        "waiter_calls_median": median([r["waiter_calls_total"] for r in rows]),
    }


def combine_contended(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over interleaved windows (sums for counts)."""
    out: dict[str, Any] = {"rounds": rounds, "windows": len(rounds)}
    first = rounds[0]
    for key, value in first.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in rounds if r.get(key) is not None]
            out[key] = median(values) if values else None
    for key in ("sections", "overlaps"):
        out[key] = sum(r[key] for r in rounds)
    tokens = [r["duplicate_tokens"] for r in rounds if r["duplicate_tokens"] is not None]
    out["duplicate_tokens"] = sum(tokens) if tokens else None
    out["window_s"] = first["window_s"]
    out["window_total_s"] = sum(r["window_s"] for r in rounds)
    calls: collections.Counter[str] = collections.Counter()
    for r in rounds:
        calls.update(r["calls"])
    out["calls"] = dict(calls)
    out["calls_per_section"] = sum(calls.values()) / out["sections"] if out["sections"] else None
    out["per_process"] = [min(r["per_process"][0] for r in rounds), max(r["per_process"][-1] for r in rounds)]
    out["rates"] = [r["sections_per_s"] for r in rounds]
    return out


# -- 6. crash takeover --------------------------------------------------------------------------


def crash_holder(spec: Spec, endpoint_url: str, key: str, conn: Any) -> None:
    """Child: acquire ``key``, say so, then idle (heartbeats running) until killed."""
    with child_lane(spec, endpoint_url, conn) as (_, lane):
        lane.prepare(key)
        handle = lane.acquire(key, 5.0)
        if handle is None:
            raise BenchError("crash holder: key busy")
        conn.send(("held", time.time()))
        for _ in range(600):  # bounded: the orchestrator kills us long before
            time.sleep(0.2)


def crash_waiter(spec: Spec, endpoint_url: str, conn: Any, max_messages: int) -> None:
    """Child: wait for a key already held by a holder that will be killed."""
    waiter_child(spec, endpoint_url, conn, max_messages, CHILD_REPLY_TIMEOUT * 6)


@contextlib.contextmanager
def _killed_holder(
    spec: Spec, endpoint_url: str, ctx: Any, key: str, delay: float, when_held: Callable[[], None] = lambda: None
) -> Iterator[tuple[float, float]]:
    """A holder process that acquires ``key`` and is SIGKILLed ``delay`` s later (after
    ``when_held()``); yields the wall times of its acquire and of the kill."""
    holder_conn, holder_child = ctx.Pipe()
    holder = ctx.Process(target=crash_holder, args=(spec, endpoint_url, key, holder_child), daemon=True)
    try:
        holder.start()
        _, acquired = expect(holder_conn, "held", CHILD_START_TIMEOUT)
        when_held()
        time.sleep(max(0.0, acquired + delay - time.time()))
        killed = time.time()
        os.kill(holder.pid, signal.SIGKILL)  # our own child, by its pid
        holder.join(10)
        yield acquired, killed
    finally:
        if holder.is_alive():
            holder.kill()
            holder.join(5)


@dataclass(frozen=True)
class CrashTrials:
    """What a crash measurement does: ``trials`` holders configured as ``spec``, each
    SIGKILLed ``kill_after`` s (uniformly within the range) after it acquired; ``cap``:
    seconds after which no further trial starts (a waiter), or after the kill the fresh
    processes give up (one-shot)."""

    spec: Spec
    trials: int
    kill_after: tuple[float, float]
    cap: float


def measure_crash(
    endpoint_url: str, plan: CrashTrials, ctx: Any, say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """A holder acquires with the crash lease, is SIGKILLed ``kill_after`` s later; a waiter
    (another process, already waiting) reports when it got the key. Takeover = its
    time.time() then minus ours just before the kill."""
    spec, trials, kill_after, cap = plan.spec, plan.trials, plan.kill_after, plan.cap
    lease = spec.lease or 0.0
    wait = lease + 20.0
    waiter_conn, waiter_child = ctx.Pipe()
    waiter = ctx.Process(target=crash_waiter, args=(spec, endpoint_url, waiter_child, 4 * trials + 4), daemon=True)
    rng = random.Random(99)
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    run_id = uuid.uuid4().hex[:6]
    began = time.monotonic()
    try:
        waiter.start()
        expect(waiter_conn, "ready", CHILD_START_TIMEOUT)
        for index in range(trials):
            if index and time.monotonic() - began >= cap:
                break
            key = f"crash-{spec.name}-{run_id}-{index}"

            def start_waiting(key: str = key) -> None:
                waiter_conn.send(("wait", key, wait))
                expect(waiter_conn, "waiting")

            with _killed_holder(spec, endpoint_url, ctx, key, rng.uniform(*kill_after), start_waiting) as (
                acquired,
                killed,
            ):
                message = expect(waiter_conn, ("got", "timeout"), wait + CHILD_REPLY_TIMEOUT)
                if message[0] == "timeout":
                    errors.append(f"trial {index}: waiter timed out after {wait:g} s")
                    continue
                _, got, calls = message
                rows.append(
                    {
                        "takeover_s": got - killed,
                        "held_before_kill_s": killed - acquired,
                        "from_acquire_s": got - acquired,
                        "waiter_calls": calls,
                        "waiter_calls_total": sum(calls.values()),
                    }
                )
                if say:
                    say(f"    {spec.name}: crash trial {index + 1}: takeover {got - killed:.2f} s")
    finally:
        stop_children([waiter], [waiter_conn])
    return _takeovers(spec, rows, errors, kill_after, targets.CRASH_TAKEOVER)


def _takeovers(
    spec: Spec, rows: list[dict[str, Any]], errors: list[str], kill_after: tuple[float, float], target: targets.Target
) -> dict[str, Any]:
    """The trials of a crash measurement and their takeover times, against ``target``
    (seconds after the lease)."""
    lease = spec.lease or 0.0
    takeovers = [r["takeover_s"] for r in rows]
    return {
        "lease_s": lease,
        "heartbeat_s": spec.heartbeat,
        "settings": spec.describe(),
        "trials": rows,
        "n": len(rows),
        "errors": errors,
        "kill_after_s": list(kill_after),
        "median_s": median(takeovers),
        "min_s": min(takeovers) if takeovers else None,
        "max_s": max(takeovers) if takeovers else None,
        "target_s": lease + target.bound,
    }


def crash_one_shot(spec: Spec, endpoint_url: str, key: str, conn: Any) -> None:
    """Child: a fresh process (a cron run, a new worker) that makes one attempt on ``key``."""
    with child_lane(spec, endpoint_url, conn) as (_, lane):
        lane.prepare(key)
        sent = time.time()
        handle = lane.acquire(key, 0.0)
        conn.send(("tried", sent, handle is not None))
        if handle is not None:
            lane.release(handle)


def measure_crash_one_shot(
    endpoint_url: str, plan: CrashTrials, ctx: Any, say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """A holder is SIGKILLed; then fresh processes, one after another, each make one attempt
    until one gets the key (or ``cap`` seconds pass). Takeover = the send time of the
    winning attempt minus the kill time; ``attempts`` = how many processes it took."""
    spec, trials, kill_after, cap = plan.spec, plan.trials, plan.kill_after, plan.cap
    rng = random.Random(7)
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    run_id = uuid.uuid4().hex[:6]
    for index in range(trials):
        key = f"oneshot-{spec.name}-{run_id}-{index}"
        with _killed_holder(spec, endpoint_url, ctx, key, rng.uniform(*kill_after)) as (acquired, killed):
            got = None
            for attempt in range(1, 1000):  # noqa: B007 (read after the loop) bounded by cap: each is a process start
                conn, child = ctx.Pipe()
                one = ctx.Process(target=crash_one_shot, args=(spec, endpoint_url, key, child), daemon=True)
                one.start()
                _, sent, won = expect(conn, "tried", CHILD_START_TIMEOUT)
                one.join(10)
                if won:
                    got = sent
                    break
                if time.time() - killed >= cap:
                    break
            if got is None:
                errors.append(f"trial {index}: no fresh process got the key within {cap:g} s ({attempt} tried)")
                continue
            rows.append({"takeover_s": got - killed, "attempts": attempt, "held_before_kill_s": killed - acquired})
            if say:
                say(
                    f"    {spec.name}: one-shot crash trial {index + 1}: takeover {got - killed:.2f} s ({attempt} processes)"
                )
    # The promise counts from the holder's last write, which was before the kill.
    return {**_takeovers(spec, rows, errors, kill_after, targets.CRASH_ONE_SHOT), "cap_s": cap}


CRASH_SPECS = {spec.name: crash_spec(spec) for spec in (DYNLOCK, PDL_FASTEST, MUTEX, PDL_DEFAULT)}

__all__ = [
    "CRASH_SPECS",
    "CrashTrials",
    "combine_contended",
    "combine_handoff",
    "measure_calls",
    "measure_contended",
    "measure_crash",
    "measure_crash_one_shot",
    "measure_dynlock_calls",
    "measure_handoff",
    "measure_heartbeats",
    "measure_request_costs",
    "measure_rtt",
    "measure_uncontended",
]
