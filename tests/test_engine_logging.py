"""What an operator's log gets from the lock client (docs/logging.md): one INFO line for the
takeover of a crashed holder (SIGKILLed processes), none for a released key, and DEBUG
lines for acquire and release. On real servers; the decorator's lines: test_logging.py."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import replace

import pytest

from django_dynlock import LockClient
from tests.support.polling import wait_for

# -- a crashed holder's takeover ------------------------------------------------------------


@pytest.fixture
def killed_holders(server, tmp_path):
    """Holder processes of ``k`` and ``j`` (lease 2 s), renewing: a function that SIGKILLs
    them and returns [(token, pid)] of each; then (scenario, that function)."""
    from tests.test_takeover import Scenario, kill, lines

    scenario = Scenario(server, tmp_path)
    reports = [scenario.start("hold", f"holder-{key}", seconds=60, key=key) for key in ("k", "j")]
    children = list(scenario.children)

    def renewed() -> bool:
        return all(any(w[0] == "WROTE" for w in lines(report)[1:]) for report in reports)

    def crash() -> list[tuple[int, int]]:
        for child in children:
            kill(child)
        return [
            (int(next(w[1] for w in lines(report) if w[0] == "ACQUIRED")), child.pid)
            for report, child in zip(reports, children)
        ]

    try:
        wait_for(renewed, 60, "the holders to renew")
        yield scenario, crash
    finally:
        scenario.close()


def takeover_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "django_dynlock" and "took over" in r.getMessage()]


def assert_took_over(line: str, key: str, token: int, pid: int) -> None:
    assert line.startswith(f"took over {key!r} from ") and f":{pid} (token {token}), which never released it: " in line
    when = line.split("its lease ")[1]
    ago = when.split("had expired ")[-1].split("was to expire in ")[-1].split("s ")[0]
    expired = float(ago) if when.startswith("had expired ") else -float(ago)
    # Its last renewal came before the kill, and a lease (2 s) after it at most the key is
    # taken, within the promised lease + 3 s; DynamoDB's clock is known to about a second.
    assert -1.5 < expired < 5, line


@pytest.mark.slow
@pytest.mark.parametrize("how", ["one-key", "one-key-async", "several", "first-write"])
def test_the_takeover_of_a_killed_holder_is_one_info_line(killed_holders, how, caplog):
    """Killed while a waiter watches (it sees the holder, then takes the key), or before a
    fresh process' first write ("first-write": the write that takes the key finds it)."""
    from tests.support.clients import client_for

    scenario, crash = killed_holders
    client = client_for(scenario.endpoint, scenario.table)
    client.get("warm-up")  # its boto3 client built: the first look comes at once after the kill
    try:
        (k_token, k_pid), (j_token, j_pid) = crash()
        with caplog.at_level(logging.INFO, logger="django_dynlock"):
            if how == "one-key":
                held = [client.acquire("k", wait=10)]
            elif how == "one-key-async":
                held = [asyncio.run(client.acquire_async("k", wait=10))]
            elif how == "several":
                held = list(client.acquire_many(["k", "j"], wait=10))
            else:
                time.sleep(2.5)  # the lease has run out: the first write takes the key
                held = [client.acquire("k", wait=10)]
        found = {line.split("'")[1]: line for line in takeover_lines(caplog)}
        assert len(found) == len(held) == len(takeover_lines(caplog)), found
        assert_took_over(found["k"], "k", k_token, k_pid)
        if how == "several":
            assert_took_over(found["j"], "j", j_token, j_pid)
        tokens = {"k": k_token + 1, "j": j_token + 1} if how == "several" else {"k": k_token + 1}
        assert {lease.key: lease.token for lease in held} == tokens
        for lease in held:
            lease.release()
    finally:
        client.close()


def test_a_released_key_is_no_takeover(dynlock, caplog):
    rival = LockClient(replace(dynlock.options))
    held = rival.acquire("handoff", lease=5)
    try:
        threading.Timer(0.5, held.release).start()
        with caplog.at_level(logging.DEBUG, logger="django_dynlock"):
            dynlock.acquire("handoff", wait=5).release()
    finally:
        rival.close()
    assert takeover_lines(caplog) == []


# -- DEBUG lines for acquire and release ----------------------------------------------------


def debug_lines(caplog, verb: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "django_dynlock" and r.levelno == logging.DEBUG and r.getMessage().startswith(verb)
    ]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_acquire_and_release_are_debug_lines(dynlock, caplog, asynchronous):
    rival = LockClient(replace(dynlock.options))
    busy = rival.acquire("b", lease=5)

    async def take(keys: list[str]):
        return await (
            dynlock.acquire_async(keys[0], wait=5) if len(keys) == 1 else dynlock.acquire_many_async(keys, wait=5)
        )

    try:
        with caplog.at_level(logging.DEBUG, logger="django_dynlock"):
            for keys in (["a"], ["b"], ["c", "d"]):
                if keys == ["b"]:
                    # Freed 0.3 s after our first look at it, however long 'a' took: started
                    # before 'a', a loaded machine let 'b' come free before we looked.
                    threading.Timer(0.3, busy.release).start()
                handle = (
                    asyncio.run(take(keys))
                    if asynchronous
                    else (dynlock.acquire(keys[0], wait=5) if len(keys) == 1 else dynlock.acquire_many(keys, wait=5))
                )
                handle.release()
    finally:
        rival.close()
    acquired = debug_lines(caplog, "acquired ")
    released = debug_lines(caplog, "released ")
    assert [line.split()[1] for line in acquired] == ["'a'", "'b'", "'c'", "'d'"], acquired
    # 'b' twice: the rival's release, then ours.
    assert sorted(line.split()[1] for line in released) == ["'a'", "'b'", "'b'", "'c'", "'d'"], released
    a, b = acquired[0], acquired[1]
    assert a.endswith("and 1 look(s)") and float(a.split(" after ")[1].split("s ")[0]) < 2, a
    # The busy key: looked at more than once, and waited for about its holder's 0.3 s.
    assert int(b.split(" and ")[1].split()[0]) > 1 and 0.2 < float(b.split(" after ")[1].split("s ")[0]) < 5, b
    assert all("(token " in line and "after holding it " in line for line in released)
