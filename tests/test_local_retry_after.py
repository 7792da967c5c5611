"""Retry-After when the holder is another thread of this process (issue 35 item 2, issue 36 D1).

The in-process gate refuses a second acquire of a key this client holds without a
request. Its hint follows the rule a waiter applies to a holder in another process
(waiting.py): about as long again as the key has been held, never past the end of the
holder's lease. It was the whole lease (30 s for a key held 50 ms), and nothing at all
from a sync acquire_many.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import AsyncClient

from django_dynlock import LockClient, LockNotAcquired
from django_dynlock.engine import Lease
from django_dynlock.signals import lock_busy

pytestmark = pytest.mark.urls("tests.support.decorated_views")

# How far into its hold the holder is when the second acquire comes.
YOUNG = 0.05


@contextlib.contextmanager
def held_on_another_thread(client: LockClient, key: str, lease: float = 30.0) -> Iterator[Lease]:
    """``key`` held by another thread of this process (as another request of one ASGI or WSGI worker)."""
    got: list[Lease] = []
    acquired, done = threading.Event(), threading.Event()

    def hold() -> None:
        with client.acquire(key, lease=lease) as held:
            got.append(held)
            acquired.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert acquired.wait(10), "the holder never got the key"
        yield got[0]
    finally:
        done.set()
        thread.join(10)


def sleep_until_held_for(lease: Lease, seconds: float) -> None:
    time.sleep(max(0.0, lease.acquired_monotonic + seconds - time.monotonic()))


def refused(client: LockClient, path: str, keys: list[str]) -> LockNotAcquired:
    """What the acquire of ``path`` raises for ``keys`` (wait=0)."""
    with pytest.raises(LockNotAcquired) as caught:
        if path == "acquire":
            client.acquire(keys[0], wait=0)
        elif path == "acquire_async":
            asyncio.run(client.acquire_async(keys[0], wait=0))
        elif path == "acquire_many":
            client.acquire_many(keys, wait=0)
        else:
            asyncio.run(client.acquire_many_async(keys, wait=0))
    return caught.value


PATHS = [("acquire", 1), ("acquire_async", 1), ("acquire_many", 2), ("acquire_many_async", 2)]


@pytest.mark.parametrize(("path", "count"), PATHS, ids=[path for path, _ in PATHS])
def test_a_key_held_50_ms_by_another_thread_is_busy_for_about_as_long_again(dynlock, path, count):
    keys = ["seat:1", "seat:2"][:count]
    events: list[dict[str, Any]] = []
    dynlock.add_listener(lambda event, **info: events.append(info) if event == "busy" else None)
    with held_on_another_thread(dynlock, "seat:1") as lease:
        sleep_until_held_for(lease, YOUNG)
        busy = refused(dynlock, path, keys)
        held_for = time.monotonic() - lease.acquired_monotonic
    # Not the lease (30 s): about as long again as it has been held, at least a poll.
    assert dynlock.options.max_retry_delay <= busy.retry_after <= max(held_for, dynlock.options.max_retry_delay), (
        busy.retry_after,
        held_for,
    )
    assert busy.key == "seat:1" and busy.keys == tuple(keys)
    assert busy.holder is not None and busy.holder.token == lease.token and busy.holder.owner == lease.owner
    assert 0 <= busy.waited < 1.0
    (event,) = events
    assert event["key"] == "seat:1" and event["holder"] == busy.holder and event["waited"] == busy.waited


def test_the_estimate_follows_the_age_of_the_hold(dynlock):
    with held_on_another_thread(dynlock, "seat:3") as lease:
        sleep_until_held_for(lease, 1.2)
        busy = refused(dynlock, "acquire_many", ["seat:3", "seat:4"])
        held_for = time.monotonic() - lease.acquired_monotonic
    assert 1.2 <= busy.retry_after <= held_for, (busy.retry_after, held_for)


def test_the_estimate_never_passes_the_end_of_the_holders_lease(dynlock):
    # A 3 s lease held 3.5 s: as long again would outlast what it has left (at most
    # 3 s less the safety margin, since its last renewal).
    with held_on_another_thread(dynlock, "seat:5", lease=3.0) as lease:
        sleep_until_held_for(lease, 3.5)
        busy = refused(dynlock, "acquire", ["seat:5"])
    assert dynlock.options.max_retry_delay <= busy.retry_after <= 3.0 * (1 - dynlock.options.safety_margin)


VIEWS = ["/pay/{n}/", "/payasync/{n}/", "/paymany/{n}/", "/paymanyasync/{n}/"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", VIEWS)
def test_a_decorated_view_answers_retry_after_1_for_a_key_held_50_ms_by_another_request(dynlock, client, url):
    signalled: list[dict[str, Any]] = []

    def on_busy(sender: Any, **info: Any) -> None:
        signalled.append(info)

    lock_busy.connect(on_busy)
    try:
        with held_on_another_thread(dynlock, "order:81") as lease:
            sleep_until_held_for(lease, YOUNG)
            if "async" in url:
                reply = asyncio.run(AsyncClient().get(url.format(n=81)))
            else:
                reply = client.get(url.format(n=81))
            held_for = time.monotonic() - lease.acquired_monotonic
    finally:
        lock_busy.disconnect(on_busy)
    # Retry-After is whole seconds, rounded up (decorators.busy_response): 1 for a hold
    # refused within its first second (unless the machine stalled the request), not 30.
    assert reply.status_code == 423, reply.status_code
    assert 1 <= int(reply["Retry-After"]) <= max(1, math.ceil(held_for)), (reply["Retry-After"], held_for)
    (info,) = signalled
    assert info["key"] == "order:81" and info["holder"].token == lease.token and 0 <= info["waited"] < 1.0
