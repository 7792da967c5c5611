"""``python -m bench.faults``: contended throughput with and without faults, side by side.

The harness of issue 13: 6 processes x 15 critical sections (5 ms each) on one key,
every request through one loopback ``FaultProxy`` (``localdynamo/faultproxy.py``). A round
is fault-free, or has ~10 % of requests faulted: 2.5 % each of HTTP 500, HTTP 400
``ProvisionedThroughputExceededException``, a 300 ms delay, and HTTP 500 after the
write was applied. Each library runs with botocore's retries on (standard mode, 4
attempts) and off (1 attempt); nothing else of its configuration changes.

Contenders: django-dynlock at its defaults (lease 10 s) and python-dynamodb-lock
polling every 100 ms (``retry_period`` 0.1 s, lease 3 s). Rounds are interleaved:
each pass runs every (library, retries) cell once fault-free and once faulted (the
order alternates), with fresh worker processes and a fresh key per round, so that
the machine's drift hits all alike. Figures are medians over the passes.

Per round: sections/s (all sections / from the start to the last release), Jain
fairness over the processes' own rates (their 15 sections / the time they took),
overlaps of the sections' [acquired, releasing] windows on the one clock of this
host, errors the library raised (a failed acquire is tried again; a release that
raises counts the section as lost).

    python -m bench.faults                       # all three servers, 5 passes
    python -m bench.faults --servers moto --passes 2
    python -m bench.faults --replot bench/results/faults-<timestamp>.json

Prints markdown tables, writes ``bench/results/faults-<timestamp>.json`` and
``docs/img/bench-faults.png``. Every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import contenders as cs
from bench import targets as T
from bench.children import BenchError, child_lane, expect, stop_children
from bench.clients import start_local_server
from bench.output import IMG_DIR, REPO_ROOT, write_results
from bench.rounds import rotated
from bench.stats import jain, median
from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import SERVER_KINDS

PLOT = IMG_DIR / "bench-faults.png"

FAULT_MIX = {"http500": 0.025, "throttle": 0.025, "delay": 0.025, "http500_applied": 0.025}
FAULT_DELAY = 0.3  # seconds added to a delayed request
RETRIES = {"on": 4, "off": 1}  # botocore's total_max_attempts (standard mode)

PDL = cs.Spec("pdl-0.1", "python-dynamodb-lock (retry 0.1 s)", "pdl", {**cs.PDL_FAST, "retry_period": 0.1})
# django-dynlock without hedged requests (HEDGE_AFTER None): what hedging buys, in the same run.
UNHEDGED = cs.Spec(
    "dynlock-unhedged", "django-dynlock (HEDGE_AFTER None)", "dynlock", {**cs.DYNLOCK.settings, "hedge_after": None}
)
# django-dynlock with hedged requests (HEDGE_AFTER 0.025 s; off by default): under the name
# "dynlock", as when hedging was the default, so that runs before and after compare.
HEDGED = cs.Spec(
    "dynlock", "django-dynlock (HEDGE_AFTER 0.025)", "dynlock", {**cs.DYNLOCK.settings, "hedge_after": 0.025}
)
LIBS = {spec.name: spec for spec in (HEDGED, UNHEDGED, PDL)}

ROUND_CAP = 60.0  # seconds one round may take before its workers give up
START_TIMEOUT = 90.0


@dataclass(frozen=True)
class Cell:
    lib: str
    retries: str

    @property
    def spec(self) -> cs.Spec:
        spec = LIBS[self.lib]
        attempts = RETRIES[self.retries]
        return spec.with_settings(client_config={"retries": {"mode": "standard", "total_max_attempts": attempts}})

    @property
    def name(self) -> str:
        return f"{self.lib}/retries-{self.retries}"


# -- worker processes ----------------------------------------------------------------------------


def fault_worker(spec: cs.Spec, endpoint_url: str, conn: Any) -> None:
    """Child: acquire -> sleep(hold) -> release on the round's key, ``sections`` times per round."""
    with child_lane(spec, endpoint_url, conn) as (contender, lane):
        conn.send(("ready", os.getpid()))
        for _ in range(100):  # rounds, bounded
            if not conn.poll(START_TIMEOUT + ROUND_CAP):
                return
            message = conn.recv()
            if message[0] != "go":
                return
            _, key, sections, hold, start_at, give_up_at = message
            lane.prepare(key)
            time.sleep(max(0.0, min(start_at - time.time(), 10.0)))
            contender.counter.take()
            done: list[tuple[float, float, float, Any, bool]] = []
            errors: collections.Counter[str] = collections.Counter()
            for _ in range(sections * 20):
                tried = time.time()
                if len(done) >= sections or tried >= give_up_at:
                    break
                try:
                    handle = lane.acquire(key, give_up_at - tried)
                except Exception as exc:  # the library gave up on this attempt: try again
                    errors[f"acquire: {type(exc).__name__}"] += 1
                    time.sleep(0.01)
                    continue
                if handle is None:
                    break  # waited until give_up_at
                acquired = time.time()
                time.sleep(hold)
                releasing = time.time()
                ok = True
                try:
                    lane.release(handle)
                except Exception as exc:
                    errors[f"release: {type(exc).__name__}"] += 1
                    ok = False
                done.append((acquired, releasing, time.time(), lane.token(handle), ok))
            conn.send(("result", os.getpid(), done, dict(errors), contender.counter.take()))


