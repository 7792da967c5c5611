"""What an operator's log gets (docs/logging.md): the decorator's busy and failed answers
once an interval with a count and never mailed per request, a crashed holder's takeover,
and DEBUG lines for acquire and release. On real servers."""

from __future__ import annotations

import asyncio
import logging
import logging.config
import socket
import threading
import time
from dataclasses import replace

import django
import pytest
from django.core import mail
from django.test import AsyncClient
from django.utils.log import DEFAULT_LOGGING

from django_dynlock import LockClient, decorators
from tests.support.polling import wait_for

pytestmark = pytest.mark.urls("tests.support.decorated_views")

REQUESTS = 50
INTERVAL = 60.0


class Clock:
    """The rate limiter's clock, moved by the test: the counts do not depend on timing."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(decorators, "answers", decorators.AnswerLog(interval=INTERVAL, clock=clock))
    return clock


@pytest.fixture
def mailing_admins(settings):
    """Django's default logging, mailing ADMINS on django.request's errors (DEBUG is False).
    Mail goes to ``mail.outbox``: Django's test environment sets the locmem backend."""
    settings.ADMINS = [("Ops", "ops@example.com")] if django.VERSION < (6,) else ["ops@example.com"]
    settings.DEBUG = False
    logging.config.dictConfig(DEFAULT_LOGGING)
    mail.outbox = []
    yield
    mail.outbox = []


@pytest.fixture
def unreachable(settings, dynlock):
    """The default alias pointed at a port nobody listens on: DynamoDB is unreachable."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.DYNLOCK = {"default": {**settings.DYNLOCK["default"], "ENDPOINT_URL": f"http://127.0.0.1:{port}"}}


def package_lines(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "django_dynlock" and r.levelno == level]


def request_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "django.request"]


def burst(get, clock: Clock) -> list[int]:
    """REQUESTS answers; the limiter's clock passes the interval after the first half."""
    statuses = []
    for n in range(REQUESTS):
        if n == REQUESTS // 2:
            clock.now += INTERVAL + 1
        statuses.append(get())
    return statuses


@pytest.mark.django_db
def test_an_outage_is_logged_once_an_interval_and_mails_nobody(unreachable, mailing_admins, clock, client, caplog):
    with caplog.at_level(logging.DEBUG):
        statuses = burst(lambda: client.get("/pay/1/").status_code, clock)
    assert statuses == [503] * REQUESTS
    assert mail.outbox == []
    assert request_lines(caplog) == []
    lines = [line for line in package_lines(caplog, logging.WARNING) if "could not acquire its lock" in line]
    assert len(lines) == 2, lines
    where = "tests.support.decorated_views.pay: could not acquire its lock, answered 503"
    assert lines[0].startswith(where + ": ")
    # The first answer after the interval logs those since the line before: the 2nd to the 26th.
    assert lines[1].startswith(where + f" {REQUESTS // 2} times in the last 61s: ")


@pytest.mark.django_db
def test_a_busy_key_is_logged_once_an_interval_and_mails_nobody(dynlock, mailing_admins, clock, client, caplog):
    rival = LockClient(replace(dynlock.options))
    held = rival.acquire("order:7", lease=30)
    try:
        with caplog.at_level(logging.DEBUG):
            statuses = burst(lambda: client.get("/pay/7/").status_code, clock)
    finally:
        held.release()
        rival.close()
    assert statuses == [423] * REQUESTS
    assert mail.outbox == []
    assert request_lines(caplog) == []
    lines = package_lines(caplog, logging.INFO)
    busy = [line for line in lines if "its lock is busy" in line]
    assert len(busy) == 2, lines
    where = "tests.support.decorated_views.pay: its lock is busy, answered 423"
    assert busy[0].startswith(where + ": ") and "order:7" in busy[0]
    assert busy[1].startswith(where + f" {REQUESTS // 2} times in the last 61s: ")


@pytest.mark.django_db(transaction=True)
def test_an_async_view_alike(dynlock, mailing_admins, clock, caplog, settings):
    rival = LockClient(replace(dynlock.options))
    held = rival.acquire("cart:4", lease=30)

    async def get() -> int:
        return (await AsyncClient().get("/checkout/", {"user": "4"})).status_code

    try:
        with caplog.at_level(logging.DEBUG):
            busy = burst(lambda: asyncio.run(get()), clock)
    finally:
        held.release()
        rival.close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.DYNLOCK = {"default": {**settings.DYNLOCK["default"], "ENDPOINT_URL": f"http://127.0.0.1:{port}"}}
    with caplog.at_level(logging.DEBUG):
        failed = burst(lambda: asyncio.run(get()), clock)
    assert busy == [423] * REQUESTS and failed == [503] * REQUESTS
    assert mail.outbox == []
    assert request_lines(caplog) == []
    where = "tests.support.decorated_views.checkout"
    busy_lines = [line for line in package_lines(caplog, logging.INFO) if "its lock is busy" in line]
    assert [line.startswith(where) for line in busy_lines] == [True, True], busy_lines
    assert f" {REQUESTS // 2} times in the last 61s: " in busy_lines[1]
    failed_lines = [line for line in package_lines(caplog, logging.WARNING) if "could not acquire its lock" in line]
    assert len(failed_lines) == 2 and all(line.startswith(where) for line in failed_lines), failed_lines
    assert f"answered 503 {REQUESTS // 2} times in the last 61s: " in failed_lines[1]


def test_the_limiter_keeps_a_bounded_number_of_kinds():
    clock = Clock()
    log = decorators.AnswerLog(interval=INTERVAL, tracked=3, clock=clock)
    assert [log.count(("busy", str(n))) for n in range(5)] == [(1, None)] * 5
    assert len(log._kinds) == 3
    assert log.count(("busy", "0")) == (1, None)  # forgotten: a first answer again
    assert log.count(("busy", "4")) is None
    clock.now += INTERVAL
    assert log.count(("busy", "4")) == (2, INTERVAL)


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
    threading.Timer(0.3, busy.release).start()

    async def take(keys: list[str]):
        return await (
            dynlock.acquire_async(keys[0], wait=5) if len(keys) == 1 else dynlock.acquire_many_async(keys, wait=5)
        )

    try:
        with caplog.at_level(logging.DEBUG, logger="django_dynlock"):
            for keys in (["a"], ["b"], ["c", "d"]):
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
