"""runlocked: running another command under a lease; every command's --alias."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from django_dynlock import get_lock_client
from localdynamo.servers import dummy_client, table_name
from tests.support.aliases import alias_settings
from tests.support.commands import MOTO, fails, run
from tests.support.tables import fresh_table


def test_runlocked_runs_the_command_under_the_lease(dynlock, probe):
    result = run("runlocked", "cron:probe", "--", "dynlock_probe", "--key", "cron:probe")
    assert result.out == "probe ran\n"
    [seen] = probe.seen
    info = seen["info"]
    assert info.token == seen["lease"].token and info.holder == {"command": "dynlock_probe"}
    assert info.host == os.uname().nodename and info.pid == os.getpid()
    assert info.lease_seconds == dynlock.options.lease_duration
    assert dynlock.get("cron:probe") is None  # released afterwards


@MOTO
def test_runlocked_without_separator_and_options_before_it(dynlock, probe):
    run("runlocked", "k", "dynlock_probe")
    run("runlocked", "--wait", "0.5", "k", "--lease", "5", "--", "dynlock_probe")
    assert [s["info"].lease_seconds for s in probe.seen] == [dynlock.options.lease_duration, 5.0]


@MOTO
def test_runlocked_heartbeats_while_the_command_runs(dynlock, probe):
    # A lease of 3 s renewed every second leaves 1.7 s for a renewal to come back. With 1 s
    # (0.6 s to spare) the lease was lost twice in CI's Django 6.1 pass (runs 19 and 23,
    # on a machine at load 9), never here, not even beside 12 CPU hogs.
    run("runlocked", "k", "--lease", "3.0", "--", "dynlock_probe", "--sleep", "3.5")
    [seen] = probe.seen
    assert seen["held_at_end"], seen["lease"].upkeep.lost  # renewed for longer than the lease


def test_runlocked_busy_skips(dynlock, other, probe):
    held = other.acquire("k", holder={"command": "dynlock_probe"})
    result = run("runlocked", "k", "--", "dynlock_probe")
    assert result.out.startswith(f"Skipped: lock 'k' is busy (token {held.token}, held by dynlock_probe on ")
    assert probe.seen == []
    assert run("runlocked", "k", "--", "dynlock_probe", verbosity=0).out == ""
    error = fails("runlocked", "k", "--busy-exit", "75", "--", "dynlock_probe")
    assert error.returncode == 75 and "Skipped: lock 'k' is busy" in str(error)
    held.release()


@MOTO
def test_runlocked_waits(dynlock, other, probe):
    held = other.acquire("k")
    timer = threading.Timer(0.3, held.release)
    timer.start()
    try:
        assert run("runlocked", "k", "--wait", "5", "--", "dynlock_probe").out == "probe ran\n"
    finally:
        timer.cancel()


@MOTO
def test_runlocked_at_least_keeps_the_lock(dynlock, other, probe):
    # Long enough that a run slowed by a loaded machine still ends well inside it (3 s was
    # not: a run beside the parallel pass took 3.7 s).
    at_least = 10.0
    started = time.monotonic()
    result = run("runlocked", "k", "--at-least", str(at_least), "--", "dynlock_probe")
    assert result.err == "" and time.monotonic() - started < at_least  # exits at once, the lease stays
    assert other.try_acquire("k") is None  # another host's run of the same minute skips
    client = get_lock_client()
    kept = client.get("k")
    left = kept.expires_in(client.server_datetime())
    # Stamped by the latest DynamoDB's clock could read: up to our uncertainty about it later.
    assert 0 < kept.lease_seconds <= at_least and 0 < left <= at_least + client.clock.uncertainty()
    # Any later run takes it once the kept expiry has passed by DynamoDB's clock.
    assert run("runlocked", "k", "--wait", str(at_least + 3), "--", "dynlock_probe").out == "probe ran\n"
    assert time.monotonic() - started >= at_least
    assert len(probe.seen) == 2


@MOTO
def test_runlocked_at_least_shorter_than_the_run_releases(dynlock, other, probe):
    run("runlocked", "k", "--at-least", "0.1", "--", "dynlock_probe", "--sleep", "0.2")
    assert other.try_acquire("k") is not None


@MOTO
def test_runlocked_takes_over_a_holder_that_stopped_renewing(dynlock, other, probe):
    other.acquire("k").keep_for(0.2)  # as a crashed holder leaves it, with a short lease
    started = time.monotonic()
    # A one-shot run with no --wait: each try is one acquire, taken once the expiry passed.
    for _ in range(40):
        if run("runlocked", "k", "--", "dynlock_probe").out == "probe ran\n":
            break
        time.sleep(0.1)
    assert len(probe.seen) == 1
    assert time.monotonic() - started < 0.2 + 3.0


@MOTO
def test_runlocked_ctrl_c_releases_at_once(dynlock, other, probe):
    with pytest.raises(KeyboardInterrupt):
        run("runlocked", "k", "--at-least", "30", "--", "dynlock_probe", "--interrupt")
    assert other.try_acquire("k") is not None


@MOTO
def test_runlocked_passes_the_exit_code_through(dynlock, probe):
    error = fails("runlocked", "k", "--", "dynlock_probe", "--exit", "5")
    assert error.returncode == 5 and str(error) == "probe failed"
    with pytest.raises(SystemExit) as caught:
        run("runlocked", "k", "--", "dynlock_probe", "--sys-exit", "7")
    assert caught.value.code == 7
    with pytest.raises(ValueError, match="probe crashed"):
        run("runlocked", "k", "--", "dynlock_probe", "--crash")
    assert len(probe.seen) == 3 and dynlock.get("k") is None  # released every time


@MOTO
def test_runlocked_reports_a_lease_lost_during_the_run(dynlock, probe):
    result = run("runlocked", "k", "--", "dynlock_probe", "--break-own-lock")
    assert result.out == "probe ran\n"
    assert "Warning: the lock ended before the run finished" in result.err and "broken" in result.err


@MOTO
@pytest.mark.parametrize(
    "args, message",
    [
        (["k"], "no command to run"),
        (["k", "--"], "no command to run"),
        (["k", "--", "nosuchcommand"], "unknown command 'nosuchcommand'"),
        (["k", "--", "dynlock_probe", "--bogus"], "dynlock_probe: Error: unrecognized arguments: --bogus"),
        (["k", "dynlock_probe", "--", "dynlock_probe"], "give the command after -- only"),
        (["k", "--wait", "-1", "--", "dynlock_probe"], "expected a finite number of seconds >= 0"),
        (["k", "--lease", "0", "--", "dynlock_probe"], "expected a number of seconds > 0"),
        (["k", "--busy-exit", "300", "--", "dynlock_probe"], "expected an exit code 0-255"),
        (["", "--", "dynlock_probe"], "key"),
    ],
)
def test_runlocked_bad_arguments_take_no_lock(dynlock, probe, args, message):
    error = fails("runlocked", *args)
    assert error.returncode == 2 and message in str(error)
    assert probe.seen == [] and list(dynlock.leases(include_released=True)) == []


@MOTO
def test_every_command_uses_the_alias_it_is_given(dynlock, settings):
    reports = table_name()
    settings.DYNLOCK = {**settings.DYNLOCK, "reports": alias_settings(dynlock.server.endpoint_url, reports)}
    assert f"Creating table {reports!r}" in run("createlocktable", "--alias", "reports").out
    lease = get_lock_client("reports").acquire("report:1")
    get_lock_client().acquire("default:1").release()
    assert [r["key"] for r in json.loads(run("showlocks", "--alias", "reports", "--format", "json").out)] == [
        "report:1"
    ]
    run("breaklock", "--alias", "reports", "report:1", "--noinput", "--reason", "test")
    assert not lease.is_held  # same process: it learns at once
    get_lock_client("reports").close()
    dummy_client(dynlock.server.endpoint_url).delete_table(TableName=reports)


@MOTO
def test_runlocked_alias(dynlock, probe, settings):
    with fresh_table(settings, dynlock.server.endpoint_url, "reports"):
        run("runlocked", "--alias", "reports", "k", "--", "dynlock_probe")
        assert [i.key for i in get_lock_client("reports").leases(include_released=True)] == ["k"]
        assert list(get_lock_client().leases(include_released=True)) == []
