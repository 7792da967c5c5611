"""How a waiter watches a busy key: reads while it is held, a reserved turn when starved."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from django_dynlock import BackendError, LockNotAcquired
from django_dynlock.engine import waiting
from django_dynlock.engine.store import backoff
from django_dynlock.management import formatting
from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import dummy_client
from tests.support.calls import count_calls
from tests.support.clients import client_for
from tests.support.polling import wait_for
from tests.support.tables import fresh_table
from tests.test_engine import other_client


def test_a_waiter_polls_a_held_key_with_reads(dynlock):
    holder = dynlock.acquire("held")
    waiter = other_client(dynlock)
    try:
        waiter.try_acquire("warm").release()  # learn the server's capabilities
        with count_calls(waiter) as calls:
            with pytest.raises(LockNotAcquired):
                # Long enough for 5 polls even when a loaded server stretches them to the
                # poll floor's cap (10 MAX_RETRY_DELAYs, +25 % jitter: 0.31 s).
                waiter.acquire("held", wait=2.0)
        # One acquire attempt, then consistent reads until the wait is over.
        assert calls["UpdateItem"] == 1, calls
        assert calls["GetItem"] >= 5, calls
        holder.release()
        with count_calls(waiter) as calls:
            waiter.acquire("held", wait=1).release()
        assert calls == {"UpdateItem": 2}
    finally:
        waiter.close()
        if holder.is_held:
            holder.release()


def test_a_released_key_goes_to_the_waiter(dynlock):
    holder = dynlock.acquire("handoff")
    waiter = other_client(dynlock)
    got = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire("handoff", wait=5)))
    try:
        thread.start()
        time.sleep(0.3)
        assert not got
        holder.release()
        thread.join(5)
        assert got and got[0].token > holder.token
        got[0].release()
    finally:
        waiter.close()


def _swap_holders(server, table: str, key: str, started: threading.Event, stop: threading.Event, refused: list) -> None:
    """Pass ``key`` from holder to holder every 30 ms without ever freeing it, as long as
    nobody has reserved the next turn (the check every acquire makes); then release it."""
    boto = dummy_client(server.endpoint_url)
    item_key = {"key": {"S": key}}
    boto.put_item(
        TableName=table,
        Item={
            **item_key,
            "owner": {"S": "swap:0"},
            "rvn": {"S": "r0"},
            "lease_ms": {"N": "10000"},
            "fence": {"N": "1"},
        },
    )
    started.set()
    for n in range(1, 300):
        if stop.wait(0.03):
            return
        try:
            boto.update_item(
                TableName=table,
                Key=item_key,
                UpdateExpression="SET #o = :new, rvn = :new ADD fence :one",
                ConditionExpression="#o = :old AND attribute_not_exists(reserved_by)",
                ExpressionAttributeNames={"#o": "owner"},
                ExpressionAttributeValues={
                    ":new": {"S": f"swap:{n}"},
                    ":old": {"S": f"swap:{n - 1}"},
                    ":one": {"N": "1"},
                },
            )
        except boto.exceptions.ConditionalCheckFailedException:
            refused.append(n)
            boto.update_item(
                TableName=table,
                Key=item_key,
                UpdateExpression="SET rvn = :rvn REMOVE #o",
                ExpressionAttributeNames={"#o": "owner"},
                ExpressionAttributeValues={":rvn": {"S": "released"}},
            )
            return


def test_a_starving_waiter_reserves_the_next_turn(dynlock):
    waiter = other_client(dynlock)
    ready, stop, refused = threading.Event(), threading.Event(), []
    thread = threading.Thread(
        target=_swap_holders, args=(dynlock.server, dynlock.options.table_name, "hot", ready, stop, refused)
    )
    thread.start()
    try:
        assert ready.wait(10)
        started = time.monotonic()
        lease = waiter.acquire("hot", wait=6)
        waited = time.monotonic() - started
        # The key changed hands but was never free: the waiter reserved the next turn
        # after STARVING_AFTER, the next handover was refused, and the release was its.
        assert refused, "the holders were never refused"
        assert waited >= waiting.STARVING_AFTER, waited
        item = dummy_client(dynlock.server.endpoint_url).get_item(
            TableName=dynlock.options.table_name, Key={"key": {"S": "hot"}}, ConsistentRead=True
        )["Item"]
        assert item["owner"]["S"] == lease.owner
        assert "reserved_by" not in item  # taking the turn used the reservation up
        lease.release()
    finally:
        stop.set()
        thread.join(10)
        waiter.close()


def _orphan_reservation(dynlock, key: str, lease: float):
    """A released key with the reservation a crashed waiter leaves behind; the old holder's lease."""
    holder = dynlock.acquire(key, lease=lease)
    dummy_client(dynlock.server.endpoint_url).update_item(
        TableName=dynlock.options.table_name,
        Key={"key": {"S": key}},
        UpdateExpression="SET reserved_by = :dead",
        ExpressionAttributeValues={":dead": {"S": "dead-host:1:0:0"}},
    )
    holder.release()
    return holder


