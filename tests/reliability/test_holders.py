"""Holders that crash, stall, or lose DynamoDB while others keep working on the same keys.

Each scenario runs a fleet of worker processes (``workers.run_sections``) on a few
keys, each behind its own FaultProxy, plus whatever the scenario does to one holder
or to the network, then checks the whole history (``history.check``): no overlap, no
token out of order, no lost counter update.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.reliability.harness import Scenario, records_of
from tests.reliability.history import Section, summarize
from tests.reliability.workers import victim
from tests.support.polling import wait_for

pytestmark = pytest.mark.slow

LEASE = 2.0
HEARTBEAT = 0.5
MARGIN = 0.1  # ClientOptions.safety_margin default


def begin_record(plan) -> dict:
    wait_for(lambda: any(r.get("type") == "begin" for r in records_of(plan.out)), 90, "the victim to take its lock")
    return next(r for r in records_of(plan.out) if r["type"] == "begin")


def test_a_killed_holder_is_taken_over_within_a_lease_and_nothing_overlaps(server, tmp_path):
    with Scenario(
        server.endpoint_url,
        tmp_path,
        3,
        ["a", "b"],
        spare_proxies=1,
        hold=0.01,
        lease=LEASE,
        heartbeat=HEARTBEAT,
        wait=4.0,
    ) as sc:
        plan = sc.side_plan("victim", sc.spares[0], max_seconds=60)
        holder = sc.spawn(victim, plan)
        try:
            began = begin_record(plan)
            sc.fleet.start()
            sc.fleet.release()
            time.sleep(1.0)  # the workers that want "a" are waiting; the victim heartbeats
            os.kill(holder.pid, signal.SIGKILL)
            killed = time.time()
            holder.join(10)
            time.sleep(LEASE + 2.0)
            sc.fleet.stop()
        finally:
            holder.kill()
        # The victim believed it held "a" from its start until it died.
        dead = Section(
            "a",
            began["token"],
            began["start"],
            killed,
            wrote=False,
            read=began["read"],
            worker="victim",
            lost_reason="killed",
        )
        result = sc.fleet.results(extra=[dead])
    after = sorted((s for s in result.sections if s.key == "a" and s.worker != "victim"), key=lambda s: s.start)
    print(
        f"\n[{server.kind}] kill: {len(result.sections)} sections, {len(result.violations)} violations, "
        f"taken over {after[0].start - killed if after else float('nan'):.2f}s after SIGKILL (lease {LEASE}s); "
        f"stats {dict(result.stats)}"
    )
    assert result.violations == [], summarize(result.sections, result.violations)
    assert after, "nobody took over the dead holder's key"
    assert after[0].start > killed and after[0].token > began["token"]
    # Taken over once the waiters have watched the dead lease for a whole lease.
    assert after[0].start - killed <= LEASE + 1.5, after[0].start - killed
    assert result.counters["a"] == sum(s.wrote for s in result.sections if s.key == "a")


def test_a_stopped_holder_resumes_knowing_it_lost_and_does_not_write(server, tmp_path):
    with Scenario(
        server.endpoint_url,
        tmp_path,
        3,
        ["a", "b"],
        spare_proxies=1,
        hold=0.01,
        lease=LEASE,
        heartbeat=HEARTBEAT,
        wait=4.0,
    ) as sc:
        plan = sc.side_plan("victim", sc.spares[0], max_seconds=60)
        holder = sc.spawn(victim, plan)
        try:
            begin_record(plan)
            sc.fleet.start()
            sc.fleet.release()
            time.sleep(0.5)
            os.kill(holder.pid, signal.SIGSTOP)  # a long GC pause, a frozen VM...
            stopped = time.time()
            # Past its lease: the others take "a" over and write to its counter.
            wait_for(
                lambda: sum(1 for s in sc.fleet.results().sections if s.key == "a") >= 5,
                LEASE + 30,
                "the others to take over the stopped holder's key",
            )
            Path(plan.out + ".go").touch()  # on waking, it goes straight for its write
            os.kill(holder.pid, signal.SIGCONT)
            holder.join(20)
            sc.fleet.stop()
        finally:
            if holder.is_alive():
                os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
        result = sc.fleet.results(files=[plan.out])
    mine = [s for s in result.sections if s.worker == "victim"]
    others = [s for s in result.sections if s.key == "a" and s.worker != "victim"]
    print(
        f"\n[{server.kind}] pause: {len(result.sections)} sections, {len(result.violations)} violations; "
        f"the stopped holder: {mine[0].describe() if mine else 'no record'}; it stopped believing "
        f"{min(s.start for s in others) - mine[0].end if mine and others else float('nan'):.2f}s before the "
        f"first takeover; stats {dict(result.stats)}"
    )
    assert len(mine) == 1 and not mine[0].wrote and mine[0].lost_reason == "expired", mine
    assert mine[0].end < stopped + LEASE, "it believed past its lease"
    assert result.violations == [], summarize(result.sections, result.violations)
    assert min(s.start for s in others) > mine[0].end and min(s.token for s in others) > mine[0].token


def test_an_outage_during_leases_ends_them_before_they_run_out_and_hands_out_none(server, tmp_path):
    # Sections longer than the lease: only heartbeats keep them held.
    lease, heartbeat, hold, outage = 1.5, 0.5, 2.5, 2.5
    with Scenario(
        server.endpoint_url,
        tmp_path,
        4,
        ["a", "b"],
        hold=hold,
        lease=lease,
        heartbeat=heartbeat,
        wait=4.0,
        announce=True,
    ) as sc:
        sc.fleet.start()
        sc.fleet.release()
        time.sleep(0.5)
        # Cut DynamoDB off just after a section began: its lease cannot outlive the outage.
        wait_for(lambda: sc.fleet.began_since(time.time() - 0.2), 30, "a section to begin")
        sc.proxies.pause()  # DynamoDB unreachable for everyone
        paused = time.time()
        time.sleep(outage)
        resumed = time.time()
        sc.proxies.resume()
        wait_for(lambda: sc.fleet.began_since(resumed), lease + 20, "work to resume after the outage")
        sc.fleet.stop()
        result = sc.fleet.results()
    lost = [e for e in result.events("lost") if paused <= e["t"] <= resumed]
    print(
        f"\n[{server.kind}] outage of {outage}s: {len(result.sections)} sections, {len(result.violations)} "
        f"violations, {len(result.events('at_risk'))} at risk, {len(lost)} lost during the outage, told at most "
        f"{max((e['m'] - e['valid_until'] for e in lost), default=float('nan')) * 1000:.0f} ms after local "
        f"validity ended (margin {MARGIN * lease * 1000:.0f} ms); stats {dict(result.stats)}"
    )
    assert result.violations == [], summarize(result.sections, result.violations)

    # Nobody is told they hold a lock while DynamoDB is unreachable (a reply already on its
    # way when the outage began may still arrive: allow half a second for it).
    started_in_outage = [s for s in result.sections if paused + 0.5 < s.start < resumed]
    assert started_in_outage == []

    # Every lease that could not outlive the outage was first "at risk", then "lost"
    # (expired), and the holder was told before its lease would have ended.
    assert lost, "no lease was held across the outage"
    for event in lost:
        assert event["reason"] == "expired", event
        warned = [e for e in result.events("at_risk") if (e["worker"], e["token"]) == (event["worker"], event["token"])]
        assert warned and warned[0]["t"] < event["t"], event
        # Local validity ends a safety margin before the lease: told within it.
        assert event["m"] < event["valid_until"] + MARGIN * event["lease_seconds"], event
    # Their sections saw it and did not write.
    lost_sections = [s for s in result.sections if not s.wrote]
    assert {(e["worker"], e["token"]) for e in lost} <= {(s.worker, s.token) for s in lost_sections}
    # Work resumes after the outage.
    assert any(s.start > resumed for s in result.sections)


def test_a_throttling_storm_costs_no_lease_and_breaks_nothing(server, tmp_path):
    lease, heartbeat, hold = 3.0, 1.0, 1.5
    with Scenario(
        server.endpoint_url, tmp_path, 4, ["a", "b"], hold=hold, lease=lease, heartbeat=heartbeat, wait=2.0
    ) as sc:
        sc.fleet.start()
        sc.fleet.release()
        time.sleep(1.5)
        before = sc.proxies.counts()
        sc.proxies.set_rates({"throttle": 0.5})  # half of all requests throttled...
        storm = time.time()
        time.sleep(4.0)
        half = sc.proxies.counts()
        sc.proxies.set_rates({"throttle": 1.0})  # ...then all of them, for a third of a lease
        time.sleep(lease / 3)
        sc.proxies.set_rates({})
        calm = time.time()
        during = sc.proxies.counts()
        time.sleep(hold + 1.0)
        sc.fleet.stop()
        result = sc.fleet.results()
    throttled = during["throttle"] - before["throttle"]
    print(
        f"\n[{server.kind}] throttling storm: {throttled} of {during['requests'] - before['requests']} requests "
        f"throttled; {len(result.sections)} sections, {len(result.violations)} violations, "
        f"{len(result.events('at_risk'))} renewals at risk, {len(result.events('recovered'))} recovered, "
        f"{len(result.events('lost'))} lost; stats {dict(result.stats)}"
    )
    assert result.violations == [], summarize(result.sections, result.violations)
    # Both phases of the storm throttled requests. (Not a count: throttled waiters now back
    # off, so how many requests a storm meets depends on the engine's pace; "> 50" once
    # met 45.)
    assert before["throttle"] < half["throttle"] < during["throttle"], (before, half, during)
    # Renewals are retried quickly and again before the lease runs out: no lease is lost.
    assert result.events("lost") == []
    assert all(s.wrote for s in result.sections)
    # The storm reached the holders' writes. (Not "a renewal was at risk": a throttled
    # renewal now retries for a third of its validity, and mostly gets through.)
    assert during["UpdateItem:throttle"] > before["UpdateItem:throttle"], "the storm never touched a write"
    assert [s for s in result.sections if storm < s.end < calm], "no progress during the storm"