def run_fault_round(
    workers: list[tuple[Any, Any]], proxy: FaultProxy, faulty: bool, cell: Cell, sections: int, hold: float
) -> dict[str, Any]:
    key = f"faults-{cell.lib}-{uuid.uuid4().hex[:8]}"
    proxy.set_rates(FAULT_MIX if faulty else {}, delay_seconds=FAULT_DELAY)
    before = proxy.stats
    start_at = time.time() + 0.2
    try:
        for conn, _ in workers:
            conn.send(("go", key, sections, hold, start_at, start_at + ROUND_CAP))
        results = [expect(conn, "result", ROUND_CAP + 30) for conn, _ in workers]
    finally:
        proxy.set_rates({})
    after = proxy.stats
    faults = {k: after.faults.get(k, 0) - before.faults.get(k, 0) for k in FAULT_MIX}
    rows = []  # (acquired, releasing, released, pid, token, ok)
    per_process = []
    errors: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for _, pid, done, worker_errors, worker_calls in results:
        rows.extend((a, r, d, pid, token, ok) for a, r, d, token, ok in done)
        if done:
            per_process.append(len(done) / max(1e-6, max(d for _, _, d, _, _ in done) - start_at))
        else:
            per_process.append(0.0)
        errors.update(worker_errors)
        calls.update(worker_calls)
    rows.sort()
    end = max((row[2] for row in rows), default=start_at)
    overlaps = sum(1 for a, b in zip(rows, rows[1:]) if b[0] < a[1])
    tokens = [row[4] for row in rows if row[4] is not None]
    gaps = [(b[0] - a[2]) * 1000 for a, b in zip(rows, rows[1:])]
    # from the start of a release to the next acquire's return, to the releaser itself or another process
    handoffs = {
        same: [(b[0] - a[1]) * 1000 for a, b in zip(rows, rows[1:]) if (a[3] == b[3]) is same] for same in (True, False)
    }
    return {
        "faulty": faulty,
        "sections": len(rows),
        "planned": sections * len(workers),
        "seconds": end - start_at,
        "sections_per_s": len(rows) / max(1e-6, end - start_at),
        "jain": jain(per_process),
        "overlaps": overlaps,
        "tokens_not_increasing": sum(1 for x, y in zip(tokens, tokens[1:]) if y <= x),
        "lost": sum(1 for row in rows if not row[5]),
        # release returned -> the next section began (negative: the release's reply came
        # after the next holder had the key), and how often the releaser itself came next
        "gap_p50_ms": median(gaps),
        "gap_max_ms": max(gaps, default=None),
        "handoff_self_p50_ms": median(handoffs[True]),
        "handoff_other_p50_ms": median(handoffs[False]),
        "next_by_releaser": sum(1 for a, b in zip(rows, rows[1:]) if a[3] == b[3]) / max(1, len(rows) - 1),
        "errors": dict(errors),
        "requests": after.requests - before.requests,
        "faults": faults,
        "calls": dict(calls),
    }


