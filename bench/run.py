"""``python -m bench``: django-dynlock side by side with the raw boto3 floor and its peers.

Run from the repository root (``pip install -e '.[bench]'`` and ``make node`` first)::

    python -m bench                  # full run, about 14 minutes
    python -m bench --quick          # smaller samples (smoke test)
    python -m bench --servers dynalite
    python -m bench --only waiting   # issue 28's section alone
    python -m bench --replot bench/results/bench-<timestamp>.json

Against AWS's DynamoDB Local, a local moto server and a local dynalite (loopback only;
DynamoDB Local needs ``java``: ``make java``), one server after the other, in one run, it measures django-dynlock, the raw boto3 floor (the two
bare conditional writes), python-dynamodb-lock at its defaults and at fast settings,
and dyndbmutex (see ``bench/contenders.py`` for exactly how each is driven):

1. API calls per acquire+release and per failed attempt; per heartbeat.
2. Uncontended acquire+release cycles/s, 1 and 8 threads (interleaved rounds, medians).
   What each request the library sends costs the server, beside the simplest lock's
   PutItem/DeleteItem and acquires with parts of the expressions left out.
3. Handoff latency, release -> a waiter in another process returns from acquire.
4. Contended throughput, 6 processes on one key, vs 1 / (hold + 2 x round trip).
5. Crash takeover: the holder is SIGKILLed, a waiting process takes over.
6. Listing 10 000 live leases: ``LockClient.leases()`` vs raw Scans; the admin page.
7. Waiting (``bench/waiting.py``, issue 28), django-dynlock alone on a DynamoDB Local of
   its own: requests/s of a waiter against hold time, a hot key's reads per section and
   fairness, throttled waiters, request units and dollars (``--only waiting`` alone).

It prints markdown tables (with the issue's targets of ``bench/targets.py``, met or
missed), writes the raw results to ``bench/results/bench-<timestamp>.json`` and the plots
to ``docs/img/bench-*.png`` (``bench-vs-floor.png``: django-dynlock against the floor and
the physical limit; ``bench-waiting.png``: the waiting section). Every loop is bounded in count and time;
a phase that would start after the time budget is skipped and reported as such.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import contenders as cs
from bench import listing, report, suite, waiting
from bench.children import BenchError
from bench.clients import start_local_server
from bench.floor import floor_differences
from bench.output import IMG_DIR, REPO_ROOT, write_results
from bench.rounds import rotated, run_phase
from django_dynlock.engine.options import ClientOptions
from localdynamo.servers import SERVER_KINDS

# The versions recorded with every run: result name -> distribution.
VERSIONS = {
    "boto3": "boto3",
    "botocore": "botocore",
    "moto": "moto",
    "django": "Django",
    "matplotlib": "matplotlib",
    "python_dynamodb_lock": "python-dynamodb-lock",
    "dyndbmutex": "dyndbmutex",
}


@dataclass(frozen=True)
class Plan:
    mode: str
    calls_cycles: int
    heartbeat_hold: float
    rounds: int
    round_seconds: float
    round_cap: float
    threads: tuple[int, ...]
    rtt_calls: int
    handoff_samples: int
    handoff_blocks: int  # samples are taken in this many interleaved blocks
    handoff_cap: float  # seconds per contender
    handoff_slow_cap: float  # for a contender that polls every few seconds
    procs: int
    hold: float
    window: float  # one contended window
    contended_rounds: int  # interleaved windows per contender
    crash_trials: int
    crash_slow: bool  # python-dynamodb-lock at its defaults: one trial with its 30 s lease
    leases: int
    list_repeats: int
    list_cap: float
    admin_gets: int
    budget: float


def make_plan(args: argparse.Namespace) -> Plan:
    quick = args.quick
    return Plan(
        mode="quick" if quick else "full",
        calls_cycles=10 if quick else 20,
        heartbeat_hold=6.0,
        rounds=args.rounds or (3 if quick else 7),
        round_seconds=0.4 if quick else 0.6,
        round_cap=2.0 if quick else 3.0,
        threads=(1, 8),
        rtt_calls=100 if quick else 200,
        handoff_samples=args.samples or (24 if quick else 60),
        handoff_blocks=2 if quick else 3,
        handoff_cap=15.0 if quick else 40.0,
        handoff_slow_cap=11.0 if quick else 25.0,
        procs=args.procs,
        hold=args.hold / 1000.0,
        window=args.window or (3.0 if quick else 5.0),
        contended_rounds=2,
        crash_trials=args.crash_trials or (2 if quick else 3),
        crash_slow=not quick,
        leases=args.leases or (2000 if quick else 10_000),
        list_repeats=1 if quick else 3,
        list_cap=20.0 if quick else 60.0,
        admin_gets=3 if quick else 7,
        # per server: 210 s quick, 390 s full
        budget=args.budget or (210.0 if quick else 390.0) * len(args.servers.split(",")),
    )


def bench_server(
    kind: str,
    plan: Plan,
    deadline: float,
    ctx: Any,
    say: Callable[[str], None],
    only: set[str] | None,
    libs: set[str] | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"server": kind, "errors": {}, "skipped": [], "tables": {}}
    began = time.monotonic()
    server = start_local_server(kind)
    endpoint = server.endpoint_url
    result["endpoint"] = endpoint
    try:
        for spec in (cs.DYNLOCK, cs.PDL_FASTEST, cs.MUTEX):
            result["tables"][spec.kind] = cs.Contender.setup_table(spec, endpoint)

        def phase(name: str, fn: Callable[[], Any]) -> Any:
            if only is not None and name.split(":")[0] not in only:
                return None
            return run_phase(result, kind, name, fn, deadline, say)

        result["floor_check"] = floor_differences(endpoint)
        if result["floor_check"]:
            say(f"  {kind}: WARNING: the floor's requests differ from the engine's: {result['floor_check']}")
        result["calls"] = phase("calls", lambda: suite.measure_calls(endpoint, list(cs.ALL), plan.calls_cycles))
        result["dynlock_calls"] = phase(
            "calls:dynlock", lambda: suite.measure_dynlock_calls(endpoint, plan.calls_cycles)
        )
        result["heartbeats"] = phase(
            "heartbeats",
            lambda: suite.measure_heartbeats(
                endpoint, [cs.DYNLOCK, cs.PDL_DEFAULT, cs.PDL_FASTEST, cs.MUTEX], plan.heartbeat_hold
            ),
        )
        result["uncontended"] = {}
        for threads in plan.threads:
            # python-dynamodb-lock's settings do not touch its uncontended path: measured once.
            value = phase(
                f"uncontended:{threads}",
                lambda t=threads: suite.measure_uncontended(
                    endpoint,
                    [cs.DYNLOCK, cs.FLOOR, cs.PDL_FASTEST, cs.MUTEX],
                    t,
                    plan.rounds,
                    plan.round_seconds,
                    plan.round_cap,
                ),
            )
            if value is not None:
                result["uncontended"][str(threads)] = value
        result["rtt"] = phase("rtt", lambda: suite.measure_rtt(endpoint, plan.rtt_calls))
        result["requests"] = phase(
            "requests", lambda: suite.measure_request_costs(endpoint, 4 if plan.mode == "quick" else 6)
        )
        waiters = [spec for spec in cs.WAITERS if libs is None or spec.name in libs]
        result["handoff"] = {}
        if phase_wanted("handoff", only):
            blocks = interleaved(
                kind,
                "handoff",
                waiters,
                plan.handoff_blocks,
                deadline,
                result,
                say,
                lambda spec, _: suite.measure_handoff(
                    endpoint,
                    spec,
                    ctx,
                    -(-plan.handoff_samples // plan.handoff_blocks),
                    (plan.handoff_slow_cap if spec.name == "pdl-default" else plan.handoff_cap) / plan.handoff_blocks,
                ),
            )
            result["handoff"] = {name: suite.combine_handoff(b) for name, b in blocks.items() if b}
        result["contended"] = {}
        rtt_ms = (result.get("rtt") or {}).get("median_ms")
        if phase_wanted("contended", only):
            rounds = interleaved(
                kind,
                "contended",
                waiters,
                plan.contended_rounds,
                deadline,
                result,
                say,
                lambda spec, _: suite.measure_contended(
                    endpoint, spec, ctx, plan.procs, plan.hold, plan.window, rtt_ms
                ),
            )
            result["contended"] = {name: suite.combine_contended(r) for name, r in rounds.items() if r}
        result["crash"] = {}
        if only is None or "crash" in only:
            run_crash(endpoint, plan, ctx, say, result, deadline, libs)
        result["listing"] = phase(
            "listing",
            lambda: listing.measure_listing(
                endpoint, plan.leases, plan.list_repeats, plan.list_cap, plan.admin_gets, say
            ),
        )
    finally:
        server.stop()
    result["seconds"] = time.monotonic() - began
    return result


def bench_waiting(
    plan: Plan, deadline: float, ctx: Any, say: Callable[[str], None], kinds: list[str]
) -> dict[str, Any]:
    """Issue 28's section (bench/waiting.py): what waiting costs, on a DynamoDB Local of its own."""
    if "dynamodb-local" not in kinds:
        return {"skipped": "measured on DynamoDB Local only, which --servers leaves out"}
    if time.monotonic() >= deadline:
        return {"skipped": "the time budget ran out"}
    holds, pollers, window = waiting.defaults(plan.mode == "quick")
    say("waiting: starting")
    try:
        return waiting.measure(ctx, set(waiting.PHASES), holds, pollers, window, say)
    except BenchError as error:
        say(f"waiting: failed: {error}")
        return {"error": str(error)}


