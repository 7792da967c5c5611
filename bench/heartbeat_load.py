"""Heartbeat load: one process holding many leases (default 1 000) for a minute.

Run from the repository root (loopback only; starts its own moto server unless given
``--endpoint``)::

    python -m bench.heartbeat_load                      # 1000 leases, 60 s, moto
    python -m bench.heartbeat_load --server dynalite
    python -m bench.heartbeat_load --leases 200 --seconds 10 --lease 6 --heartbeat 2
    python -m bench.heartbeat_load --endpoint URL --server-pid PID --json FILE   # a server you started

One LockClient (so one heartbeat thread) acquires ``--leases`` keys, holds them for
``--seconds`` and releases them. It reports:

- renewals per second observed (UpdateItem renewals sent, counted with a botocore
  hook): ``leases / mean time between two renewals of a lease``, and the plain count
  over the window, against the configured rate ``leases / heartbeat`` (the engine
  renews each lease every 0.85-1.0 heartbeat periods, so about 8% more is expected);
- leases lost (must be 0) and renewals that failed, and the longest time between two
  renewals of one lease compared with the lease;
- CPU seconds (user + system) of this process during the hold, as a share of one core,
  and of the server; the peak resident memory (``ru_maxrss``) and the RSS growth over
  the hold.

Exit status 1 if a lease was lost. ``--json FILE`` also writes the figures as JSON.
Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.clients import make_client, raw_client  # noqa: E402

RENEWAL_PREFIX = "SET #rvn = :rvn, #seq = :seq, #lease_ms"  # the engine's renewal UpdateExpression
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of another process (Linux /proc), None if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RenewalLog:
    """Counts renewals sent by a LockClient, and the send times per key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[str, list[float]] = {}
        self.failures: list[float] = []

    def before_call(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if params.get("UpdateExpression", "").startswith(RENEWAL_PREFIX):
            context["dynlock_renewal"] = params["Key"]
            with self.lock:
                self.sent.setdefault(next(iter(params["Key"].values()))["S"], []).append(time.monotonic())

    def after_call(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        if "dynlock_renewal" in context and http_response.status_code != 200:
            with self.lock:
                self.failures.append(time.monotonic())

    def failed(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for t in self.failures if start <= t < end)

    def count(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for times in self.sent.values() for t in times if start <= t < end)

    def intervals(self, start: float, end: float) -> list[float]:
        """Times between consecutive renewals of one lease, both sent within [start, end)."""
        with self.lock:
            return [b - a for times in self.sent.values() for a, b in zip(times, times[1:]) if start <= a and b < end]

    def longest_gap(self, acquired: dict[str, float], end: float) -> float:
        """Longest time a lease went without a renewal being sent (from acquisition to ``end``)."""
        worst = 0.0
        with self.lock:
            for key, since in acquired.items():
                times = [since, *sorted(self.sent.get(key, [])), end]
                worst = max(worst, max(b - a for a, b in zip(times, times[1:])))
        return worst


def run(
    endpoint_url: str,
    *,
    leases: int = 1000,
    seconds: float = 60.0,
    lease: float = 30.0,
    heartbeat: float = 10.0,
    server_pid: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    table = f"heartbeat-load-{uuid.uuid4().hex[:8]}"
    client = make_client(endpoint_url, table_name=table, lease_duration=lease, heartbeat_period=heartbeat)
    events: Counter[str] = Counter()
    client.add_listener(
        lambda event, **info: events.update([event if event != "lost" else f"lost:{info.get('reason')}"])
    )
    log = RenewalLog()
    client.boto.meta.events.register("before-parameter-build.dynamodb.UpdateItem", log.before_call)
    client.boto.meta.events.register("after-call.dynamodb.UpdateItem", log.after_call)
    client.create_table(wait=True)
    rss_start = rss_kib()

    began = time.monotonic()
    acquired: dict[str, float] = {}
    held = []
    for i in range(leases):
        key = f"load:{i:05d}"
        held.append(client.acquire(key, wait=10.0))
        acquired[key] = time.monotonic()
    acquire_seconds = time.monotonic() - began

    # Steady state: the hold window starts once every lease has been renewed at least
    # once on its own schedule; renewals counted over the rest of it.
    cpu_before, server_before, hold_start = (
        cpu_seconds(),
        process_cpu_seconds(server_pid) if server_pid else None,
        time.monotonic(),
    )
    deadline = hold_start + seconds
    samples = []
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        alive = sum(1 for one in held if one.is_held)
        samples.append(
            {
                "t": round(time.monotonic() - hold_start, 1),
                "held": alive,
                "rss_kib": rss_kib(),
                "renewals": log.count(hold_start, time.monotonic()),
            }
        )
        if progress:
            print(
                f"  t={samples[-1]['t']:5.1f}s held={alive} renewals={samples[-1]['renewals']} "
                f"rss={samples[-1]['rss_kib'] / 1024:.1f} MiB",
                file=sys.stderr,
            )
    hold_end = time.monotonic()
    cpu_hold = cpu_seconds() - cpu_before
    server_hold = (process_cpu_seconds(server_pid) - server_before) if server_before is not None else None
    still_held = sum(1 for one in held if one.is_held)
    longest_gap = log.longest_gap(acquired, hold_end)
    intervals = sorted(log.intervals(hold_start, hold_end))

    released = time.monotonic()
    release_errors: Counter[str] = Counter()
    for one in held:
        try:
            one.release()
        except Exception as exc:  # a lease lost in the hold: counted above, and here
            release_errors[type(exc).__name__] += 1
    release_seconds = time.monotonic() - released
    client.close()
    try:
        raw = raw_client(endpoint_url)
        raw.delete_table(TableName=table)
        raw.close()
    except Exception:
        pass

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "leases": leases,
        "seconds": seconds,
        "lease": lease,
        "heartbeat": heartbeat,
        "acquire_seconds": round(acquire_seconds, 2),
        "release_seconds": round(release_seconds, 2),
        "renewals_in_hold": log.count(hold_start, hold_end),
        # Each lease's own rate, from the mean time between its renewals: not skewed by the
        # waves in which leases acquired together are renewed (jitter spreads them slowly).
        "renewals_per_second": round(leases / (sum(intervals) / len(intervals)), 1) if intervals else 0.0,
        "renewals_per_second_in_window": round(log.count(hold_start, hold_end) / max(1e-9, hold_end - hold_start), 1),
        "configured_per_second": round(leases / heartbeat, 1),
        "expected_per_second_with_jitter": round(leases / (heartbeat * 0.925), 1),
        "renewals_failed_in_hold": log.failed(hold_start, hold_end),
        "renewals_failed_while_releasing": log.failed(hold_end, float("inf")),
        "leases_held_at_end": still_held,
        "leases_lost": leases - still_held,
        "release_errors": dict(release_errors),
        "events": dict(events),
        "longest_gap_between_renewals": round(longest_gap, 2),
        "mean_interval_between_renewals": round(sum(intervals) / len(intervals), 3) if intervals else None,
        "p99_interval_between_renewals": round(intervals[int(0.99 * (len(intervals) - 1))], 3) if intervals else None,
        "cpu_seconds_hold": round(cpu_hold, 2),
        "cpu_share_of_one_core": round(cpu_hold / max(1e-9, hold_end - hold_start), 3),
        "server_cpu_seconds_hold": round(server_hold, 2) if server_hold is not None else None,
        "max_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "rss_growth_during_run_mib": round((samples[-1]["rss_kib"] - rss_start) / 1024, 1) if samples else None,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.heartbeat_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to hold them (default 60)")
    parser.add_argument("--lease", type=float, default=30.0, help="LEASE_DURATION (default 30)")
    parser.add_argument("--heartbeat", type=float, default=10.0, help="HEARTBEAT_PERIOD (default 10)")
    parser.add_argument("--server", choices=["moto", "dynalite"], default="moto")
    parser.add_argument("--endpoint", help="use this running server instead of starting one")
    parser.add_argument(
        "--server-pid", type=int, help="with --endpoint: the server's process id, to report its CPU time"
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if not 1 <= args.leases <= 100_000 or not 0 < args.seconds <= 3600:
        parser.error("--leases must be 1..100000 and --seconds 0..3600")

    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        os.environ.pop(name, None)
    os.environ.update(
        AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true"
    )
    server = None
    endpoint, server_pid = args.endpoint, args.server_pid
    if endpoint is None:
        from localdynamo.servers import start_server

        server = start_server(args.server, timeout=60)
        endpoint, server_pid = server.endpoint_url, server.pid
    try:
        print(
            f"holding {args.leases} leases for {args.seconds:g}s (lease {args.lease:g}s, heartbeat "
            f"{args.heartbeat:g}s) on {args.server if server else endpoint}",
            file=sys.stderr,
        )
        result = run(
            endpoint,
            leases=args.leases,
            seconds=args.seconds,
            lease=args.lease,
            heartbeat=args.heartbeat,
            server_pid=server_pid,
            progress=True,
        )
    finally:
        if server is not None:
            server.stop()
    result["server"] = args.server if server else endpoint
    result["command"] = "python -m bench.heartbeat_load " + " ".join(argv if argv is not None else sys.argv[1:])
    result["platform"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()}
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 1 if result["leases_lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