def test_the_reservation_of_a_dead_waiter_lapses_soon_after_the_release(dynlock):
    # A 10 s lease: watching the key (the fallback) would take 10 s; the lapse takes 2.
    holder = _orphan_reservation(dynlock, "orphan", lease=10.0)
    info = dynlock.get("orphan", include_released=True)
    assert info.reserved_by == "dead-host:1:0:0" and not info.is_held
    assert formatting.state(info, dt.datetime.now(dt.UTC)) == "reserved"  # as showlocks shows it
    assert [i.key for i in dynlock.leases()] == ["orphan"]  # listed, so that it can be broken
    newcomer = other_client(dynlock)
    try:
        assert newcomer.try_acquire("orphan") is None  # the turn is the reserver's, for now
        started = time.monotonic()
        lease = newcomer.acquire("orphan", wait=8)
        took = time.monotonic() - started
        # 2 s after the release by DynamoDB's clock, plus what the two clients do not know of it.
        assert took <= waiting.RESERVATION_GRACE + 2.3, took
        assert lease.token > holder.token
        lease.release()
    finally:
        newcomer.close()


def test_a_break_clears_a_dead_waiters_reservation(dynlock):
    _orphan_reservation(dynlock, "orphan", lease=10.0)
    token = dynlock.get("orphan", include_released=True).token
    assert dynlock.break_lease("orphan", token=token, reason="dead waiter")
    info = dynlock.get("orphan", include_released=True)
    assert info.reserved_by is None and info.was_broken and not info.is_breakable
    newcomer = other_client(dynlock)
    try:
        assert newcomer.try_acquire("orphan") is not None  # free at once
    finally:
        newcomer.close()


def test_a_waiter_that_leaves_for_any_reason_gives_its_reserved_turn_back(dynlock):
    """SystemExit, KeyboardInterrupt, a task's time limit: not only the library's own errors."""
    waiter = other_client(dynlock)
    ready, stop, refused = threading.Event(), threading.Event(), []
    thread = threading.Thread(
        target=_swap_holders, args=(dynlock.server, dynlock.options.table_name, "hot", ready, stop, refused)
    )
    reserved = threading.Event()
    original = waiter._acquirer.reserve

    def reserve_then_exit(*args):
        if original(*args):
            reserved.set()
            raise SystemExit("the worker is shutting down")  # right after the reservation landed
        return False

    waiter._acquirer.reserve = reserve_then_exit
    thread.start()
    try:
        assert ready.wait(10)
        with pytest.raises(SystemExit):
            waiter.acquire("hot", wait=6)
        assert reserved.is_set()
        item = dummy_client(dynlock.server.endpoint_url).get_item(
            TableName=dynlock.options.table_name, Key={"key": {"S": "hot"}}, ConsistentRead=True
        )["Item"]
        assert "reserved_by" not in item
    finally:
        stop.set()
        thread.join(10)
        waiter.close()


def test_a_reservation_only_lands_under_the_holder_it_was_made_for(dynlock):
    """A reservation delayed in the network must not land under a later holder, after the
    acquisition that made it has ended: nobody would ever use it."""
    boto = dummy_client(dynlock.server.endpoint_url)
    table, key = dynlock.options.table_name, {"key": {"S": "turn"}}
    boto.put_item(TableName=table, Item={**key, "owner": {"S": "later-holder"}, "rvn": {"S": "r1"}})
    assert not dynlock._acquirer.reserve("turn", "waiter", "earlier-holder")
    assert "reserved_by" not in boto.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
    assert dynlock._acquirer.reserve("turn", "waiter", "later-holder")
    assert boto.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]["reserved_by"]["S"] == "waiter"
    assert not dynlock._acquirer.reserve("turn", "other-waiter", "later-holder")  # one reservation at a time