def run_cell(
    cell: Cell,
    endpoint_url: str,
    proxy: FaultProxy,
    ctx: Any,
    procs: int,
    sections: int,
    hold: float,
    faulty_first: bool,
) -> list[dict[str, Any]]:
    """One fault-free and one faulted round with fresh workers (order per ``faulty_first``)."""
    pairs = [ctx.Pipe() for _ in range(procs)]
    processes = [
        ctx.Process(target=fault_worker, args=(cell.spec, proxy.endpoint_url, child), daemon=True) for _, child in pairs
    ]
    try:
        for process in processes:
            process.start()
        for conn, _ in pairs:
            expect(conn, "ready", START_TIMEOUT)
        time.sleep(0.2)  # let the children's imports and connections settle
        return [
            run_fault_round(pairs, proxy, faulty, cell, sections, hold)
            for faulty in ((True, False) if faulty_first else (False, True))
        ]
    finally:
        stop_children(processes, [conn for conn, _ in pairs])


def run_server(
    kind: str,
    cells: list[Cell],
    passes: int,
    procs: int,
    sections: int,
    hold: float,
    ctx: Any,
    say: Callable[[str], None],
    deadline: float,
) -> dict[str, Any]:
    result: dict[str, Any] = {"server": kind, "rounds": {cell.name: [] for cell in cells}, "errors": {}, "skipped": 0}
    server = start_local_server(kind)
    proxy = FaultProxy(server.endpoint_url, max_seconds=7200, max_requests=10_000_000, seed=13)
    began = time.monotonic()
    try:
        proxy.start()
        for lib in sorted({cell.lib for cell in cells}):
            cs.Contender.setup_table(LIBS[lib], server.endpoint_url)
        for lib in sorted({cell.lib for cell in cells}):  # a JIT-compiled server (DynamoDB Local) warms up
            run_cell(Cell(lib, "off"), server.endpoint_url, proxy, ctx, procs, sections, hold, False)
        for index in range(passes):
            for cell in rotated(cells, index):
                if time.monotonic() >= deadline:
                    result["skipped"] += 1
                    continue
                try:
                    rounds = run_cell(cell, server.endpoint_url, proxy, ctx, procs, sections, hold, bool(index % 2))
                except BenchError as exc:
                    result["errors"][f"{cell.name} pass {index + 1}"] = str(exc)
                    say(f"  {kind}: {cell.name} FAILED: {exc}")
                    continue
                result["rounds"][cell.name].extend(rounds)
                clean = next(r for r in rounds if not r["faulty"])
                faulted = next(r for r in rounds if r["faulty"])
                say(
                    f"  {kind} pass {index + 1}: {cell.name:22} fault-free {clean['sections_per_s']:6.1f}/s, "
                    f"faults {faulted['sections_per_s']:6.1f}/s ({sum(faulted['faults'].values())} faulted)"
                )
        result["proxy_errors"] = [repr(e) for e in proxy.errors[:10]]
    finally:
        proxy.stop()
        server.stop()
    result["seconds"] = time.monotonic() - began
    return result