def phase_wanted(name: str, only: set[str] | None) -> bool:
    return only is None or name in only


def interleaved(
    kind: str,
    what: str,
    specs: list[cs.Spec],
    rounds: int,
    deadline: float,
    result: dict[str, Any],
    say: Callable[[str], None],
    fn: Callable[[cs.Spec, int], Any],
) -> dict[str, list[Any]]:
    """``rounds`` rounds of ``fn(spec, round)`` over the contenders, the order rotated and
    reversed every other round, so that drift in the machine's load hits all alike."""
    names = [spec.name for spec in specs]
    by_name = {spec.name: spec for spec in specs}
    out: dict[str, list[Any]] = {name: [] for name in names}
    t0 = time.monotonic()
    for index in range(rounds):
        for name in rotated(names, index):
            if f"{what}:{name}" in result["errors"]:
                continue
            if time.monotonic() >= deadline:
                result["skipped"].append(f"{what}:{name} round {index + 1}")
                continue
            try:
                out[name].append(fn(by_name[name], index))
            except Exception as exc:
                result["errors"][f"{what}:{name}"] = f"{type(exc).__name__}: {exc}"
                say(f"  {kind}: {what}:{name} FAILED: {type(exc).__name__}: {exc}")
    say(f"  {kind}: {what} done in {time.monotonic() - t0:.1f}s ({rounds} interleaved rounds)")
    return out