def test_the_pauses_after_1100_polls(mock_dynlock):
    # The 1,025th pause computed 2**1024 before it capped: OverflowError.
    policy = mock_dynlock._waiting
    options = mock_dynlock.options
    for tries in (1100, 10**6):
        assert options.min_retry_delay / 2 <= backoff(options, tries) <= options.max_retry_delay
        now = time.monotonic()
        pause = policy.poll_delay(
            tries=tries, reserved=False, took=0.001, error=None, item=None, watch=None, now=now, give_up_at=now + 60
        )
        assert 0 < pause <= 10 * options.max_retry_delay * 1.25
        assert 0 < policy.transaction_delay(tries=tries, seen=[], now=now, give_up_at=now + 60) <= 1


def test_short_holds_are_polled_at_the_backoffs_pace(mock_dynlock):
    # issue 28: after a short hold the handoff stays as fast as before the pause that
    # follows the hold's age. With HOLD_RAMP at 0.3 a waiter slept up to 45 ms at 0.15 s
    # into a hold (60 ms at 0.2 s) where the backoff alone sleeps at most 25 ms.
    policy = mock_dynlock._waiting
    options = mock_dynlock.options
    for age in (0.05, 0.1, 0.15):
        for _ in range(20):  # the pauses are jittered
            now = time.monotonic()
            watch = waiting.Watch(rvn="r", since=now - age, lease_seconds=30.0, holder="h", held_since=now - age)
            pause = policy.poll_delay(
                tries=10, reserved=False, took=0.001, error=None, item=None, watch=watch, now=now, give_up_at=now + 60
            )
            assert pause <= options.max_retry_delay, (age, pause)


def test_a_young_hold_is_polled_more_often_than_every_20_ms(mock_dynlock):
    # issue 40: after a 0.1-0.2 s hold the handoff p50 was 1.07-1.47 x python-dynamodb-lock's
    # polling every 20 ms: a waiter slept 12.5-25 ms (the backoff's later steps, four round
    # trips, the hold's ramp: 25 ms at the median). A hold aged 0.1-0.2 s is now polled
    # 7.5-15 ms apart, over a floor of two round trips; younger, and older, as before.
    policy = mock_dynlock._waiting
    options = mock_dynlock.options
    step = waiting.YOUNG_STEP * options.max_retry_delay
    assert step < 0.02

    def pause(age: float, *, took: float = 0.003, item: dict | None = None, handoffs: int = 0) -> float:
        now = time.monotonic()
        watch = waiting.Watch(rvn="r", since=now - age, lease_seconds=30.0, holder="h", held_since=now - age)
        return policy.poll_delay(
            tries=10,
            reserved=False,
            took=took,
            error=None,
            item=item,
            watch=watch,
            now=now,
            give_up_at=now + 60,
            handoffs=handoffs,
        )

    for age in (0.11, 0.15, 0.19):  # inside the window: now - (now - 0.1) may fall under 0.1
        pauses = [pause(age) for _ in range(50)]  # jittered
        assert step / 2 <= min(pauses) and max(pauses) <= step, (age, pauses)
    # A slow round trip still spaces the looks: two of them (jittered down to 75 %).
    assert min(pause(0.1, took=0.02) for _ in range(20)) >= 2 * 0.02 * 0.75
    # Past HOLD_YOUNG the pause follows the hold's age again.
    assert min(pause(0.3) for _ in range(20)) >= waiting.HOLD_RAMP * 0.3 * waiting.HOLD_JITTER
    # A key seen changing hands (a hot key's) keeps the pace that follows the hold's age.
    assert min(pause(0.15, handoffs=1) for _ in range(20)) >= waiting.HOLD_RAMP_YOUNG * 0.15 * waiting.HOLD_JITTER
    # Another waiter's reserved turn still comes first.
    reserved = {"owner": {"S": "h"}, "reserved_by": {"S": "other"}}
    assert min(pause(0.1, item=reserved) for _ in range(20)) >= 0.75 * waiting.RESERVED_POLL * options.max_retry_delay