# -- summary, tables, plot ----------------------------------------------------------------------


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians per cell and condition, and the ratios the issue's targets are about."""
    out: dict[str, Any] = {}
    for name, rounds in result["rounds"].items():
        row: dict[str, Any] = {}
        for label, faulty in (("clean", False), ("faults", True)):
            mine = [r for r in rounds if r["faulty"] is faulty]
            row[label] = {
                "rounds": len(mine),
                "rate": median([r["sections_per_s"] for r in mine]),
                "rates": [round(r["sections_per_s"], 1) for r in mine],
                "jain": median([r["jain"] for r in mine if r["jain"] is not None]),
                "overlaps": sum(r["overlaps"] for r in mine),
                "tokens_not_increasing": sum(r["tokens_not_increasing"] for r in mine),
                "incomplete": sum(1 for r in mine if r["sections"] < r["planned"]),
                "lost": sum(r["lost"] for r in mine),
                "errors": dict(sum((collections.Counter(r["errors"]) for r in mine), collections.Counter())),
                "faults": dict(sum((collections.Counter(r["faults"]) for r in mine), collections.Counter())),
                "requests_per_section": (sum(r["requests"] for r in mine) / max(1, sum(r["sections"] for r in mine))),
            }
        # The ratio of medians of paired rounds: each faulted round against the fault-free
        # round run next to it by the same workers.
        pairs = list(zip([r for r in rounds if not r["faulty"]], [r for r in rounds if r["faulty"]]))
        row["fault_ratio"] = median(
            [f["sections_per_s"] / c["sections_per_s"] for c, f in pairs if c["sections_per_s"]]
        )
        out[name] = row
    for retries in RETRIES:
        mine, theirs = out.get(f"dynlock/retries-{retries}"), out.get(f"{PDL.name}/retries-{retries}")
        if mine and theirs and theirs["clean"]["rate"]:
            out[f"vs_pdl/retries-{retries}"] = mine["clean"]["rate"] / theirs["clean"]["rate"]
    return out


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "n/a" if value is None else format(value, fmt)


