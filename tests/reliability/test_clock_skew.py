"""Wall clocks that disagree, with MAX_CLOCK_SKEW set.

With ``MAX_CLOCK_SKEW`` a waiter may take over as soon as the holder's stored expiry
(written with the *holder's* wall clock) is older than its own wall clock minus the
skew. The holder stops trusting its lease at ``S + lease - margin`` on its monotonic
clock, S being the send time of its last successful write. So:

- holder clock ahead by d: the stored expiry is later; takeover is only slower;
- holder clock behind by d: takeover at ``S + lease - d + skew``: safe while
  ``d <= skew + margin``;
- beyond that bound the two overlap for about ``d - skew - margin`` seconds. Fencing
  tokens still order them: the resource rejects the older token.

The holder runs in a child process whose engine reads a shifted wall clock
(``workers.shift_engine_clock``); it is cut off from DynamoDB (its proxy is paused),
so it stops renewing while it still believes, and reports every 5 ms, on the real
clock, whether it believes it holds the lock. The waiter (this process, true clock)
records when it *sent* the request that took the lock over.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faultproxy import FaultProxy
from tests.reliability.harness import SPAWN, create_table, delete_table, wait_for
from tests.reliability.workers import Plan, believe_and_report
from tests.workers import client_for

pytestmark = pytest.mark.slow

LEASE = 2.0
HEARTBEAT = 0.5
SKEW = 0.5
MARGIN = 0.1 * LEASE


def run_skewed_holder(endpoint_url: str, tmp_path: Path, offset: float) -> dict:
    table = create_table(endpoint_url)
    report = tmp_path / "holder.txt"
    with FaultProxy(endpoint_url, max_seconds=120) as proxy:
        plan = Plan(name="holder", endpoint_url=proxy.endpoint_url, table=table, keys=("k",),
                    counter_dir=str(tmp_path), out=str(tmp_path / "holder.jsonl"), lease=LEASE, heartbeat=HEARTBEAT,
                    clock_offset=offset, max_clock_skew=SKEW, read_timeout=0.3, wait=10.0)
        holder = SPAWN.Process(target=believe_and_report, args=(plan, str(report), 20.0), daemon=True)
        holder.start()
        waiter = client_for(endpoint_url, table, lease_duration=LEASE, heartbeat_period=HEARTBEAT, max_clock_skew=SKEW)
        sent: list[float] = []
        waiter.boto.meta.events.register("before-send.dynamodb.UpdateItem", lambda **_: sent.append(time.time()))
        try:
            wait_for(lambda: report.exists() and "ACQUIRED" in report.read_text(), 90, "the holder to acquire")
            time.sleep(0.3)
            proxy.pause()  # the holder is cut off: no more renewals, but it still believes
            cut = time.time()
            taken = waiter.acquire("k", wait=10)
            took_over = sent[-1]  # the send time of the request that took the lock
            holder.join(30)
            lines = report.read_text().split("\n")
            held_token = int(lines[0].split()[1])
            beliefs = [(line.split()[0], float(line.split()[1])) for line in lines[1:] if line]
            taken.release()
        finally:
            waiter.close()
            holder.kill()
            delete_table(endpoint_url, table)
    last_held = max(t for state, t in beliefs if state == "HELD")
    print(f"\nholder clock {offset:+.2f}s (MAX_CLOCK_SKEW {SKEW}s, lease {LEASE}s): cut off; it last believed "
          f"{last_held - cut:.2f}s later, the waiter sent its takeover {took_over - cut:.2f}s later: "
          + (f"overlap {last_held - took_over:.2f}s" if last_held >= took_over else f"{took_over - last_held:.2f}s apart"))
    return {"cut": cut, "took_over": took_over, "last_held": last_held, "overlap": last_held - took_over,
            "held_token": held_token, "taken_token": taken.token, "beliefs": len(beliefs)}


@pytest.mark.parametrize("offset", [+SKEW, -SKEW], ids=["holder-ahead", "holder-behind"])
def test_a_skew_within_the_bound_never_lets_two_believe(server, tmp_path, offset):
    seen = run_skewed_holder(server.endpoint_url, tmp_path, offset)
    assert seen["beliefs"] > 10, seen
    assert seen["last_held"] < seen["took_over"], f"overlap of {seen['overlap']:.3f}s: {seen}"
    assert seen["taken_token"] > seen["held_token"]
    # The takeover waited for the lease: no earlier than a lease minus the margin after the cut.
    assert seen["took_over"] - seen["cut"] > LEASE - HEARTBEAT - MARGIN - 0.1, seen


def test_a_holder_behind_by_more_than_the_bound_overlaps_and_only_fencing_orders_them(server, tmp_path):
    behind = SKEW + MARGIN + 1.0  # beyond what MAX_CLOCK_SKEW promises
    seen = run_skewed_holder(server.endpoint_url, tmp_path, -behind)
    # What docs/reliability.md says happens: the waiter takes over while the holder still
    # believes, for about behind - skew - margin seconds (less whatever the cut took).
    assert seen["overlap"] > 0.3, seen
    assert seen["overlap"] < behind - SKEW - MARGIN + 0.3, seen
    assert seen["taken_token"] > seen["held_token"]