def test_one_wait_past_1100_polls_acquires(mock_dynlock, monkeypatch):
    # The 1,025th pause computed 2**1024 before it capped: OverflowError after 24.5 s at
    # the default delays. Short delays reach that poll within seconds (the count is what
    # overflowed, not the time): short retry delays, and no pause that grows with the
    # hold's age (which keeps one holder's waiter far below 1,024 polls). The holder
    # releases once the waiter has polled 1,100 times.
    for constant in ("HOLD_SLACK", "HOLD_SHARE", "HOLD_RAMP"):
        monkeypatch.setattr(waiting, constant, 0.0)
    holder = mock_dynlock.acquire("long-wait")
    waiter = other_client(mock_dynlock, min_retry_delay=0.0005, max_retry_delay=0.0005)
    try:
        with count_calls(waiter) as calls:

            def release_after_1100_polls():
                deadline = time.monotonic() + 25
                while calls["GetItem"] <= 1100 and time.monotonic() < deadline:
                    time.sleep(0.01)
                holder.release()

            releaser = threading.Thread(target=release_after_1100_polls)
            releaser.start()
            try:
                waiter.acquire("long-wait", wait=30).release()
            finally:
                releaser.join(30)
        assert calls["GetItem"] > 1100, calls
    finally:
        waiter.close()
        if holder.is_held:
            holder.release()


