"""``python -m bench.election``: a standby's cost and the failover times of ``client.election``.

django-dynlock alone, against a DynamoDB Local this script starts (loopback), with a
lease of ``--lease`` seconds (heartbeat a third of it) and the standby's default cadence
(``STANDBY_POLL``, 2 s). Each trial:

1. a leader process campaigns and leads; a standby in this process campaigns, and its
   DynamoDB API calls are counted (botocore's ``before-call`` event, so HTTP retries are
   not) over ``--window`` seconds after its first 3 s;
2. the leader is SIGKILLed: seconds until the standby's ``campaign()`` returns;
3. a standby process campaigns for 3 s, then this process' term resigns: seconds from the
   ``release()`` call until that process is elected (both on the machine's monotonic clock).

It prints one markdown table (median and max over the trials). Every loop is bounded.

    python -m bench.election                  # 5 trials, lease 5 s: about 3 minutes
    python -m bench.election --trials 2 --window 10
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import threading
import time
from collections import Counter
from typing import Any

from bench.clients import make_client, start_local_server
from django_dynlock.engine.clock import monotonic

NAME = "bench"


def lead(endpoint: str, lease: float, pipe: Any) -> None:
    """A contender process: campaign, say when elected (token, monotonic time), lead until killed."""
    client = make_client(endpoint, lease_duration=lease, heartbeat_period=lease / 3)
    term = client.election(NAME).campaign(wait=120)
    pipe.send((term.token, monotonic()))
    deadline = time.monotonic() + 300
    while term.is_held and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(0)


def trial(endpoint: str, lease: float, window: float) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    leader = context.Process(target=lead, args=(endpoint, lease, theirs), daemon=True)
    leader.start()
    if not ours.poll(60):
        raise SystemExit("the leader process was never elected")
    ours.recv()
    client = make_client(endpoint, lease_duration=lease, heartbeat_period=lease / 3)
    calls: Counter = Counter()
    client.boto.meta.events.register("before-call.dynamodb", lambda model, **kw: calls.update([model.name]))
    elected: list = []
    standby = threading.Thread(target=lambda: elected.append(client.election(NAME).campaign(wait=120)), daemon=True)
    standby.start()
    time.sleep(3.0)  # its first looks: the clock read and a refused write
    before = sum(calls.values())
    time.sleep(window)
    during = sum(calls.values()) - before
    os.kill(leader.pid, signal.SIGKILL)
    killed = monotonic()
    leader.join(10)
    standby.join(lease + 30)
    if not elected:
        raise SystemExit("the standby was never elected")
    after_kill = monotonic() - killed
    term = elected[0]
    ours, theirs = context.Pipe()
    follower = context.Process(target=lead, args=(endpoint, lease, theirs), daemon=True)
    follower.start()
    time.sleep(3.0)  # it has looked, and waits on its cadence
    resigned = monotonic()
    term.release()
    if not ours.poll(30):
        raise SystemExit("the standby process was never elected")
    _, at = ours.recv()
    os.kill(follower.pid, signal.SIGKILL)
    follower.join(10)
    client.close()
    return {"rate": during / window, "kill": after_kill, "resign": at - resigned}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=20.0)
    args = parser.parse_args()
    server = start_local_server("dynamodb-local")
    try:
        make_client(server.endpoint_url).create_table()
        results = []
        for number in range(args.trials):
            result = trial(server.endpoint_url, args.lease, args.window)
            print(f"trial {number + 1}: {result}", flush=True)
            results.append(result)
    finally:
        server.stop()
    print(f"\nDynamoDB Local, lease {args.lease:g} s, {args.trials} trials, standby counted over {args.window:g} s:\n")
    print("| | median | max |\n|---|---|---|")
    for key, label in (
        ("rate", "standby requests per second while the leader lives"),
        ("kill", f"takeover after the leader's SIGKILL, s (bound: lease + 3 = {args.lease + 3:g})"),
        ("resign", "takeover after the leader resigns, s (bound: 2.5)"),
    ):
        values = [r[key] for r in results]
        print(f"| {label} | {statistics.median(values):.2f} | {max(values):.2f} |")


if __name__ == "__main__":
    main()
