"""What an operator's log gets from @dynamo_lock (docs/logging.md): a view's busy and failed
answers once an interval with a count, escaped, and never logged by django.request nor
mailed per request. On real servers; the lock client's lines: test_engine_logging.py."""

from __future__ import annotations

import asyncio
import logging
import logging.config
import socket
import threading
from dataclasses import replace

import django
import pytest
from django.core import mail
from django.test import AsyncClient
from django.utils.log import DEFAULT_LOGGING

from django_dynlock import LockClient, decorators

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


@pytest.mark.django_db(transaction=True)
def test_a_busy_line_escapes_the_key_and_holder_it_names(dynlock, caplog):
    """A key filled from a request cannot forge a log line (docs/security.md)."""
    rival = LockClient(replace(dynlock.options))
    held = rival.acquire("cart:a\nINFO forged\u202e", lease=10, holder={"view": "x\ny"})

    async def get() -> int:
        return (await AsyncClient().get("/checkout/", {"user": "a\nINFO forged\u202e"})).status_code

    try:
        with caplog.at_level(logging.INFO, logger="django_dynlock"):
            assert asyncio.run(get()) == 423
    finally:
        held.release()
        rival.close()
    (line,) = [line for line in package_lines(caplog, logging.INFO) if "its lock is busy" in line]
    assert "\n" not in line and "\u202e" not in line
    assert "a\\nINFO forged\\u202e" in line and "x\\ny" in line


def test_the_limiter_loses_no_count_between_threads():
    log = decorators.AnswerLog(interval=0.0, clock=Clock())  # every answer logs the count since the last
    logged: list[int] = []
    lock = threading.Lock()

    def answer() -> None:
        for _ in range(2000):
            found = log.count(("trouble", "view", "code"))
            if found is not None:
                with lock:
                    logged.append(found[0])

    threads = [threading.Thread(target=answer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(logged) == 8 * 2000