def _hold_in_child(endpoint_url: str, table: str, key: str, report: Path, seconds: float) -> subprocess.Popen:
    """Another process holds ``key`` for ``seconds``, then releases it (tests/support/workers.py)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.workers", "hold", endpoint_url, table, key, str(report), str(seconds)],
        cwd=Path(__file__).resolve().parent.parent,
    )
    wait_for(
        lambda: child.poll() is not None or (report.exists() and "ACQUIRED" in report.read_text()),
        30,
        "the holder process to acquire",
    )
    assert child.poll() is None, "the holder process ended before it acquired"
    return child


def _reported(report: Path, event: str) -> float:
    return float(next(line.split()[1] for line in report.read_text().splitlines() if line.startswith(event)))


@pytest.mark.slow
def test_a_waiter_waits_60_s_for_a_key_another_process_holds_40_s(dynamodb_local_server, settings, tmp_path):
    # issue 28: one wait that long crashed after 1,024 polls; the cost of waiting follows
    # the hold's age: <= 80 requests in all, and the key is ours within 0.1 s + 5 % of
    # the hold after the release (was: 1,000+ reads, OverflowError at 24.5 s).
    endpoint = dynamodb_local_server.endpoint_url
    report = tmp_path / "holder.log"
    with fresh_table(settings, endpoint) as client:
        waiter = client_for(endpoint, client.options.table_name, lease_duration=30.0, heartbeat_period=10.0)
        waiter.try_acquire("warm").release()  # the boto3 client is built, DynamoDB's clock known
        child = _hold_in_child(endpoint, client.options.table_name, "long-hold", report, 40)
        try:
            with count_calls(waiter) as calls:
                lease = waiter.acquire("long-hold", wait=60)
            acquired = time.time()
            lease.release()
            assert child.wait(10) == 0
        finally:
            waiter.close()
            if child.poll() is None:
                child.kill()
                child.wait(10)
    held = _reported(report, "RELEASING") - _reported(report, "ACQUIRED")
    late = acquired - _reported(report, "RELEASING")
    assert held >= 40
    assert sum(calls.values()) <= 80, calls
    assert 0 < late <= 0.1 + 0.05 * held, f"acquired {late:.3f}s after a {held:.1f}s hold ended ({calls})"


def test_an_acquire_many_waiter_watches_busy_keys_by_reading(dynlock):
    # issue 28: every look of a waiting acquire_many was a transaction: two write units a
    # key (ten reads' worth) each look, in the holder's partition. Now the keys a
    # transaction found busy are watched by reading, and written when they look free.
    holder = dynlock.acquire("many:2")
    waiter = other_client(dynlock)
    got = []
    try:
        waiter.acquire_many(["warm:1", "warm:2"]).release()  # the server's capabilities, DynamoDB's clock
        if not waiter._store.has_transactions:
            pytest.skip("no transactions (dynalite): one key at a time, each waited for as a single key")
        with count_calls(waiter) as calls:
            with pytest.raises(LockNotAcquired):
                waiter.acquire_many(["many:1", "many:2"], wait=2.0)
        assert calls["TransactWriteItems"] == 1 and calls["BatchGetItem"] >= 3, calls
        thread = threading.Thread(target=lambda: got.append(waiter.acquire_many(["many:1", "many:2"], wait=5)))
        with count_calls(waiter) as calls:
            thread.start()
            time.sleep(0.5)
            holder.release()
            thread.join(5)
        assert got and got[0].is_held, calls
        # The first look, and the one after a read found the key free.
        assert calls["TransactWriteItems"] == 2, calls
    finally:
        for group in got:
            group.release()
        waiter.close()
        if holder.is_held:
            holder.release()


def _requests_while_waiting(proxy, waiter, holder, key: str, seconds: float, *, many: bool = False) -> int:
    """Requests the waiter sends (all through ``proxy``) in one wait of ``seconds`` on a
    fresh hold of ``key`` (``many``: for it and a free key, with acquire_many)."""
    lease = holder.acquire(key, wait=0)
    try:
        before = proxy.requests_seen
        with pytest.raises((LockNotAcquired, BackendError)):
            if many:
                waiter.acquire_many([f"{key}:free", key], wait=seconds)
            else:
                waiter.acquire(key, wait=seconds)
        return proxy.requests_seen - before
    finally:
        lease.release()


@pytest.mark.parametrize("many", [False, True], ids=["acquire", "acquire_many"])
def test_throttled_waiters_back_off(dynlock, many):
    # issue 28: throttled looks were retried three times within ~30 ms, then the waiter
    # looked again within 25 ms: throttled waiters sent more requests, not fewer. Each
    # throttled look in a row now doubles the next pause (reads are sent once). The same
    # for acquire_many, whose throttled transactions are followed by reads.
    # Two fresh holds of 3 s each way (a waiter's first looks are the quickest): some 40
    # requests unthrottled. The proxy's draws are seeded, so a run can be replayed.
    with FaultProxy(dynlock.server.endpoint_url, max_seconds=60, seed=28) as proxy:
        waiter = client_for(proxy.endpoint_url, dynlock.options.table_name)
        try:
            waiter.acquire_many(["warm", "warm:2"]).release()  # the boto3 client built, DynamoDB's clock known
            calm = sum(_requests_while_waiting(proxy, waiter, dynlock, f"calm{n}", 3.0, many=many) for n in range(2))
            operations = ["GetItem", "UpdateItem", "BatchGetItem", "TransactWriteItems"]
            proxy.set_rates({"throttle": 0.5}, operations=operations)
            throttled = sum(
                _requests_while_waiting(proxy, waiter, dynlock, f"throttled{n}", 3.0, many=many) for n in range(2)
            )
        finally:
            proxy.set_rates({})
            waiter.close()
    assert throttled <= 0.7 * calm, f"{throttled} requests in 2 x 3 s at 50 % throttled, {calm} unthrottled"


def test_retry_after_estimates_the_wait_from_the_hold_seen(dynlock):
    # issue 28: a busy key's hint was the time to its expiry, about the whole lease (30 s
    # for a key that frees in 0.5 s). Now: about as long again as the key has been held.
    holder = dynlock.acquire("estimate", lease=30.0)
    waiter = other_client(dynlock)
    try:
        waiter.try_acquire("warm").release()  # DynamoDB's clock known
        with pytest.raises(LockNotAcquired) as young:
            waiter.acquire("estimate", wait=0.5)
        time.sleep(2.5)
        with pytest.raises(LockNotAcquired) as older:
            waiter.acquire("estimate", wait=0.5)
    finally:
        waiter.close()
        holder.release()
    assert 0 < young.value.retry_after <= 2.5, young.value.retry_after  # held ~0.5 s (+ the clock's uncertainty)
    assert 3.0 <= older.value.retry_after <= 30, older.value.retry_after  # held ~3.5 s


def test_retry_after_from_the_handoffs_a_waiter_saw(mock_dynlock):
    # Holders that came and went while we waited held the key about waited / handoffs each.
    holder = mock_dynlock.acquire("handed-on", lease=30.0)
    waiter = other_client(mock_dynlock)
    try:
        stored = waiter.options.prefixed("handed-on")
        item = waiter._store.get_item(stored)
        info = waiter._info(item)
        watch = waiter._waiting.observe(None, item, time.monotonic(), "someone-else")
        assert waiter._waiting.retry_after(info, item, watch, handoffs=4, waited=2.0) == pytest.approx(0.5)
        # A holder seen for 3 s: about as long again, never past the holder's expiry.
        watch.held_since -= 3.0
        assert waiter._waiting.retry_after(info, item, watch) == pytest.approx(3.0, abs=0.5)
        watch.held_since -= 100.0
        assert waiter._waiting.retry_after(info, item, watch) <= 30.0
    finally:
        waiter.close()
        holder.release()
