"""The commands and semaphores (issue 38): runlocked --limit, setlocklimit, breaklock --token."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from tests.support.commands import fails, run


def test_runlocked_limit_lets_n_runs_hold_the_key(dynlock, other, probe):
    first = other.acquire("cron:n", limit=2)
    assert run("runlocked", "cron:n", "--limit", "2", "--", "dynlock_probe").out == "probe ran\n"
    assert probe.seen[0]["lease"].slot == 1 - first.slot
    second = other.acquire("cron:n", limit=2)
    result = run("runlocked", "cron:n", "--limit", "2", "--", "dynlock_probe")
    assert result.out.startswith("Skipped: lock 'cron:n' is busy (token ")
    assert len(probe.seen) == 1
    error = fails("runlocked", "cron:n", "--limit", "3", "--", "dynlock_probe")
    assert "limit 2 in the table" in str(error) and "setlocklimit cron:n 3" in str(error)
    first.release()
    second.release()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--limit", "100"], "expected a limit of 1-99, got '100'"),
        (["--limit", "0"], "expected a whole number >= 1"),
        (["--limit", "2", "--standby"], "--limit cannot be used with --standby"),
    ],
)
def test_runlocked_bad_limits_take_no_lock(dynlock, probe, args, message):
    error = fails("runlocked", "k", *args, "--", "dynlock_probe")
    assert message in str(error)
    assert probe.seen == []


def test_setlocklimit_shows_and_changes_the_stored_limit(dynlock, other):
    assert run("setlocklimit", "import").out == "import: no limit stored (a lock)\n"
    assert run("setlocklimit", "import", "3").out == "import: limit none -> 3\n"
    held = [other.acquire("import", limit=3) for _ in range(3)]
    out = run("setlocklimit", "import", "2").out
    assert out == (
        "import: limit 3 -> 2; 1 holder(s) in slots past it keep them until they release: until then up to 3 hold it\n"
    )
    assert run("setlocklimit", "import").out == "import: limit 2, 3 held\n"
    for lease in held:
        lease.release()
    assert "expected a limit of 1-99" in str(fails("setlocklimit", "import", "100"))


def test_breaklock_token_breaks_one_holder_of_a_semaphore(dynlock, other):
    held = [other.acquire("export:acme", limit=3, holder={"task": "export"}) for _ in range(3)]
    said = io.StringIO()
    victim = next(lease for lease in held if lease.slot == 2)
    out = run("breaklock", "export:acme", "--token", str(victim.token), "--reason", "stuck", "--noinput").out
    assert out.startswith(f"export:acme: broken: token {victim.token}, held by export on ")
    assert sorted(h.token for h in dynlock.holders("export:acme")) == sorted(
        lease.token for lease in held if lease is not victim
    )
    with pytest.raises(CommandError) as error:
        call_command("breaklock", "export:acme", "--token", "12345", "--reason", "stuck", "--noinput", stdout=said)
    assert error.value.returncode == 1
    assert said.getvalue().startswith("export:acme: not broken: --token 12345 does not match: the lease has token ")
    for lease in held:
        if lease is not victim:
            lease.release()


def test_showlocks_shows_a_semaphore_as_one_row_with_its_holders_beneath(dynlock, other):
    held = [other.acquire("export:acme", limit=5, holder={"task": "export"}) for _ in range(3)]
    lock = other.acquire("invoice:1", holder={"view": "pay"})
    lines = run("showlocks").out.splitlines()
    assert lines[0].split() == ["KEY", "TOKEN", "HOLDER", "ACQUIRED", "EXPIRES", "METADATA"]
    assert lines[1].startswith("invoice:1 ")
    assert lines[2].rstrip() == "export:acme 3/5"
    rows = [line.split() for line in lines[3:6]]
    assert [(row[0], int(row[1])) for row in rows] == sorted((f"#{lease.slot}", lease.token) for lease in held)
    assert all(row[2:4] == ["export", "on"] for row in rows)
    assert "semaphore=" not in "\n".join(lines)  # said by the title row
    records = json.loads(run("showlocks", "--format", "json").out)
    mine = sorted((r["slot"], r["token"], r["semaphore"]) for r in records if r["key"] == "export:acme")
    assert mine == sorted((lease.slot, lease.token, 5) for lease in held)
    assert [r["semaphore"] for r in records if r["key"] == "invoice:1"] == [None]
    for lease in [*held, lock]:
        lease.release()