def _crash_trials(spec: cs.Spec, trials: int, cap: float) -> suite.CrashTrials:
    """The holder is killed 1.5 to 2.5 heartbeats after it acquired: after a renewal."""
    beat = spec.heartbeat or 1.0
    return suite.CrashTrials(spec, trials, (1.5 * beat, 2.5 * beat), cap)


def run_crash(
    endpoint: str,
    plan: Plan,
    ctx: Any,
    say: Callable[[str], None],
    result: dict[str, Any],
    deadline: float,
    libs: set[str] | None = None,
) -> None:
    """The 3 s-lease contenders one after the other; python-dynamodb-lock at its defaults
    (30 s lease, 5 s polls: its takeover takes half a minute) at the same time, in a thread:
    its load is one GetItem per 5 s, and the figure is seconds, not milliseconds."""
    if time.monotonic() >= deadline:
        result["skipped"].append("crash")
        return
    slow: dict[str, Any] = {}
    slow_thread = None
    if plan.crash_slow and (libs is None or "pdl-default" in libs):
        spec = suite.CRASH_SPECS["pdl-default"]

        def run_slow() -> None:
            try:
                slow["value"] = suite.measure_crash(endpoint, _crash_trials(spec, 1, 120.0), ctx, say)
            except Exception as exc:
                slow["error"] = f"{type(exc).__name__}: {exc}"

        slow_thread = threading.Thread(target=run_slow, daemon=True)
        slow_thread.start()
    for name in ("dynlock", "pdl-fast", "dyndbmutex"):
        if libs is not None and name not in libs:
            continue
        spec = suite.CRASH_SPECS[name]
        t0 = time.monotonic()
        try:
            result["crash"][name] = suite.measure_crash(
                endpoint, _crash_trials(spec, plan.crash_trials, 60.0), ctx, say
            )
            say(f"  {result['server']}: crash:{name} done in {time.monotonic() - t0:.1f}s")
        except Exception as exc:
            result["errors"][f"crash:{name}"] = f"{type(exc).__name__}: {exc}"
            say(f"  {result['server']}: crash:{name} FAILED: {exc}")
    # Fresh one-shot processes (cron runs, new workers) after the kill: no waiter to watch.
    result["crash_one_shot"] = {}
    for name in ("dynlock", "pdl-fast", "dyndbmutex"):
        if libs is not None and name not in libs:
            continue
        spec = suite.CRASH_SPECS[name]
        trials = plan.crash_trials if name != "pdl-fast" else 1  # it never gets there: one capped trial shows it
        try:
            crash = _crash_trials(spec, trials, (spec.lease or 0.0) + 10.0)
            result["crash_one_shot"][name] = suite.measure_crash_one_shot(endpoint, crash, ctx, say)
        except Exception as exc:
            result["errors"][f"crash_one_shot:{name}"] = f"{type(exc).__name__}: {exc}"
            say(f"  {result['server']}: crash_one_shot:{name} FAILED: {exc}")
    if slow_thread is not None:
        slow_thread.join(150)
        if "value" in slow:
            result["crash"]["pdl-default"] = slow["value"]
        else:
            result["errors"]["crash:pdl-default"] = slow.get("error", "did not finish in 150 s")


