"""The commands as a shell sees them: ``python manage.py ...`` subprocesses and their exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from localdynamo.servers import REPO_ROOT, dummy_client, server_env, table_name
from tests.support.commands import MOTO, UNREACHABLE


def manage(
    endpoint: str, table: str, *args: str, stdin: Any = subprocess.DEVNULL, timeout: float = 60
) -> subprocess.CompletedProcess:
    """``python manage.py COMMAND --settings=tests.settings ARGS`` pointed at a test server."""
    env = server_env({"DYNLOCK_TEST_ENDPOINT_URL": endpoint, "DYNLOCK_TEST_TABLE": table})
    command = [sys.executable, "manage.py", args[0], "--settings=tests.settings", *args[1:]]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, stdin=stdin, capture_output=True, text=True, timeout=timeout)


def manage_all(*calls: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    """Several independent ``manage(endpoint, table, *args)`` calls at once (mostly Python start-up)."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda call: manage(*call), calls))


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr, result.stderr


@MOTO
def test_subprocess_createlocktable_and_showlocks(dynlock, other):
    endpoint = dynlock.server.endpoint_url
    table = table_name()
    created = manage(endpoint, table, "createlocktable")
    assert created.returncode == 0 and f"Creating table {table!r}" in created.stdout, created.stderr
    lease = other.acquire("shown", holder={"view": "v"})
    again, listed = manage_all(
        (endpoint, table, "createlocktable"),
        (endpoint, dynlock.options.table_name, "showlocks", "--format", "json"),
    )
    assert again.returncode == 0 and "already exists" in again.stdout
    dummy_client(endpoint).delete_table(TableName=table)
    assert listed.returncode == 0 and [r["key"] for r in json.loads(listed.stdout)] == ["shown"]
    lease.release()


@MOTO
def test_subprocess_breaklock_exit_codes(dynlock, other):
    endpoint, table = dynlock.server.endpoint_url, dynlock.options.table_name
    other.acquire("k")
    asks, broken, missing = manage_all(
        (endpoint, table, "breaklock", "k"),  # stdin is not a terminal: refused before anything is read
        (endpoint, table, "breaklock", "k", "--noinput", "--reason", "test"),
        (endpoint, table, "breaklock", "gone", "--no-input", "--reason", "test"),
    )
    assert asks.returncode == 2 and "pass --noinput" in asks.stderr
    assert broken.returncode == 0 and "k: broken: token" in broken.stdout
    assert "lock 'k' (token" in broken.stderr and "broken by" in broken.stderr  # the audit log line
    assert missing.returncode == 1 and "gone: not broken: not found" in missing.stdout
    assert missing.stderr.strip() == "CommandError: 1 of 1 lock not broken: 'gone'"
    for result in (asks, broken, missing):
        no_traceback(result)


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
@MOTO
def test_subprocess_breaklock_asks_on_a_terminal(dynlock, other):
    other.acquire("k")
    leader, follower = os.openpty()
    try:
        os.write(leader, b"y\n")  # typed ahead; the terminal buffers it
        result = manage(
            dynlock.server.endpoint_url,
            dynlock.options.table_name,
            "breaklock",
            "k",
            "--reason",
            "test",
            stdin=follower,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert result.returncode == 0, result.stderr
    assert "Break the lease on 'k'? [y/N]" in result.stdout and "k: broken" in result.stdout


@MOTO
def test_subprocess_runlocked_exit_codes(dynlock, other):
    endpoint, table = dynlock.server.endpoint_url, dynlock.options.table_name
    held = other.acquire("busy")
    inner, exits, fails_inner, busy, busy_exit = manage_all(
        (endpoint, table, "runlocked", "a", "--", "showlocks"),
        (endpoint, table, "runlocked", "b", "--", "shell", "-c", "import sys; sys.exit(7)"),
        (endpoint, table, "runlocked", "c", "--", "createlocktable", "--read", "1"),
        (endpoint, table, "runlocked", "busy", "--", "showlocks"),
        (endpoint, table, "runlocked", "busy", "--busy-exit", "75", "--", "showlocks"),
    )
    held.release()
    # The inner command's output goes to the same stdout: here it lists its own lease.
    assert inner.returncode == 0 and "showlocks on" in inner.stdout
    assert exits.returncode == 7
    assert fails_inner.returncode == 2 and "only apply with --billing-mode PROVISIONED" in fails_inner.stderr
    assert busy.returncode == 0 and "Skipped: lock 'busy' is busy" in busy.stdout
    assert busy_exit.returncode == 75 and "Skipped: lock 'busy' is busy" in busy_exit.stderr
    for result in (inner, exits, fails_inner, busy, busy_exit):
        no_traceback(result)
    assert list(dynlock.leases()) == []  # every run released its lease


@MOTO
def test_subprocess_errors(server):
    unreachable, missing, usage, alias = manage_all(
        (UNREACHABLE, "ttt", "showlocks"),
        (server.endpoint_url, table_name(), "runlocked", "k", "--", "check"),
        (server.endpoint_url, "ttt", "showlocks", "--format", "xml"),
        (server.endpoint_url, "ttt", "breaklock", "k", "--alias", "nope", "--noinput", "--reason", "test"),
    )
    assert unreachable.returncode == 3 and unreachable.stdout == ""
    assert unreachable.stderr.startswith("CommandError: could not connect to DynamoDB at http://127.0.0.1:9")
    assert len(unreachable.stderr.strip().splitlines()) == 1
    assert missing.returncode == 3 and "createlocktable" in missing.stderr
    assert usage.returncode == 2 and "invalid choice: 'xml'" in usage.stderr
    assert alias.returncode == 2 and "unknown alias 'nope'" in alias.stderr
    for result in (unreachable, missing, usage, alias):
        no_traceback(result)


@MOTO
def test_from_a_shell_a_broken_dynlock_setting_exits_2_in_every_command(dynlock):
    # issue 14: Django's system checks fail first and exited 1, which for breaklock means
    # "not every lock was broken"; a setting to fix is exit 2, as documented.
    results = manage_all(
        *[
            (dynlock.server.endpoint_url, "x", *args)
            for args in (
                ("breaklock", "k", "--noinput", "--reason", "test"),
                ("showlocks",),
                ("runlocked", "k", "--", "check"),
                ("createlocktable",),
            )
        ]
    )
    for result in results:
        assert result.returncode == 2, (result.args, result.stderr)
        assert "dynlock.E008" in result.stderr and "TABLE_NAME" in result.stderr
        no_traceback(result)
