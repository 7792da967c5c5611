"""``python -m bench.waiting``: what waiting costs (issue 28's benchmark section).

django-dynlock alone, against a DynamoDB Local this script starts (loopback), with the
library's default settings (lease 30 s, heartbeat 10 s, its botocore retries). Every
waiter and poller is a process of its own (threads sharing a client count as one poller).

1. ``rates``: requests per second of one waiting process against how long the key has
   been held (one holder in this process holds for ``--holds`` seconds; the waiter asks
   with ``wait`` = hold + 5 s), and how soon after the release it returns.
2. ``hot``: ``--pollers`` processes (default 1, 6, 12, 24) loop acquire, a 5 ms section,
   release on one key for ``--window`` seconds: sections/s, reads and requests per
   completed section, Jain's fairness over the processes' section counts.
3. ``throttled``: 4 waiters poll a key held by this process, through the fault proxy:
   unthrottled; with the key's token bucket (localdynamo/partitions.py) at half of the
   waiters' unthrottled read rate (0.1 s of burst); and with half of their requests
   throttled at random. Requests are counted at the proxy (every HTTP request,
   botocore's retries included).
4. ``cost``: request units and dollars per acquire (uncontended acquire + release, and a
   contended section from ``hot``), per renewal and per waiter-hour (from ``rates``), at
   AWS on-demand prices in us-east-1 since November 2024: $0.625 per million write
   request units, $0.125 per million read request units (a strongly consistent read of an
   item up to 4 KB is one read unit; a write of an item up to 1 KB one write unit, also
   when its condition fails).

It prints markdown tables and issue 28's targets (bench/targets.py) met or missed, writes
bench/results/waiting-<timestamp>.json and the plot docs/img/bench-waiting.png. Every
loop is bounded in count and time. The same section is the ``waiting`` phase of
``python -m bench`` (``measure``, ``markdown`` and ``plot`` below); this command keeps
its own knobs.

    python -m bench.waiting                      # about 3 minutes
    python -m bench.waiting --quick              # shorter holds and windows
    python -m bench.waiting --only hot --pollers 24
    python -m bench.waiting --replot rates.json hot.json   # runs of different phases, joined
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.children import BenchError, expect, quiet_engine_logs, send_error, stop_children
from bench.clients import make_client, start_local_server
from bench.contenders import EventCounter
from bench.output import IMG_DIR, REPO_ROOT, write_results
from bench.stats import jain
from bench.targets import (
    HOT_FAIRNESS,
    HOT_READS_PER_SECTION,
    HOT_SECTIONS_PER_S,
    THROTTLED_VS_UNTHROTTLED,
    WAIT_HANDOFF_BOUND,
    WAIT_LONG_HOLD_REQUESTS,
    Target,
)
from django_dynlock.engine import ClientOptions
from localdynamo.faultproxy import FaultProxy
from localdynamo.partitions import Partitions

# AWS on-demand prices, us-east-1, since 2024-11-01 (AWS halved them that day).
PRICE_DATE = "2024-11-01"
WRITE_PRICE = 0.625 / 1e6  # dollars per write request unit
READ_PRICE = 0.125 / 1e6  # dollars per read request unit
SECTION = 0.005  # the hot key's critical section
DEFAULTS = {"lease_duration": ClientOptions.lease_duration, "heartbeat_period": ClientOptions.heartbeat_period}
READ_OPS = ("GetItem", "BatchGetItem")
WRITE_OPS = ("UpdateItem", "PutItem", "DeleteItem")  # one key at a time here: no transactions


def units(calls: dict[str, int]) -> tuple[float, float]:
    """(read units, write units) of the calls, for items under 1 KB, consistent reads."""
    reads = sum(calls.get(op, 0) for op in READ_OPS)
    writes = sum(calls.get(op, 0) for op in WRITE_OPS)
    return float(reads), float(writes)


def dollars(read_units: float, write_units: float) -> float:
    return read_units * READ_PRICE + write_units * WRITE_PRICE


# -- the child process --------------------------------------------------------------------


def child(table: str, conn: Any) -> None:
    """One waiter or poller process: a client per endpoint, its calls counted; obeys the parent."""
    quiet_engine_logs()
    clients: dict[str, Any] = {}
    counter = EventCounter()

    def client_for(endpoint: str) -> Any:
        if endpoint not in clients:
            clients[endpoint] = make_client(endpoint, table_name=table, **DEFAULTS)
            counter.attach(clients[endpoint].boto.meta.events)
        return clients[endpoint]

    try:
        conn.send(("ready", os.getpid()))
        while True:
            message = conn.recv()
            if message[0] == "stop":
                break
            if message[0] == "wait":
                _, endpoint, key, wait = message
                client = client_for(endpoint)
                counter.take()
                started = time.time()
                try:
                    lease = client.acquire(key, wait=wait)
                    outcome, returned = "acquired", time.time()
                    calls = counter.take()
                    lease.release()
                except Exception as exc:  # OverflowError on today's engine: a figure, not a crash
                    outcome, returned = type(exc).__name__, time.time()
                    calls = counter.take()
                conn.send(("waited", outcome, started, returned, calls))
            elif message[0] == "sections":
                _, endpoint, key, start_at, window = message
                client = client_for(endpoint)
                time.sleep(max(0.0, start_at - time.time()))
                counter.take()
                end, sections = start_at + window, 0
                while (left := end - time.time()) > 0:
                    try:
                        lease = client.acquire(key, wait=left)
                    except Exception:
                        break
                    counted = time.time() < end
                    time.sleep(SECTION)
                    lease.release()
                    sections += counted
                conn.send(("sections", sections, counter.take()))
    except Exception:
        send_error(conn)
    finally:
        for client in clients.values():
            client.close()


class Children:
    def __init__(self, ctx: Any, count: int, table: str):
        self.processes, self.conns = [], []
        for _ in range(count):
            parent, kid = ctx.Pipe()
            process = ctx.Process(target=child, args=(table, kid), daemon=True)
            process.start()
            self.processes.append(process)
            self.conns.append(parent)
        for conn in self.conns:
            expect(conn, "ready", timeout=120)

    def stop(self) -> None:
        stop_children(self.processes, self.conns)


# -- the measurements --------------------------------------------------------------------


def measure_rates(kids: Children, endpoint: str, table: str, holds: list[float], say: Any) -> list[dict[str, Any]]:
    holder = make_client(endpoint, table_name=table, **DEFAULTS)
    counter = EventCounter()
    counter.attach(holder.boto.meta.events)
    conn = kids.conns[0]
    rows = []
    try:
        for number, hold in enumerate(holds):
            key = f"rates-{number}"
            lease = holder.acquire(key)
            counter.take()
            conn.send(("wait", endpoint, key, hold + 5.0))
            time.sleep(hold)
            renewals = counter.take().get("UpdateItem", 0)
            released = time.time()
            lease.release()
            _, outcome, started, returned, calls = expect(conn, "waited", timeout=hold + 60)
            waited = min(returned, released) - started
            requests = sum(calls.values())
            row = {
                "hold_s": hold,
                "outcome": outcome,
                "waited_s": round(returned - started, 3),
                "requests": requests,
                "calls": calls,
                "requests_per_s": requests / waited if waited > 0 else None,
                "handoff_ms": (returned - released) * 1000 if outcome == "acquired" else None,
                "holder_renewals": renewals,
            }
            say(f"rates: hold {hold:g} s -> {outcome}, {requests} requests, {row['requests_per_s']:.1f}/s")
            rows.append(row)
    finally:
        holder.close()
    return rows


def measure_hot(kids: Children, endpoint: str, pollers: list[int], window: float, say: Any) -> list[dict[str, Any]]:
    rows = []
    for number, count in enumerate(pollers):
        key = f"hot-{number}"
        start_at = time.time() + 1.0
        for conn in kids.conns[:count]:
            conn.send(("sections", endpoint, key, start_at, window))
        replies = [expect(conn, "sections", timeout=window + 60) for conn in kids.conns[:count]]
        per_process = [reply[1] for reply in replies]
        calls: dict[str, int] = {}
        for reply in replies:
            for op, n in reply[2].items():
                calls[op] = calls.get(op, 0) + n
        sections = sum(per_process)
        reads = sum(calls.get(op, 0) for op in READ_OPS)
        requests = sum(calls.values())
        row = {
            "pollers": count,
            "sections": sections,
            "sections_per_s": sections / window,
            "reads_per_section": reads / sections if sections else None,
            "requests_per_section": requests / sections if sections else None,
            "jain": jain(per_process),
            "per_process": per_process,
            "calls": calls,
        }
        say(f"hot: {count} pollers -> {row['sections_per_s']:.1f} sections/s, {row['reads_per_section']} reads each")
        rows.append(row)
    return rows


THROTTLED_PHASES = ("unthrottled", "token bucket", "random 50 %")


def measure_throttled(
    kids: Children, endpoint: str, table: str, waiters: int, window: float, say: Any
) -> dict[str, Any]:
    """Waiters on a held key through the proxy: unthrottled; the key's token bucket at half
    their unthrottled read rate; half their requests throttled at random. Counted at the
    proxy (only the waiters go through it)."""
    holder = make_client(endpoint, table_name=table, **DEFAULTS)
    result: dict[str, Any] = {"waiters": waiters, "window_s": window}
    try:
        with FaultProxy(endpoint, max_seconds=600, max_requests=10**7) as proxy:
            read_rate = None
            for number, phase in enumerate(THROTTLED_PHASES):
                key = f"throttled-{number}"
                limit = None
                if phase == "token bucket":
                    assert read_rate is not None
                    limit = read_rate / 2
                    # A tenth of a second of burst: the window is a few seconds, not DynamoDB's 300.
                    proxy.limit_partitions(Partitions(read_units=limit, write_units=1e9, burst_seconds=0.1))
                elif phase == "random 50 %":
                    proxy.limit_partitions(None)
                    proxy.set_rates({"throttle": 0.5})
                lease = holder.acquire(key)
                before = proxy.stats
                for conn in kids.conns[:waiters]:
                    conn.send(("wait", proxy.endpoint_url, key, window))  # gives up before the release
                outcomes = [expect(conn, "waited", timeout=window + 60)[1] for conn in kids.conns[:waiters]]
                after = proxy.stats
                proxy.set_rates({})
                lease.release()
                sent = after.requests - before.requests
                throttled = sum(after[k] - before[k] for k in ("partition", "throttle"))
                ops = {op: n - before.operations.get(op, 0) for op, n in after.operations.items()}
                if phase == "unthrottled":
                    read_rate = ops.get("GetItem", 0) / window
                result[phase] = {
                    "outcomes": outcomes,
                    "requests": sent,
                    "requests_per_s_per_waiter": sent / window / waiters,
                    "throttled": throttled,
                    "throttled_share": throttled / sent if sent else None,
                    "operations": ops,
                    "read_units_per_s": limit,
                }
                say(f"throttled: {phase} -> {result[phase]['requests_per_s_per_waiter']:.1f} requests/s per waiter")
    finally:
        holder.close()
    base = result["unthrottled"]["requests_per_s_per_waiter"]
    result["ratios"] = {phase: result[phase]["requests_per_s_per_waiter"] / base for phase in THROTTLED_PHASES[1:]}
    return result


def measure_costs(endpoint: str, table: str, cycles: int = 20) -> dict[str, Any]:
    client = make_client(endpoint, table_name=table, **DEFAULTS)
    counter = EventCounter()
    counter.attach(client.boto.meta.events)
    try:
        for number in range(cycles):
            client.acquire(f"cost-{number % 4}").release()
        calls = counter.take()
        lease = client.acquire("cost-size")
        item = client.boto.get_item(
            TableName=table, Key={client.options.key_attribute: {"S": "cost-size"}}, ConsistentRead=True
        )["Item"]
        lease.release()
    finally:
        client.close()
    per_cycle = {op: n / cycles for op, n in calls.items()}
    return {"cycles": cycles, "calls_per_acquire_release": per_cycle, "item_json_bytes": len(json.dumps(item))}


def cost_table(costs: dict[str, Any], rates: list[dict], hot: list[dict]) -> list[dict[str, Any]]:
    """Request units and dollars per operation, by the prices above."""
    rows = []
    r, w = units({op: n for op, n in costs["calls_per_acquire_release"].items()})
    rows.append({"what": "uncontended acquire + release", "read_units": r, "write_units": w})
    rows.append({"what": "one renewal (heartbeat)", "read_units": 0.0, "write_units": 1.0})
    period = DEFAULTS["heartbeat_period"]
    rows.append(
        {
            "what": f"a held lease, per hour (renewal every {period:g} s)",
            "read_units": 0.0,
            "write_units": 3600 / period,
        }
    )
    for row in hot:
        if row["sections"]:
            calls = {op: n / row["sections"] for op, n in row["calls"].items()}
            r, w = units(calls)
            who = "1 poller" if row["pollers"] == 1 else f"{row['pollers']} pollers"
            rows.append({"what": f"a 5 ms section on a key with {who}", "read_units": r, "write_units": w})
    for row in rates:
        if row["requests_per_s"] and row["waited_s"] > 0:
            span = row["waited_s"] if row["outcome"] != "acquired" else row["hold_s"]
            r, w = units({op: n * 3600 / span for op, n in row["calls"].items()})
            rows.append(
                {
                    "what": f"waiter-hour, key held {row['hold_s']:g} s ({row['outcome']})",
                    "read_units": r,
                    "write_units": w,
                }
            )
    for row in rows:
        row["dollars"] = dollars(row["read_units"], row["write_units"])
    return rows


# -- report ---------------------------------------------------------------------------------


def target_figures(results: dict[str, Any]) -> list[tuple[Target, float | None, str]]:
    """Issue 28's targets against this run: (target, figure, how the figure reads)."""
    rows: list[tuple[Target, float | None, str]] = []
    rates = results.get("rates") or []
    long = [r for r in rates if r["hold_s"] >= 40]
    if long:
        r = long[0]
        shown = f"{r['requests']} ({r['outcome']})"
        rows.append((WAIT_LONG_HOLD_REQUESTS, r["requests"] if r["outcome"] == "acquired" else None, shown))
    acquired = [r for r in rates if r["handoff_ms"] is not None]
    if acquired:
        ratios = [r["handoff_ms"] / 1000 / (0.1 + 0.05 * r["hold_s"]) for r in acquired]
        shown = ", ".join(f"{r['hold_s']:g} s: {r['handoff_ms']:.0f} ms" for r in acquired)
        rows.append((WAIT_HANDOFF_BOUND, max(ratios), f"{max(ratios):.2f} ({shown})"))
    hot = [r for r in results.get("hot") or [] if r["pollers"] == 24]
    if hot:
        r = hot[0]
        rps = r["reads_per_section"]
        rows.append((HOT_READS_PER_SECTION, rps, "—" if rps is None else f"{rps:.1f}"))
        rows.append((HOT_SECTIONS_PER_S, r["sections_per_s"], f"{r['sections_per_s']:.1f}"))
        rows.append((HOT_FAIRNESS, r["jain"], "—" if r["jain"] is None else f"{r['jain']:.2f}"))
    throttled = results.get("throttled") or {}
    if "ratios" in throttled:
        ratio = throttled["ratios"]["random 50 %"]
        share = throttled["random 50 %"]["throttled_share"]
        rows.append((THROTTLED_VS_UNTHROTTLED, ratio, f"{ratio:.2f} ({share:.0%} throttled)"))
    return rows


