"""``python -m bench.observability``: what metrics and traces cost a holder (issue 39).

Client CPU (user + system, the whole process: the heartbeat thread too) per
uncontended acquire+release of one key, against a DynamoDB Local this script starts
(loopback), in four child processes that take turns, round after round, so that the
machine's drift hits all alike:

- ``before``: the package as it was before observability (``--before``, a commit: its
  ``django_dynlock`` extracted with ``git archive``), with no hook at all;
- ``off``: this tree, no observer (neither app installed): what every project pays;
- ``prometheus``: ``django_dynlock.contrib.prometheus.install()``;
- ``otel``: ``DynlockInstrumentor().instrument()`` with the SDK's providers (spans to a
  ``BatchSpanProcessor`` whose exporter drops them, measures to an in-memory reader);
- ``otel-unsampled``: the same with a sampler that drops every trace: the measures alone;
- ``otel-metrics``: the instrumentor given a meter provider only, no tracer provider set
  (the API's no-op tracer): the measures alone, as a project that exports no traces.

Each child runs ``--cycles`` cycles per round after ``--warmup`` unmeasured ones; the
report gives each mode's median over ``--rounds`` rounds and the median of the per-round
differences to ``off`` (each round's modes run back to back). Then, in each child: the
hooks of one recorded cycle replayed (``--replays``), ``--in-place`` real cycles with
each of the engine's calls to the observers timed where it runs (where the on-minus-off
difference goes), and ``--toggle-blocks`` pairs of blocks with the observers on and off.
Every loop is bounded.

    python -m bench.observability                 # 15 rounds of 200 cycles: about 2 minutes
    python -m bench.observability --rounds 5 --cycles 100
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from bench.clients import make_client, start_local_server

REPO_ROOT = Path(__file__).resolve().parent.parent
MODES = ("before", "off", "prometheus", "otel", "otel-unsampled", "otel-metrics")


def child(mode: str, endpoint: str) -> None:
    """A mode's process: one client, one key; on each ``N`` line from the parent, N
    cycles timed, answered with one JSON line."""
    import django_dynlock

    if mode == "prometheus":
        from django_dynlock.contrib.prometheus import install

        install()
    elif mode.startswith("otel"):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

        from django_dynlock.contrib.opentelemetry import DynlockInstrumentor

        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        # otel-unsampled: every trace dropped by the sampler, the measures taken all the same.
        tracer_provider = (
            TracerProvider(sampler=ParentBased(ALWAYS_OFF)) if mode == "otel-unsampled" else TracerProvider()
        )
        tracer_provider.add_span_processor(BatchSpanProcessor(Drop()))
        if mode == "otel-metrics":
            tracer_provider = None  # the global one, never set: the API's no-op tracer
        DynlockInstrumentor().instrument(
            tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()])
        )
    client = make_client(endpoint)
    key = f"obs:{mode}"
    # The name label of a template (the code before observability takes no metrics_name).
    named: dict[str, Any] = {} if mode == "before" else {"metrics_name": "obs:{mode}"}
    print(json.dumps({"ready": mode, "package": django_dynlock.__file__}), flush=True)
    replay = recorded_cycle(client, key, named) if mode != "before" else None
    for line in sys.stdin:
        if line.startswith("toggle "):
            blocks, size = map(int, line.split()[1:])
            print(json.dumps({"diffs_us": toggled(client, key, named, blocks, size)}), flush=True)
            continue
        if line.startswith("replay "):
            assert replay is not None
            print(json.dumps({"hooks_us": replay(int(line.split()[1]))}), flush=True)
            continue
        if line.startswith("inplace "):
            print(json.dumps({"in_place": in_place(client, key, named, int(line.split()[1]))}), flush=True)
            continue
        cycles = int(line)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(cycles):
            client.acquire(key, **named).release()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(json.dumps({"cpu_us": cpu / cycles * 1e6, "wall_us": wall / cycles * 1e6}), flush=True)


def toggled(client: Any, key: str, named: dict[str, Any], blocks: int, size: int) -> list[float]:
    """In this one process, blocks of ``size`` cycles with the observers on and off in
    turn (on first, then off first): each pair's difference of CPU µs per cycle. The same
    process, heap and connections, and seconds apart: the machine's drift cancels."""
    from django_dynlock.engine import observe

    installed = list(observe.OBSERVERS)
    diffs = []
    try:
        for index in range(blocks):
            cpu = {}
            for on in (True, False) if index % 2 == 0 else (False, True):
                observe.OBSERVERS[:] = installed if on else []
                started = time.process_time()
                for _ in range(size):
                    client.acquire(key, **named).release()
                cpu[on] = (time.process_time() - started) / size * 1e6
            diffs.append(cpu[True] - cpu[False])
    finally:
        observe.OBSERVERS[:] = installed
    return diffs