class LogCollector(logging.Handler):
    """Keeps the engine's warnings (e.g. 'no item on a failed condition') for the report."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = f"{record.levelname}: {record.getMessage()}"
        if message not in self.messages and len(self.messages) < 50:
            self.messages.append(message)


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


def _version(distribution: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:
        return None


def _first_line(command: list[str]) -> str | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def meta(argv: list[str]) -> dict[str, Any]:
    """The machine, the versions measured and the command, for the record."""
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
    import django_dynlock

    data: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django_dynlock": django_dynlock.__version__,
        **{name: _version(dist) for name, dist in VERSIONS.items()},
        "dynalite": dynalite,
        "node": _first_line(["node", "--version"]),
        "command": " ".join(["python -m bench", *argv]),
        # Other work on the machine skews absolute figures (ratios less so).
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    try:  # which engine was measured: it changes often
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "django_dynlock"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        data["git_head"] = head.stdout.strip() or None
        data["engine_dirty"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return data


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 5 minutes instead of 10; smaller samples")
    parser.add_argument("--servers", default=",".join(SERVER_KINDS), help=f"comma-separated: {', '.join(SERVER_KINDS)}")
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated phases: calls, heartbeats, uncontended, rtt, "
        "requests, handoff, contended, crash, listing, waiting (issue 28's section, on DynamoDB Local; "
        "its own knobs in python -m bench.waiting)",
    )
    parser.add_argument(
        "--libs",
        default=None,
        help="comma-separated waiting libraries for handoff, contended and crash: "
        "dynlock, pdl-default, pdl-fast, dyndbmutex (default all)",
    )
    parser.add_argument("--hold", type=float, default=10.0, help="contended critical section, ms (default 10)")
    parser.add_argument("--procs", type=int, default=6, help="contended processes (default 6)")
    parser.add_argument(
        "--window",
        type=float,
        default=None,
        help="one contended window, s (default 5; quick 3); two interleaved windows per library",
    )
    parser.add_argument("--rounds", type=int, default=None, help="uncontended rounds per library (default 7; quick 3)")
    parser.add_argument("--samples", type=int, default=None, help="handoff samples per library (default 60; quick 25)")
    parser.add_argument("--crash-trials", type=int, default=None, help="crash trials per library (default 3; quick 2)")
    parser.add_argument("--leases", type=int, default=None, help="leases to list (default 10000; quick 2000)")
    parser.add_argument(
        "--dynlock-min-retry-delay",
        type=float,
        default=None,
        metavar="MS",
        help=f"sensitivity: django-dynlock's MIN_RETRY_DELAY (ms) instead of its default {ClientOptions.min_retry_delay * 1000:g}",
    )
    parser.add_argument(
        "--dynlock-max-retry-delay",
        type=float,
        default=None,
        metavar="MS",
        help=f"sensitivity: django-dynlock's MAX_RETRY_DELAY (ms) instead of its default {ClientOptions.max_retry_delay * 1000:g}",
    )
    parser.add_argument(
        "--pdl-fast-retry",
        type=float,
        default=None,
        metavar="MS",
        help="sensitivity: python-dynamodb-lock (fast)'s retry_period (ms) instead of 20",
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds after which phases not yet started are skipped"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="raw results (default bench/results/bench-<timestamp>.json)"
    )
    parser.add_argument("--img-dir", type=Path, default=IMG_DIR, help="where the PNG plots go (default docs/img)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--replot", type=Path, default=None, metavar="JSON", help="only redraw tables and plots from a results file"
    )
    args = parser.parse_args(argv)

    if args.replot:
        results = json.loads(args.replot.read_text())
        print(report.markdown(results))
        if not args.no_plot:
            for path in report.plot_all(results, args.img_dir):
                print(f"plot: {path}")
        return 0

    if not 1 <= args.procs <= 32 or args.hold < 0 or (args.window is not None and not 0 < args.window <= 120):
        parser.error("need 1 <= --procs <= 32, --hold >= 0 and 0 < --window <= 120")
    if args.leases is not None and not 1 <= args.leases <= 100_000:
        parser.error("--leases takes 1..100000")
    kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    if not kinds or any(k not in SERVER_KINDS for k in kinds):
        parser.error(f"--servers takes a comma-separated list of {', '.join(SERVER_KINDS)}")
    only = None
    if args.only:
        only = {p.strip() for p in args.only.split(",") if p.strip()}
        known = {
            "calls",
            "heartbeats",
            "uncontended",
            "rtt",
            "requests",
            "handoff",
            "contended",
            "crash",
            "listing",
            "waiting",
        }
        if not only <= known:
            parser.error(f"--only takes a comma-separated list of {', '.join(sorted(known))}")
        if "contended" in only:
            only.add("rtt")
    libs = None
    if args.libs:
        libs = {p.strip() for p in args.libs.split(",") if p.strip()}
        if not libs <= {"dynlock", "pdl-default", "pdl-fast", "dyndbmutex"}:
            parser.error("--libs takes a comma-separated list of dynlock, pdl-default, pdl-fast, dyndbmutex")
    plan = make_plan(args)
    cs.configure(
        dynlock_min_retry_delay=None if args.dynlock_min_retry_delay is None else args.dynlock_min_retry_delay / 1000.0,
        dynlock_max_retry_delay=None if args.dynlock_max_retry_delay is None else args.dynlock_max_retry_delay / 1000.0,
        pdl_fast_retry=None if args.pdl_fast_retry is None else args.pdl_fast_retry / 1000.0,
    )
    suite.CRASH_SPECS.update(
        {name: cs.crash_spec(spec) for name, spec in (("dynlock", cs.DYNLOCK), ("pdl-fast", cs.PDL_FASTEST))}
    )

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    cs.quiet_peer_logs()
    collector = LogCollector()
    logging.getLogger("django_dynlock").addHandler(collector)
    logging.getLogger("django_dynlock").propagate = False
    # Children fork from a server process that has imported boto3 and the libraries once:
    # a child starts in well under a second instead of re-importing everything (spawn).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["bench.suite", "python_dynamodb_lock.python_dynamodb_lock", "dyndbmutex.dyndbmutex"])
    started = time.monotonic()
    deadline = started + plan.budget
    results: dict[str, Any] = {
        "meta": meta(argv),
        "plan": asdict(plan),
        "specs": {
            s.name: {
                "label": s.label,
                "kind": s.kind,
                "settings": s.describe(),
                "lease_s": s.lease,
                "heartbeat_s": s.heartbeat,
            }
            for s in cs.ALL
        },
        "crash_specs": {
            name: {"label": s.label, "settings": s.describe(), "lease_s": s.lease, "heartbeat_s": s.heartbeat}
            for name, s in suite.CRASH_SPECS.items()
        },
        "servers": [],
    }
    say(f"bench: {plan.mode} mode, servers {', '.join(kinds)}, budget {plan.budget:.0f}s")
    if only is None or only - {"waiting"}:
        for kind in kinds:
            say(f"{kind}: starting")
            results["servers"].append(bench_server(kind, plan, deadline, ctx, say, only, libs))
    if phase_wanted("waiting", only):
        results["waiting"] = bench_waiting(plan, deadline, ctx, say, kinds)
    results["meta"]["seconds"] = time.monotonic() - started
    results["meta"]["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    results["engine_log"] = collector.messages

    json_path = write_results(results, args.json, "bench")
    print(report.markdown(results))
    failed = print_problems(results, collector.messages)
    print(f"\nraw results: {json_path}")
    if not args.no_plot:
        for path in report.plot_all(results, args.img_dir):
            print(f"plot: {path}")
    print(f"total: {results['meta']['seconds']:.0f}s")
    return 1 if failed else 0
