"""Hedged requests (engine/hedging.py): a late request gets a second copy, the first answer wins.

Each test puts a FaultProxy between a client and a real server and makes one request
late: held before it is forwarded (``delay``: the copy lands first, the first copy
later), or applied with its reply held (``delay_reply``: the copy finds the first one's
work done, its condition fails on our own item). Both wire paths, threads and asyncio.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from django_dynlock.engine import ClientOptions
from django_dynlock.engine.hedging import HEDGE_CAP, WARM, Hedger, Race, settle
from django_dynlock.exceptions import InvalidArgument
from localdynamo.faultproxy import FaultProxy
from tests.support.clients import client_for
from tests.support.tables import delete_table

LATE = 1.0  # far past any hedge delay (HEDGE_CAP) and under the read timeout
CONFIG = {"read_timeout": 3.0, "connect_timeout": 1.0, "retries": {"total_max_attempts": 1, "mode": "standard"}}


def is_acquire(body: dict[str, Any]) -> bool:
    return "SET #owner = :me" in body.get("UpdateExpression", "")


def is_release(body: dict[str, Any]) -> bool:
    expression = body.get("UpdateExpression", "")
    return "REMOVE #owner" in expression and "#released_by = :me" in expression


@pytest.fixture(params=["dynlock", "boto3"])
def wire(request) -> str:
    return request.param


# The tests' hedge delay (HEDGE_AFTER, the floor of the learnt one): only the requests a
# test makes late are hedged. With the learnt delay (3 x p90 of recent round trips, tens of
# ms), a reply slowed by a loaded host was hedged too, and the counts of copies were off by
# one (CI, 6 workers on 2 cores). Far under LATE / 2, so a hedged request still answers early.
PINNED = 0.3


@pytest.fixture
def proxied(server, wire):
    """(proxy, a client through it, a rival straight to the server): a fresh table; the
    client hedges a request PINNED late."""
    yield from _proxied(server, wire, PINNED)


@pytest.fixture
def proxied_learning(server, wire):
    """As ``proxied``, the client with HEDGE_AFTER 0.025 (the docs' suggestion), its delay learnt from its round trips."""
    yield from _proxied(server, wire, 0.025)


def _proxied(server: Any, wire: str, hedge_after: float | None) -> Iterator[tuple[FaultProxy, Any, Any]]:
    table = f"hedge-{uuid.uuid4().hex[:8]}"
    admin = client_for(server.endpoint_url, table)
    admin.create_table(wait=True)
    with FaultProxy(server.endpoint_url, max_seconds=120) as proxy:
        client = client_for(
            proxy.endpoint_url, table, wire=wire, client_config=CONFIG, lease_duration=10.0, hedge_after=hedge_after
        )
        try:
            warm(client)
            yield proxy, client, admin
        finally:
            client.close()
            admin.close(release=True)
            delete_table(server.endpoint_url, table)


def warm(client) -> None:
    """Round trips for the hedger to learn this server's latency from (hedging.WARM)."""
    hedger = client._store.hedger
    for n in range(40):  # a cold DynamoDB Local (a JIT) on a loaded host takes a while
        client.acquire(f"warm-{uuid.uuid4().hex[:6]}").release()
        if hedger.delay < HEDGE_CAP or (hedger.floor >= HEDGE_CAP and n >= WARM):
            break
    assert hedger.delay < HEDGE_CAP or hedger.delay == hedger.floor


def test_a_late_release_is_hedged_and_its_late_copy_frees_nothing_after(proxied):
    proxy, client, rival = proxied
    lease = client.acquire("k")
    late = proxy.add_fault("delay", operation="UpdateItem", match=is_release, delay_seconds=LATE)
    started = time.monotonic()
    lease.release()
    took = time.monotonic() - started
    assert late.fired == 1 and client._store.hedger.hedged == 1
    assert took < LATE / 2, took  # the copy's reply, not the late one's
    taken = rival.acquire("k")  # free at once; the late copy lands while the rival holds it
    time.sleep(LATE)
    assert rival.get("k").owner == taken.owner and taken.is_held
    taken.release()


def test_a_late_acquire_is_hedged_and_its_late_copy_holds_nothing_after_the_release(proxied):
    proxy, client, rival = proxied
    late = proxy.add_fault("delay", operation="UpdateItem", match=is_acquire, delay_seconds=LATE)
    started = time.monotonic()
    lease = client.acquire("k")
    assert time.monotonic() - started < LATE / 2
    assert late.fired == 1 and client._store.hedger.hedged == 1
    lease.release()
    time.sleep(LATE)  # the first copy lands on the free key: the release slot refuses it
    info = rival.get("k")
    assert info is None or info.owner is None, info
    again = rival.try_acquire("k")
    assert again is not None and again.token > lease.token
    again.release()


def test_a_late_copy_of_an_acquire_that_lands_after_many_holders_is_freed_at_once(proxied):
    # The release slot and ring refuse a late copy of our acquire only until 16 other holders
    # came and went (docs/protocol.md, "Acquire"); at 50 handoffs a second a 0.3 s delay is
    # that many, and the copy held the key for nobody until its expiry (10 s here). The copy's
    # reply says it was applied after the other copy had won: the client frees the key then.
    proxy, client, rival = proxied
    landing = 2.0
    late = proxy.add_fault("delay", operation="UpdateItem", match=is_acquire, delay_seconds=landing)
    started = time.monotonic()
    lease = client.acquire("k")
    lease.release()
    assert late.fired == 1 and client._store.hedger.hedged == 1
    cycles = 0
    while time.monotonic() - started < landing - 0.5 and cycles < 200:  # other holders, each its own owner
        rival.acquire("k").release()
        cycles += 1
    assert cycles >= 40, cycles  # the ring and, most likely, our slot are overwritten
    time.sleep(max(0.0, started + landing + 0.5 - time.monotonic()))  # the copy has landed
    wait_free = time.monotonic()
    again = rival.acquire("k", wait=9)
    assert time.monotonic() - wait_free < 1.0
    again.release()


def test_a_release_whose_copy_fails_its_condition_reads_at_once_while_the_evidence_is_there(proxied):
    # The first try is applied, its reply a 500; the retry's first copy is held 1 s, its
    # copy's condition fails (the first try freed the key). Waiting for the held copy
    # before looking let 16 other holders come and go, overwriting the release ring and
    # most likely our slot: release() raised LockLost ("released") for a release of its
    # own (bench.faults on dynalite, 1 in about 3,500 sections). A release's condition
    # stays false once false: the copy's failure answers at once, and the item still
    # shows our release.
    proxy, client, rival = proxied
    import threading

    lease = client.acquire("k")
    ours = lambda body: is_release(body) and body["ExpressionAttributeValues"][":me"]["S"] == lease.owner  # noqa: E731
    proxy.add_fault("http500_applied", operation="UpdateItem", match=ours)
    held = proxy.add_fault("delay", operation="UpdateItem", match=ours, delay_seconds=1.0)
    stop = threading.Event()
    cycles = [0]

    def others() -> None:
        while not stop.is_set() and cycles[0] < 500:
            other = rival.acquire("k", wait=5)
            time.sleep(0.02)  # 16 holders in about 0.4 s: after the hedge's copy, before the held one
            other.release()
            cycles[0] += 1

    thread = threading.Thread(target=others)
    thread.start()
    try:
        lease.release()  # was: LockLost
    finally:
        time.sleep(1.2)  # other holders come and go while the held copy waits, then it lands
        stop.set()
        thread.join(10)
    assert held.fired == 1 and client._store.hedger.hedged >= 1
    assert cycles[0] >= 20, cycles


def test_an_applied_acquire_whose_reply_is_late_wins_over_its_copys_failed_condition(proxied):
    # The copy finds our own first copy's write: its condition fails on our own item. That
    # must not read as "busy": the race waits for the first copy, whose reply gives the lease.
    proxy, client, rival = proxied
    late = proxy.add_fault("delay_reply", operation="UpdateItem", match=is_acquire, delay_seconds=LATE)
    lease = client.acquire("k", wait=0)
    assert late.fired == 1 and client._store.hedger.hedged == 1
    assert lease.is_held and rival.get("k").owner == lease.owner
    assert rival.try_acquire("k") is None
    lease.release()
    assert rival.get("k") is None  # free


def test_a_waiters_late_write_never_shows_the_key_busy_with_our_own_item(proxied):
    # As above, while another holder has the key: the waiter's write is applied after the
    # release, its reply late; the copy fails on our own item; the waiter gets the key.
    proxy, client, rival = proxied
    held = rival.acquire("k")
    sent: list[float] = []

    def first_write_after_release(body: dict[str, Any]) -> bool:
        if is_acquire(body) and not held.is_held and not sent:
            sent.append(time.monotonic())
            return True
        return False

    late = proxy.add_fault("delay_reply", operation="UpdateItem", match=first_write_after_release, delay_seconds=LATE)
    import threading

    timer = threading.Timer(0.3, held.release)
    timer.start()
    try:
        lease = client.acquire("k", wait=8)
    finally:
        timer.join()
    assert late.fired == 1
    assert lease.is_held and rival.get("k").owner == lease.owner
    lease.release()


def test_without_hedging_the_late_reply_is_waited_for(server):
    table = f"hedge-{uuid.uuid4().hex[:8]}"
    admin = client_for(server.endpoint_url, table)
    admin.create_table(wait=True)
    try:
        with FaultProxy(server.endpoint_url, max_seconds=60) as proxy:
            client = client_for(proxy.endpoint_url, table, client_config=CONFIG, hedge_after=None)
            try:
                warm_none = client.acquire("k")
                proxy.add_fault("delay", operation="UpdateItem", match=is_release, delay_seconds=LATE)
                started = time.monotonic()
                warm_none.release()
                assert time.monotonic() - started >= LATE
                assert client._store.hedger is None
            finally:
                client.close()
    finally:
        admin.close(release=True)
        delete_table(server.endpoint_url, table)


def test_an_async_release_is_hedged(proxied):
    proxy, client, rival = proxied

    async def main() -> float:
        lease = await client.acquire_async("k")
        proxy.add_fault("delay", operation="UpdateItem", match=is_release, delay_seconds=LATE)
        started = time.monotonic()
        await client.run_for_holder(lease.release)
        return time.monotonic() - started

    took = asyncio.run(main())
    assert took < LATE / 2 and client._store.hedger.hedged == 1
    assert rival.get("k") is None  # free


# Replies at the server's usual pace, as the learnt delay sees it: alone, after the
# parallel pass, whose load slows some replies past it.
@pytest.mark.solo
def test_prompt_replies_are_never_hedged(proxied_learning):
    # A hedge costs a request: none on replies at the server's usual pace.
    proxy, client, rival = proxied_learning
    before = proxy.stats.requests
    for _ in range(20):
        client.acquire("k").release()
    assert proxy.stats.requests - before == 40
    assert client._store.hedger.hedged == 0


def idle_connections(client) -> list[Any]:
    """The pool's idle connections, the next one to be taken last (urllib3's LifoQueue)."""
    wire = client._store.wire
    (pool, *_), *_ = wire._routes.values()
    return [conn for conn in pool.pool.queue if conn is not None]


def test_prompt_replies_take_no_thread_on_the_lean_exchange(proxied, wire):
    # The first copy is sent and read on the caller's thread; only a late one's copy takes a
    # thread. Through boto3 (no lean exchange) every hedgeable request hops to one.
    proxy, client, rival = proxied
    threads = client._store.hedger._threads
    before = threads.ran
    for _ in range(20):
        client.acquire("k").release()
    assert client._store.hedger.hedged == 0
    assert threads.ran - before == (0 if wire == "dynlock" else 40)


def test_a_late_first_copy_on_the_callers_thread_is_answered_by_its_copy_and_its_connection_closed(proxied, wire):
    if wire != "dynlock":
        pytest.skip("the first copy goes in place on the lean exchange only")
    proxy, client, rival = proxied
    lease = client.acquire("k")
    first = idle_connections(client)[-1]  # the one the release's first copy takes
    ran = client._store.hedger._threads.ran
    late = proxy.add_fault("delay", operation="UpdateItem", match=is_release, delay_seconds=LATE)
    started = time.monotonic()
    lease.release()
    assert time.monotonic() - started < LATE / 2
    assert late.fired == 1 and client._store.hedger.hedged == 1
    assert client._store.hedger._threads.ran - ran == 1  # the copy's; the first copy stayed on this thread
    # Abandoned mid-reply: closed, never pooled, so no later request reads its late reply.
    assert first.sock is None and all(conn is not first for conn in idle_connections(client))
    time.sleep(LATE + 0.2)  # the late reply has come back, to a closed connection
    for n in range(10):
        key = f"after-{n}"
        held = client.acquire(key)
        assert rival.get(key).owner == held.owner
        assert client.get(key).owner == held.owner  # its own reply, not a stale one
        held.release()
        assert client.get(key) is None
    assert proxy.errors == []


def test_a_first_copy_that_answers_just_after_its_copy_went_out_wins(proxied, wire):
    proxy, client, rival = proxied
    delay = client._store.hedger.delay
    if wire == "dynlock":
        first = idle_connections(client)[-1]
    # The first copy answers about 0.1 s after the copy went out; the copy is held far longer.
    soon = proxy.add_fault("delay", operation="UpdateItem", match=is_acquire, delay_seconds=delay + 0.1)
    held = proxy.add_fault("delay", operation="UpdateItem", match=is_acquire, delay_seconds=LATE)
    started = time.monotonic()
    lease = client.acquire("k", wait=0)
    assert time.monotonic() - started < LATE / 2
    assert soon.fired == 1 and held.fired == 1 and client._store.hedger.hedged == 1
    if wire == "dynlock":
        assert first.sock is not None and first in idle_connections(client)  # read to its end: pooled again
    assert lease.is_held and rival.get("k").owner == lease.owner
    time.sleep(LATE + 0.2)  # the copy lands on our own item: its condition fails, nothing changes
    assert lease.is_held and rival.get("k").owner == lease.owner
    lease.release()
    assert rival.get("k") is None


def test_the_read_timeout_still_bounds_a_first_copy_on_the_callers_thread(proxied, wire):
    # Both copies held past the read timeout (3 s): the first copy's timeout, counted from its
    # own send, ends the race (a read timeout may have been applied), not the copy's later one.
    from django_dynlock.engine import requests as rq

    if wire != "dynlock":
        pytest.skip("the first copy goes in place on the lean exchange only")
    proxy, client, rival = proxied
    assert client.get("k") is None  # GetItem's shape learnt through botocore
    store = client._store
    assert store.wire.lean("get_item")
    first = idle_connections(client)[-1]
    stuck = proxy.add_fault("delay", operation="GetItem", delay_seconds=5.0, times=2)
    params = {"TableName": store.options.table_name, "Key": rq.key(store.options, "k"), "ConsistentRead": True}
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        store.send("get_item", params, hedge=True)
    took = time.monotonic() - started
    assert 2.9 < took < 4.0, took
    assert stuck.fired == 2 and store.hedger.hedged == 1
    assert first.sock is None and all(conn is not first for conn in idle_connections(client))
    assert client.get("k") is None  # the pool serves the next request


def test_a_first_copy_whose_pooled_connection_was_closed_hops_to_a_thread_and_is_hedged(proxied, wire):
    # Store.send saw a live idle connection; the server closed it meanwhile, so the request
    # goes through urlopen, whose transmission is hedged on a thread (InPlace.run).
    import socket

    if wire != "dynlock":
        pytest.skip("the first copy goes in place on the lean exchange only")
    proxy, client, rival = proxied
    lease = client.acquire("k")
    assert client._store.wire.lean("update_item")
    ran = client._store.hedger._threads.ran
    with proxy._conns_cond:
        for conn in list(proxy._conns):
            conn.shutdown(socket.SHUT_RDWR)  # the server's side of every idle connection
    time.sleep(0.1)
    late = proxy.add_fault("delay", operation="UpdateItem", match=is_release, delay_seconds=LATE)
    started = time.monotonic()
    lease.release()
    assert time.monotonic() - started < LATE / 2
    assert late.fired == 1 and client._store.hedger.hedged == 1
    assert client._store.hedger._threads.ran - ran == 2  # the transmission's and the copy's
    assert rival.get("k") is None


# -- the race, without a server ---------------------------------------------------------------------


def _error(code: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": ""}, "ResponseMetadata": {"HTTPStatusCode": status}}, "op")


CONDITION = _error("ConditionalCheckFailedException")
THROTTLED = _error("ProvisionedThroughputExceededException")
FIVE_HUNDRED = _error("InternalServerError", 500)
TIMEOUT = ReadTimeoutError(endpoint_url="http://x")


@pytest.mark.parametrize(
    "arrivals, expected",
    [
        ([{"ok": 1}], {"ok": 1}),  # a reply wins at once, whatever the other copy does
        ([CONDITION, {"ok": 1}], {"ok": 1}),  # failed because the other copy landed first
        ([THROTTLED, {"ok": 1}], {"ok": 1}),
        ([CONDITION, CONDITION], CONDITION),
        ([CONDITION, TIMEOUT], TIMEOUT),  # the other copy may have landed: ambiguous
        ([THROTTLED, CONDITION], CONDITION),  # never applied, and the condition says why
        ([THROTTLED, THROTTLED], THROTTLED),
        ([TIMEOUT], TIMEOUT),  # maybe applied: as without a hedge, at once (an outage)
        ([FIVE_HUNDRED], FIVE_HUNDRED),
    ],
)
def test_an_acquires_race_ends_on_a_reply_or_a_maybe_applied_failure_a_not_applied_one_waits(arrivals, expected):
    race = Race(2, patient=True)
    decided = False
    for index, arrival in enumerate(arrivals):
        failure = arrival if isinstance(arrival, BaseException) else None
        decided = race.arrived(None if failure else arrival, failure)
        assert decided == (index == len(arrivals) - 1)
    if isinstance(expected, BaseException):
        with pytest.raises(type(expected)) as raised:
            race.result()
        assert raised.value is expected
    else:
        assert race.result() == expected


@pytest.mark.parametrize("first", [{"ok": 1}, CONDITION, THROTTLED, TIMEOUT, FIVE_HUNDRED])
def test_any_answer_ends_the_race_of_a_write_whose_condition_stays_false(first):
    # A release or a renewal: it tells its own earlier success from the item, at once.
    race = Race(2)
    failure = first if isinstance(first, BaseException) else None
    assert race.arrived(None if failure else first, failure)
    if failure is None:
        assert race.result() == first
    else:
        with pytest.raises(type(failure)):
            race.result()


def test_the_callers_own_exception_stands_for_every_copy():
    own = KeyboardInterrupt()
    assert settle([TIMEOUT, own]) is own


def test_the_hedge_delay_follows_the_round_trips():
    hedger = Hedger(0.005)
    assert hedger.delay == HEDGE_CAP  # cold: nothing learnt yet
    for _ in range(32):
        hedger._learn(0.004)
    assert hedger.delay == pytest.approx(0.012)  # 3 x p90
    for _ in range(32):
        hedger._learn(0.001)
    assert hedger.delay == 0.005  # the floor
    for _ in range(32):
        hedger._learn(1.0)
    assert hedger.delay == HEDGE_CAP


def test_hedge_after_is_validated():
    assert ClientOptions().hedge_after is None  # off by default: a loaded server gets no extra copies
    assert ClientOptions(hedge_after=None).hedge_after is None
    with pytest.raises(InvalidArgument):
        ClientOptions(hedge_after=-1.0)


@pytest.mark.parametrize(
    "value, expected",
    [(-0.01, "dynlock.E006"), (float("nan"), "dynlock.E006"), ("0.05", "dynlock.E005"), (True, "dynlock.E005")],
)
def test_a_wrong_hedge_after_is_a_system_check_error(settings, value, expected):
    from django.core import checks

    settings.DYNLOCK = {"default": {"HEDGE_AFTER": value}}
    assert expected in [m.id for m in checks.run_checks(tags=["dynlock"])]


@pytest.mark.parametrize("value", [None, 0.05, 1])
def test_hedge_after_none_or_seconds_passes_the_checks(settings, value):
    from django.core import checks

    from django_dynlock.conf import get_options

    settings.DYNLOCK = {"default": {"HEDGE_AFTER": value}}
    assert not [m.id for m in checks.run_checks(tags=["dynlock"]) if "HEDGE_AFTER" in m.msg]
    assert get_options("default").hedge_after == (None if value is None else float(value))
