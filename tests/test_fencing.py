"""Fencing tokens used where the data lives: the ORM and DynamoDB transactions."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from django_dynlock import LockClient
from django_dynlock.fencing import fenced_update
from localdynamo.servers import dummy_client
from testproject.booking.models import Event
from tests.support.workers import decorated_sections


@pytest.mark.django_db
def test_fenced_update_rejects_a_paused_ex_holder(dynlock):
    event = Event.objects.create(name="Gig", seats_left=5)
    paused = dynlock.acquire("event:fence", lease=1.2)
    dynlock._heartbeater.stop()  # the holder stalls: no renewals
    rival = LockClient(replace(dynlock.options))
    try:
        newer = rival.acquire("event:fence", wait=5)  # takes over after watching one lease
        assert newer.token > paused.token
        assert Event.objects.filter(pk=event.pk).fenced_update(newer, seats_left=4)
        # The ex-holder wakes up and writes without checking is_held: refused.
        assert not fenced_update(Event.objects.filter(pk=event.pk), paused, seats_left=0)
        assert Event.objects.get(pk=event.pk).seats_left == 4
        assert Event.objects.filter(pk=event.pk).fenced_update(newer.token, seats_left=3)  # same token: allowed
        newer.release()
    finally:
        rival.close()


@pytest.mark.slow
def test_dynamodb_condition_check_rejects_a_paused_ex_holder(dynlock, tmp_path):
    if dynlock.server.kind == "dynalite":
        pytest.skip("dynalite has no transactions; ConditionCheck needs TransactWriteItems")
    report = tmp_path / "fenced.log"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.workers",
            "fenced",
            dynlock.server.endpoint_url,
            dynlock.options.table_name,
            str(report),
        ],
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        deadline = time.monotonic() + 30
        while not (report.exists() and "ACQUIRED" in report.read_text()):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.05)
        old_token = int(report.read_text().split()[1])
        child.send_signal(signal.SIGSTOP)
        newer = dynlock.acquire("fenced", wait=10)
        assert newer.token > old_token
        Path(str(report) + ".go").write_text("")
        child.send_signal(signal.SIGCONT)
        child.wait(20)
        assert report.read_text().split()[-1] == "TransactionCanceledException"
        item = dummy_client(dynlock.server.endpoint_url).get_item(
            TableName=dynlock.options.table_name, Key={"key": {"S": "data:invoice"}}
        )
        assert "Item" not in item  # the stale write never landed
        newer.release()
    finally:
        child.kill()


@pytest.mark.slow
def test_decorated_code_never_runs_concurrently_across_processes(dynlock, tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0")
    processes, rounds = 4, 15
    args = (dynlock.server.endpoint_url, dynlock.options.table_name, str(counter), rounds)
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        results = [pool.apply_async(decorated_sections, args) for _ in range(processes)]
        sections = sorted((s for r in results for s in r.get(timeout=240)), key=lambda s: s[1])
    assert int(counter.read_text()) == processes * rounds
    for before, after in zip(sections, sections[1:]):
        assert after[1] >= before[2] and after[0] > before[0]