#: The engine's calls to the observers (engine/observe.py), timed in place.
HOOKS = ("start_acquire", "start_release", "tell_request", "tell_event")


def in_place(client: Any, key: str, named: dict[str, Any], cycles: int) -> dict[str, float]:
    """Real cycles with each of the engine's calls to the observers timed where it runs
    (thread CPU around it): where the on-minus-off difference goes, call by call, code
    and caches as cold as on a lock's path. Also, inside them, the batch of
    contrib.opentelemetry, and the ends of recorded spans (called by the engine apart).
    CPU µs per cycle, the timer's own cost per call taken off; ``timer``: that cost."""
    from django_dynlock.engine import observe

    clock = time.thread_time_ns
    spent: dict[str, list[int]] = {}

    def timed(name: str, function: Any) -> Any:
        tally = spent.setdefault(name, [0, 0])

        def timing(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                tally[0] += clock() - started
                tally[1] += 1

        return timing

    patched: list[tuple[Any, str, Any]] = [(observe, name, getattr(observe, name)) for name in HOOKS]
    otel = sys.modules.get("django_dynlock.contrib.opentelemetry")
    if otel is not None:
        batch = "_measure_pending" if hasattr(otel._Counts, "_measure_pending") else "flush"
        patched += [(otel._Counts, batch, getattr(otel._Counts, batch))]
        patched += [(kind, "end", kind.end) for kind in (otel._AcquireSpan, otel._ReleaseSpan)]
    names = {batch: "batch" for batch in ("_measure_pending", "flush")}
    for owner, name, function in patched:
        label = getattr(owner, "__name__", "") + "." + name if name == "end" else names.get(name, name)
        setattr(owner, name, timed(label, function))
    nothing = timed("timer", lambda: None)
    try:
        for _ in range(cycles):
            client.acquire(key, **named).release()
            nothing()
    finally:
        for owner, name, function in patched:
            setattr(owner, name, function)
    timer = spent.pop("timer")[0] / cycles
    # The batch's timer also adds to the event's or request's it runs in: one call in
    # sixteen cycles, left in.
    result = {"timer": timer / 1e3}
    for label, (ns, calls) in spent.items():
        if calls:  # a span's end is never called when no span is followed
            result[label] = (ns - calls * timer) / cycles / 1e3
    return result


def recorded_cycle(client: Any, key: str, named: dict[str, Any]) -> Any:
    """What the engine tells the observers in one real cycle, recorded, and a function
    that tells it again ``n`` times to the observers installed (none for ``off``) and
    returns the CPU µs per cycle: the observers' own cost, without the network's noise.
    With no observer it times the engine's guards (``if OBSERVERS:``) and the name."""
    from django_dynlock.engine import observe

    calls: list[tuple[Any, ...]] = []

    class Observation(observe.AcquireObservation, observe.ReleaseObservation):
        def __init__(self, kind: str):
            self.kind = kind

        def busy_look(self, looks: int, holder: str | None) -> None:
            calls.append(("busy_look", self.kind, looks, holder))

        def end(self, outcome: str, **info: Any) -> None:  # type: ignore[override]
            calls.append(("end", self.kind, outcome, info))

    class Recorder(observe.Observer):
        def event(self, event: str, *, alias: str, name: str, info: Any) -> None:
            calls.append(("event", event, alias, name, dict(info)))

        def request(self, *, alias: str, op: str, outcome: str, seconds: float) -> None:
            calls.append(("request", alias, op, outcome, seconds))

        def renewed(self, *, alias: str, name: str, headroom: float) -> None:
            calls.append(("renewed", alias, name, headroom))

        def acquiring(self, *, alias: str, name: str, key: str) -> Any:
            calls.append(("acquiring", alias, name, key))
            return Observation("acquire")

        def releasing(self, *, alias: str, name: str, key: str) -> Any:
            calls.append(("releasing", alias, name, key))
            return Observation("release")

    installed = list(observe.OBSERVERS)
    observe.OBSERVERS[:] = [Recorder()]
    try:
        client.acquire(key, **named).release()
    finally:
        observe.OBSERVERS[:] = installed

    def replay(n: int) -> float:
        started = time.process_time()
        for _ in range(n):
            open_: dict[str, Any] = {}
            for call in calls:
                kind = call[0]
                if kind == "event":
                    if observe.OBSERVERS:
                        observe.tell_event(call[1], call[2], call[3], call[4])
                elif kind == "request":
                    if observe.OBSERVERS:
                        observe.tell_request(*call[1:])
                elif kind == "renewed":
                    if observe.OBSERVERS:
                        observe.tell_renewed(*call[1:])
                elif kind == "acquiring":
                    observe.metrics_name(call[3], call[2])  # what a Lease works out, on or off
                    open_["acquire"] = observe.start_acquire(*call[1:]) if observe.OBSERVERS else None
                elif kind == "releasing":
                    open_["release"] = observe.start_release(*call[1:]) if observe.OBSERVERS else None
                elif kind == "busy_look" and open_.get(call[1]) is not None:
                    open_[call[1]].busy_look(call[2], call[3])
                elif kind == "end" and open_.get(call[1]) is not None:
                    open_[call[1]].end(call[2], **call[3])
        return (time.process_time() - started) / n * 1e6

    return replay


def before_tree(commit: str, into: Path) -> Path:
    """``django_dynlock`` as it was at ``commit``, under ``into`` (first on the child's path)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "django_dynlock"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


class Child:
    def __init__(self, mode: str, endpoint: str, cwd: Path):
        # ``python -m`` puts its working directory first on the path: the package of the
        # ``before`` tree there, bench/ and localdynamo/ from the repository after it.
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.mode = mode
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.observability", "--child", mode, "--endpoint", endpoint],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ready = self.answer()

    def answer(self) -> dict[str, Any]:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit(f"the {self.mode} child ended (exit {self.process.wait(10)})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, cycles: int) -> dict[str, Any]:
        return self.run_line(str(cycles))

    def run_line(self, line: str) -> dict[str, Any]:
        self.process.stdin.write(f"{line}\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return self.answer()

    def stop(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--replays", type=int, default=20000, help="cycles of the recorded hooks replayed")
    parser.add_argument("--toggle-blocks", type=int, default=200, help="pairs of blocks, observers on and off")
    parser.add_argument("--toggle-cycles", type=int, default=50, help="cycles per block")
    parser.add_argument("--in-place", type=int, default=2000, help="cycles with each hook timed in place (0: none)")
    parser.add_argument(
        "--toggle-modes", default="prometheus,otel,otel-unsampled,otel-metrics", help="the modes toggled on and off"
    )
    parser.add_argument("--before", default="a08f6a3", help="the commit before observability (default: a08f6a3)")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.endpoint)
        return

    server = start_local_server("dynamodb-local")
    children: list[Child] = []
    try:
        make_client(server.endpoint_url).create_table(wait=True)
        with tempfile.TemporaryDirectory() as tmp:
            before = before_tree(args.before, Path(tmp))
            for mode in MODES:
                children.append(Child(mode, server.endpoint_url, before if mode == "before" else REPO_ROOT))
            for one in children:
                print(f"{one.mode}: {one.ready['package']}", file=sys.stderr)
                one.run(args.warmup)
            results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            for index in range(args.rounds):
                order = children[index % len(children) :] + children[: index % len(children)]
                for one in order if index % 2 == 0 else reversed(order):
                    results[one.mode].append(one.run(args.cycles))
            hooks = {one.mode: one.run_line(f"replay {args.replays}")["hooks_us"] for one in children[1:]}
            timed = {
                one.mode: one.run_line(f"inplace {args.in_place}")["in_place"] for one in children[2:] if args.in_place
            }
            toggles = {
                one.mode: one.run_line(f"toggle {args.toggle_blocks} {args.toggle_cycles}")["diffs_us"]
                for one in children[2:]
                if one.mode in args.toggle_modes.split(",")
            }
    finally:
        for one in children:
            one.stop()
        server.stop()
    report(results, hooks, toggles, args, timed)


def report(
    results: dict[str, list[dict[str, Any]]],
    hooks: dict[str, float],
    toggles: dict[str, list[float]],
    args: argparse.Namespace,
    timed: dict[str, dict[str, float]],
) -> None:
    off = [r["cpu_us"] for r in results["off"]]
    if not off:
        print("(no interleaved rounds: --rounds 0)")
    else:
        rounds_table(results, off, args)
    hooks_and_toggles(hooks, toggles, args)
    if timed:
        in_place_table(timed, args)
    print(
        json.dumps({"args": vars(args), "results": results, "hooks": hooks, "toggles": toggles, "in_place": timed}),
        file=sys.stderr,
    )


def in_place_table(timed: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    print(
        f"\nEach hook timed in place: {args.in_place:,} real cycles, thread CPU around each of the engine's "
        "calls to the observers, the timer's own cost per call taken off (CPU µs per cycle)\n"
    )
    columns = [*HOOKS, "batch", "_AcquireSpan.end", "_ReleaseSpan.end"]
    print("| mode | " + " | ".join(columns) + " | all (the batch is inside the events') | timer per call |")
    print("|---|" + "---|" * (len(columns) + 2))
    for mode, spent in timed.items():
        total = sum(us for label, us in spent.items() if label not in ("timer", "batch"))
        cells = " | ".join(f"{spent[label]:.1f}" if label in spent else "" for label in columns)
        print(f"| {mode} | {cells} | {total:.1f} | {spent['timer']:.2f} |")


def rounds_table(results: dict[str, list[dict[str, Any]]], off: list[float], args: argparse.Namespace) -> None:
    print(
        f"Client CPU per uncontended acquire+release on DynamoDB Local: {args.rounds} rounds of "
        f"{args.cycles} cycles per mode, interleaved ({os.cpu_count()} cores)\n"
    )
    print(
        "| mode | CPU µs per cycle, median (min-max) | minus `off`, median of the rounds (min-max) | wall µs per cycle |"
    )
    print("|---|---|---|---|")
    for mode in MODES:
        cpu = [r["cpu_us"] for r in results[mode]]
        wall = [r["wall_us"] for r in results[mode]]
        diffs = [a - b for a, b in zip(cpu, off)]
        print(
            f"| {mode} | {statistics.median(cpu):,.0f} ({min(cpu):,.0f}-{max(cpu):,.0f}) | "
            f"{statistics.median(diffs):+,.0f} ({min(diffs):+,.0f} to {max(diffs):+,.0f}) | "
            f"{statistics.median(wall):,.0f} |"
        )


def hooks_and_toggles(hooks: dict[str, float], toggles: dict[str, list[float]], args: argparse.Namespace) -> None:
    print(
        f"\nThe hooks alone: one real cycle's calls to the observers, recorded, then replayed "
        f"{args.replays:,} times in the same process (CPU µs per cycle)\n"
    )
    print("| mode | hooks' CPU µs per cycle |")
    print("|---|---|")
    for mode, us in hooks.items():
        print(f"| {mode} | {us:.2f} |")
    if not toggles:
        return
    print(
        f"\nOn and off in one process: {args.toggle_blocks} pairs of blocks of {args.toggle_cycles} cycles, "
        f"the observers on in one block and off in the other (CPU µs per cycle, on minus off)\n"
    )
    print("| mode | median of the pairs | mean ± standard error | quartiles |")
    print("|---|---|---|---|")
    for mode, diffs in toggles.items():
        mean, error = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
        q1, _, q3 = statistics.quantiles(diffs, n=4)
        print(f"| {mode} | {statistics.median(diffs):+.0f} | {mean:+.0f} ± {error:.0f} | {q1:+.0f}, {q3:+.0f} |")


if __name__ == "__main__":
    main()
