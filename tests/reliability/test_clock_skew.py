"""Wall clocks that are wrong by a minute, and a holder cut off from DynamoDB.

Takeover follows DynamoDB's clock, which each client bounds from the ``Date`` header
of its replies (engine/clock.py). A holder stops trusting its lease before DynamoDB's
clock can reach the expiry it stored; a taker needs that expiry to be past even by the
earliest reading of the clock. No host's wall clock enters either side, so:

- a holder whose clock is a minute ahead or behind, cut off from DynamoDB (its proxy
  is paused, so it stops renewing while it still believes), is never overlapped: it
  stops believing before the waiter's takeover is even sent;
- and it is taken over within lease + 3 s of being cut off.

The holder runs in a child process whose whole wall clock is shifted
(``workers.shift_wall_clock``) and reports every 5 ms, on the true clock, whether it
believes it holds the lock. The waiter (this process, true clock) records when it
*sent* the request that took the lock over.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from localdynamo.faultproxy import FaultProxy
from tests.reliability.harness import SPAWN, create_table
from tests.reliability.workers import Plan, believe_and_report
from tests.support.clients import client_for
from tests.support.polling import wait_for
from tests.support.tables import delete_table

pytestmark = pytest.mark.slow

LEASE = 2.0
HEARTBEAT = 0.5
MARGIN = 0.1 * LEASE


def run_skewed_holder(endpoint_url: str, tmp_path: Path, offset: float) -> dict:
    table = create_table(endpoint_url)
    report = tmp_path / "holder.txt"
    with FaultProxy(endpoint_url, max_seconds=120) as proxy:
        plan = Plan(
            name="holder",
            endpoint_url=proxy.endpoint_url,
            table=table,
            keys=("k",),
            counter_dir=str(tmp_path),
            out=str(tmp_path / "holder.jsonl"),
            lease=LEASE,
            heartbeat=HEARTBEAT,
            clock_offset=offset,
            read_timeout=0.3,
            wait=10.0,
        )
        holder = SPAWN.Process(target=believe_and_report, args=(plan, str(report), 20.0), daemon=True)
        holder.start()
        waiter = client_for(endpoint_url, table, lease_duration=LEASE, heartbeat_period=HEARTBEAT)
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
    print(
        f"\nholder clock {offset:+.0f}s (lease {LEASE}s): cut off; it last believed {last_held - cut:.2f}s later, "
        f"the waiter sent its takeover {took_over - cut:.2f}s later ({took_over - last_held:.2f}s apart)"
    )
    return {
        "cut": cut,
        "took_over": took_over,
        "last_held": last_held,
        "held_token": held_token,
        "taken_token": taken.token,
        "beliefs": len(beliefs),
    }


@pytest.mark.parametrize("offset", [+60.0, -60.0], ids=["holder-60s-ahead", "holder-60s-behind"])
def test_a_cut_off_holder_with_a_wrong_clock_is_never_overlapped_and_soon_taken_over(server, tmp_path, offset):
    seen = run_skewed_holder(server.endpoint_url, tmp_path, offset)
    assert seen["beliefs"] > 10, seen
    assert seen["last_held"] < seen["took_over"], f"overlap: {seen}"
    assert seen["taken_token"] > seen["held_token"]
    # Not before the lease its last renewal (at most a heartbeat before the cut) gave it ...
    assert seen["took_over"] - seen["cut"] > LEASE - HEARTBEAT - MARGIN - 0.1, seen
    # ... and within lease + 3 s of being cut off, its last write being earlier still.
    assert seen["took_over"] - seen["cut"] <= LEASE + 3.0, seen