def tables(results: list[dict[str, Any]]) -> str:
    lines = []
    for result in results:
        summary = summarize(result)
        lines.append(f"\n### {result['server']}\n")
        lines.append(
            "| library / botocore retries | fault-free /s | faulted /s | faulted / fault-free | Jain (fault-free, faulted) "
            "| requests per section (fault-free, faulted) | overlaps | errors raised under faults |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for name, row in summary.items():
            if name.startswith("vs_pdl"):
                continue
            errors = ", ".join(f"{k} {v}" for k, v in sorted(row["faults"]["errors"].items())) or "none"
            lines.append(
                f"| {name} | {_num(row['clean']['rate'])} | {_num(row['faults']['rate'])} | "
                f"{_num(row['fault_ratio'], '.2f')} | {_num(row['clean']['jain'], '.2f')}, {_num(row['faults']['jain'], '.2f')} | "
                f"{_num(row['clean']['requests_per_section'], '.1f')}, {_num(row['faults']['requests_per_section'], '.1f')} | "
                f"{row['clean']['overlaps'] + row['faults']['overlaps']} | {errors} |"
            )
        for retries in RETRIES:
            ratio = summary.get(f"vs_pdl/retries-{retries}")
            if ratio is not None:
                lines.append(
                    f"\ndjango-dynlock / python-dynamodb-lock, fault-free, retries {retries}: **{ratio:.2f}x**"
                )
        lines.append("")
        lines.append(target_lines(summary))
        if result.get("errors"):
            lines.append(f"\nfailed: {result['errors']}")
        if result.get("skipped"):
            lines.append(f"\nskipped for the time budget: {result['skipped']} cells")
    return "\n".join(lines)


def _verdict(met: bool | None) -> str:
    return "met" if met else "MISSED"


def target_lines(summary: dict[str, Any]) -> str:
    """The issue's targets for this harness (``bench.targets``), per retry setting."""
    out = []
    for retries in RETRIES:
        row = summary.get(f"dynlock/retries-{retries}")
        if not row:
            continue
        ratio = row["fault_ratio"]
        target = T.FAULTED_VS_FAULT_FREE
        out.append(
            f"- faulted / fault-free, retries {retries}: {_num(ratio, '.2f')} (target >= {target.bound:.2f}: "
            f"{_verdict(target.met(ratio))})"
        )
        vs = summary.get(f"vs_pdl/retries-{retries}")
        jain_clean = row["clean"]["jain"]
        met = T.CONTENDED_VS_PEER.met(vs) and T.FAIRNESS.met(jain_clean)
        out.append(
            f"- vs python-dynamodb-lock, retries {retries}: {_num(vs, '.2f')}x, Jain {_num(jain_clean, '.2f')} "
            f"(target >= {T.CONTENDED_VS_PEER.bound:g}x with Jain >= {T.FAIRNESS.bound:g}: {_verdict(met)})"
        )
        safe = (
            row["clean"]["overlaps"]
            + row["faults"]["overlaps"]
            + row["clean"]["tokens_not_increasing"]
            + row["faults"]["tokens_not_increasing"]
        )
        out.append(f"- django-dynlock overlaps and token reversals, retries {retries}: {safe}")
    return "\n".join(out)


def plot_faults(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.8), squeeze=False, sharey=False)
    for ax, result in zip(axes[0], results):
        summary = summarize(result)
        names = [n for n in summary if not n.startswith("vs_pdl")]
        xs = range(len(names))
        clean = [summary[n]["clean"]["rate"] or 0 for n in names]
        faulted = [summary[n]["faults"]["rate"] or 0 for n in names]
        ax.bar([x - 0.2 for x in xs], clean, 0.4, label="fault-free", color="#4c72b0")
        ax.bar([x + 0.2 for x in xs], faulted, 0.4, label="10 % faults", color="#dd8452")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([n.replace("/retries-", "\nretries ") for n in names], fontsize=7)
        ax.set_title(result["server"])
        ax.set_ylabel("sections/s (median)")
        ax.set_ylim(0, max(clean + faulted + [1]) * 1.25)
        ax.legend(fontsize=7, loc="upper center", ncol=2)
    fig.suptitle("6 processes x 15 sections of 5 ms on one key, through a fault proxy", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default=",".join(SERVER_KINDS), help="comma-separated: " + ", ".join(SERVER_KINDS))
    parser.add_argument("--libs", default=",".join(LIBS), help="comma-separated: " + ", ".join(LIBS))
    parser.add_argument("--retries", default=",".join(RETRIES), help="comma-separated: on (4 attempts), off (1)")
    parser.add_argument(
        "--passes", type=int, default=5, help="interleaved passes (each: one fault-free and one faulted round per cell)"
    )
    parser.add_argument("--procs", type=int, default=6)
    parser.add_argument("--sections", type=int, default=15, help="sections per process per round")
    parser.add_argument("--hold", type=float, default=5.0, help="ms inside each section")
    parser.add_argument("--budget", type=float, default=1500.0, help="seconds; cells after it are skipped")
    parser.add_argument("--plot", type=Path, default=PLOT, help=f"PNG output (default {PLOT.relative_to(REPO_ROOT)})")
    parser.add_argument("--replot", metavar="JSON", help="redo the tables and the plot from a results file")
    args = parser.parse_args(argv)

    if args.replot:
        results = json.loads(Path(args.replot).read_text())["servers"]
        print(tables(results))
        plot_faults(results, args.plot)
        return 0

    cells = [Cell(lib, retries) for lib in args.libs.split(",") for retries in args.retries.split(",")]
    for cell in cells:
        if cell.lib not in LIBS or cell.retries not in RETRIES:
            parser.error(f"unknown library or retries setting: {cell}")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["bench.contenders", "python_dynamodb_lock.python_dynamodb_lock"])
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    deadline = time.monotonic() + args.budget
    results = []
    for kind in args.servers.split(","):
        say(f"{kind}: {len(cells)} cells x {args.passes} passes")
        results.append(
            run_server(kind, cells, args.passes, args.procs, args.sections, args.hold / 1000.0, ctx, say, deadline)
        )
    out = write_results(
        {"args": vars(args), "fault_mix": FAULT_MIX, "delay_s": FAULT_DELAY, "servers": results}, None, "faults"
    )
    print(tables(results))
    plot_faults(results, args.plot)
    say(f"results: {out.relative_to(REPO_ROOT)}; plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