def targets_table(results: dict[str, Any]) -> str:
    rows = target_figures(results)
    if not rows:
        return ""
    machine = results.get("machine", {})
    out = [
        "",
        f"### Issue 28's targets (load average {machine.get('load_at_start', 0):.1f} at the start, "
        f"{machine.get('load_at_end', 0):.1f} at the end)",
        "",
        "| target | measured | met |",
        "|---|---:|---|",
    ]
    for target, value, shown in rows:
        met = target.met(value)
        out.append(f"| {target.label()} | {shown} | {'—' if met is None else 'yes' if met else '**no**'} |")
    return "\n".join(out)


def markdown(results: dict[str, Any]) -> str:
    """The section's tables, and issue 28's targets met or missed."""
    out: list[str] = []
    if results.get("rates"):
        out.append("\n### Requests per second of one waiting process, by hold time\n")
        out.append(
            "| key held s | outcome | waited s | requests | GetItem | UpdateItem | requests/s | handoff ms | holder's renewals |"
        )
        out.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for row in results["rates"]:
            handoff = f"{row['handoff_ms']:.1f}" if row["handoff_ms"] is not None else "—"
            out.append(
                f"| {row['hold_s']:g} | {row['outcome']} | {row['waited_s']:.2f} | {row['requests']} | "
                f"{row['calls'].get('GetItem', 0)} | {row['calls'].get('UpdateItem', 0)} | "
                f"{row['requests_per_s']:.1f} | {handoff} | {row['holder_renewals']} |"
            )
    if results.get("hot"):
        out.append(f"\n### One hot key: pollers (processes) looping {SECTION * 1000:g} ms sections\n")
        out.append("| pollers | sections/s | reads per section | requests per section | Jain's fairness |")
        out.append("|---:|---:|---:|---:|---:|")
        for row in results["hot"]:
            rps = row["reads_per_section"]
            qps = row["requests_per_section"]
            fair = row["jain"]
            out.append(
                f"| {row['pollers']} | {row['sections_per_s']:.1f} | {rps:.1f} | {qps:.1f} | {fair:.2f} |"
                if rps is not None and qps is not None and fair is not None
                else f"| {row['pollers']} | {row['sections_per_s']:.1f} | — | — | — |"
            )
    if results.get("throttled") and "ratios" in results["throttled"]:  # runs before 3 phases: not shown
        t = results["throttled"]
        out.append(f"\n### {t['waiters']} waiters on a held key for {t['window_s']:g} s, through the fault proxy\n")
        out.append(
            "| run | key's read units/s | requests/s per waiter | throttled share | GetItem | UpdateItem | vs unthrottled |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        for phase in THROTTLED_PHASES:
            p = t[phase]
            limit = "—" if p["read_units_per_s"] is None else f"{p['read_units_per_s']:.1f}"
            ratio = "1" if phase == THROTTLED_PHASES[0] else f"{t['ratios'][phase]:.2f}"
            out.append(
                f"| {phase} | {limit} | {p['requests_per_s_per_waiter']:.1f} | {p['throttled_share']:.0%} | "
                f"{p['operations'].get('GetItem', 0)} | {p['operations'].get('UpdateItem', 0)} | {ratio} |"
            )
        out.append("\nissue 28's target: with half the requests throttled, ≤ 0.7 of the unthrottled rate")
    if results.get("cost"):
        out.append(
            f"\n### Request units and dollars (AWS on-demand, us-east-1, since {PRICE_DATE}: "
            f"${WRITE_PRICE * 1e6:.3f}/M write units, ${READ_PRICE * 1e6:.3f}/M read units)\n"
        )
        out.append("| what | read units | write units | dollars |")
        out.append("|---|---:|---:|---:|")
        for row in results["cost"]["table"]:
            out.append(f"| {row['what']} | {row['read_units']:.1f} | {row['write_units']:.1f} | {row['dollars']:.3g} |")
        out.append(f"\n(the lock item, as JSON: {results['cost']['item_json_bytes']} bytes, under 1 KB)")
    out.append(targets_table(results))
    return "\n".join(out)


def plot(results: dict[str, Any], path: Path, before: dict[str, Any] | None = None) -> None:
    """The section's four panels; ``before``: a baseline drawn beside it in grey (see
    bench/baselines/: rates, hot and the throttled requests/s per waiter by phase)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    rates = results.get("rates") or []
    if rates:
        ax = axes[0]
        xs = [r["hold_s"] for r in rates]
        ax.plot(
            xs,
            [r["requests_per_s"] for r in rates],
            "o-",
            label=f"django-dynlock ({results.get('machine', {}).get('commit') or 'this run'})",
        )
        for row in rates + (before or {}).get("rates", []):
            if row["outcome"] != "acquired":
                ax.annotate(
                    row["outcome"],
                    (row["hold_s"], row["requests_per_s"]),
                    textcoords="offset points",
                    xytext=(4, 6),
                    fontsize=8,
                )
        if before and before.get("rates"):
            old = before["rates"]
            ax.plot(
                [r["hold_s"] for r in old],
                [r["requests_per_s"] for r in old],
                "o:",
                color="grey",
                label=f"before ({before['machine']['commit']})",
            )
        ax.axhline(1.0, color="grey", ls="--", lw=1, label="AWS Java lock client (1/s)")
        ax.axhline(0.2, color="grey", ls=":", lw=1, label="python-dynamodb-lock (1 per 5 s)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.set_xlabel("key held (s)")
        ax.set_ylabel("requests/s of one waiting process")
        ax.set_title("cost of waiting vs hold time")
        ax.legend(fontsize=8)
    hot = results.get("hot") or []
    if hot:
        ax = axes[1]
        ax.plot([r["pollers"] for r in hot], [r["reads_per_section"] or 0 for r in hot], "o-", label="reads")
        ax.plot([r["pollers"] for r in hot], [r["requests_per_section"] or 0 for r in hot], "s--", label="all requests")
        old_hot = (before or {}).get("hot") or []
        if old_hot:
            commit = before["machine"]["commit"] if before else ""
            xs_old = [r["pollers"] for r in old_hot]
            ax.plot(xs_old, [r["reads_per_section"] for r in old_hot], "o:", color="grey", label=f"reads, {commit}")
            ax.plot(xs_old, [r["requests_per_section"] for r in old_hot], "s:", color="silver", label=f"all, {commit}")
        ax.set_xlabel("pollers (processes) on one key")
        ax.set_ylabel("per completed 5 ms section")
        ax.set_title("hot key: requests per section")
        ax.legend(fontsize=8)
        ax2 = axes[2]
        ax2.plot([r["pollers"] for r in hot], [r["sections_per_s"] for r in hot], "o-", label="sections/s")
        ax2.plot(
            [r["pollers"] for r in hot], [100 * (r["jain"] or 0) for r in hot], "s--", label="Jain's fairness x100"
        )
        if old_hot:
            ax2.plot(xs_old, [r["sections_per_s"] for r in old_hot], "o:", color="grey", label=f"sections/s, {commit}")
            ax2.plot(xs_old, [100 * r["jain"] for r in old_hot], "s:", color="silver", label=f"Jain x100, {commit}")
        ax2.set_xlabel("pollers (processes) on one key")
        ax2.set_title("hot key: throughput and fairness")
        ax2.legend(fontsize=8)
    throttled = results.get("throttled")
    if throttled and "ratios" in throttled:
        ax = axes[3]
        bars = [throttled[p]["requests_per_s_per_waiter"] for p in THROTTLED_PHASES]
        labels = [f"{p}\n({throttled[p]['throttled_share']:.0%} throttled)" for p in THROTTLED_PHASES]
        ax.bar(labels, bars, color=["C0", "C3", "C1"])
        old_throttled = (before or {}).get("throttled")
        if old_throttled and before:
            ax.plot(
                labels,
                [old_throttled[p] for p in THROTTLED_PHASES],
                "D",
                color="grey",
                label=f"{before['machine']['commit']} (another run)",
            )
            ax.legend(fontsize=8)
        ax.set_ylabel("requests/s per waiter (at the proxy)")
        ax.set_title(f"{throttled['waiters']} waiters, throttled or not")
    fig.suptitle("django-dynlock waiting on DynamoDB Local (bench/waiting.py)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------

PHASES = ("rates", "hot", "throttled", "cost")


def defaults(quick: bool) -> tuple[list[float], list[int], float]:
    """Hold times, poller counts and the hot and throttled window of a full or quick run."""
    holds = [0.5, 2.0, 5.0] if quick else [0.5, 2.0, 5.0, 15.0, 40.0]
    return holds, [1, 6, 12] if quick else [1, 6, 12, 24], 4.0 if quick else 8.0


def joined(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' results as one: each phase from the last run that has it; the load
    averages span them (the lowest start, the highest end), the commits are listed."""
    results: dict[str, Any] = {}
    for run in runs:
        results.update({k: v for k, v in run.items() if k in PHASES or k not in results})
    machines = [run.get("machine", {}) for run in runs]
    if len(runs) > 1:
        results["machine"] = dict(
            machines[-1],
            load_at_start=min(m.get("load_at_start", 0) for m in machines),
            load_at_end=max(m.get("load_at_end", 0) for m in machines),
            commit=",".join(sorted({m.get("commit", "") for m in machines})),
        )
    return results


def measure(
    ctx: Any, phases: set[str], holds: list[float], pollers: list[int], window: float, say: Any
) -> dict[str, Any]:
    """The section's measurements, on a DynamoDB Local of its own; BenchError if a child fails.

    ``ctx``: a multiprocessing context (forkserver) for the waiter and poller processes.
    """
    began = time.monotonic()
    server = start_local_server("dynamodb-local")
    setup = make_client(server.endpoint_url, **DEFAULTS)
    table = setup.options.table_name
    results: dict[str, Any] = {
        "settings": {k: v for k, v in DEFAULTS.items()},
        "prices": {"date": PRICE_DATE, "write_per_million": WRITE_PRICE * 1e6, "read_per_million": READ_PRICE * 1e6},
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_at_start": os.getloadavg()[0],
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
            ).stdout.strip(),
        },
    }
    kids = None
    try:
        setup.create_table()
        needed = max([1] + (pollers if "hot" in phases else []) + ([4] if "throttled" in phases else []))
        say(f"starting {needed} child processes")
        kids = Children(ctx, needed, table)
        if "rates" in phases:
            results["rates"] = measure_rates(kids, server.endpoint_url, table, holds, say)
        if "hot" in phases:
            results["hot"] = measure_hot(kids, server.endpoint_url, pollers, window, say)
        if "throttled" in phases:
            results["throttled"] = measure_throttled(kids, server.endpoint_url, table, 4, window, say)
        if "cost" in phases:
            costs = measure_costs(server.endpoint_url, table)
            costs["table"] = cost_table(costs, results.get("rates", []), results.get("hot", []))
            results["cost"] = costs
    finally:
        if kids is not None:
            kids.stop()
        setup.close()
        server.stop()
    results["machine"]["load_at_end"] = os.getloadavg()[0]
    results["seconds"] = time.monotonic() - began
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.waiting", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter holds and windows (a smoke test)")
    parser.add_argument("--only", default=",".join(PHASES), help="phases, comma-separated")
    parser.add_argument("--holds", help="hold times in seconds for rates (default 0.5,2,5,15,40)")
    parser.add_argument("--pollers", help="poller counts for hot (default 1,6,12,24)")
    parser.add_argument("--window", type=float, help="seconds per hot and throttled run (default 8; quick 4)")
    parser.add_argument("--plot", type=Path, default=IMG_DIR / "bench-waiting.png")
    parser.add_argument(
        "--before", type=Path, metavar="JSON", help="a baseline the plot draws in grey (bench/baselines/)"
    )
    parser.add_argument(
        "--replot",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="redraw tables and plot from saved results (several: each phase from the last that has it)",
    )
    args = parser.parse_args(argv)
    if args.replot:
        results = joined([json.loads(path.read_text()) for path in args.replot])
        if results.get("cost"):  # the table from the saved counts, as this version writes it
            results["cost"]["table"] = cost_table(results["cost"], results.get("rates", []), results.get("hot", []))
        print(markdown(results))
        plot(results, args.plot, json.loads(args.before.read_text()) if args.before else None)
        return 0
    phases = set(args.only.split(","))
    if phases - set(PHASES):
        parser.error(f"unknown phases: {sorted(phases - set(PHASES))}")
    holds, pollers, window = defaults(args.quick)
    holds = [float(x) for x in args.holds.split(",")] if args.holds else holds
    pollers = [int(x) for x in args.pollers.split(",")] if args.pollers else pollers
    window = args.window or window
    if max(holds) > 120 or max(pollers) > 48 or not 1 <= window <= 60:
        parser.error("holds up to 120 s, pollers up to 48, window 1..60 s")
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["bench.clients", "bench.contenders"])
    try:
        results = measure(ctx, phases, holds, pollers, window, say)
    except BenchError as error:
        say(f"failed: {error}")
        return 1
    print(markdown(results))
    plot(results, args.plot, json.loads(args.before.read_text()) if args.before else None)
    out = write_results(results, None, "waiting")
    say(f"results: {out.relative_to(REPO_ROOT)}; plot: {args.plot}; {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
