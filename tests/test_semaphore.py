"""Semaphores (issue 38): at most ``limit`` holders of a key, each an ordinary lease in its slot."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from django_dynlock import InvalidArgument, InvalidKey, LockClient, LockNotAcquired, SemaphoreConflict
from django_dynlock.engine.keys import MAX_LIMIT, SLOT_MARK
from tests.support.calls import count_calls


def other_client(client: LockClient) -> LockClient:
    """A second, independent client on the same table (as another process would have)."""
    return LockClient(replace(client.options))


def test_n_holders_and_not_one_more(dynlock):
    leases = [dynlock.acquire("export:acme", limit=3, wait=0) for _ in range(3)]
    assert sorted(lease.slot for lease in leases) == [0, 1, 2]
    assert len({lease.token for lease in leases}) == 3
    with pytest.raises(LockNotAcquired) as busy:
        dynlock.acquire("export:acme", limit=3, wait=0.3)
    assert busy.value.holder is not None and busy.value.holder.key == "export:acme"
    assert dynlock.try_acquire("export:acme", limit=3) is None
    holders = dynlock.holders("export:acme")
    assert sorted((h.slot, h.token) for h in holders) == sorted((lease.slot, lease.token) for lease in leases)
    assert all(h.key == "export:acme" for h in holders)
    leases[1].release()
    again = dynlock.acquire("export:acme", limit=3, wait=0)
    assert again.slot == leases[1].slot and again.token > leases[1].token  # a slot's tokens never go back
    for lease in (leases[0], leases[2], again):
        lease.release()
    assert dynlock.holders("export:acme") == []


def test_limit_one_is_the_lock_its_items_and_its_requests(dynlock):
    dynlock.acquire("warmup").release()
    with count_calls(dynlock) as calls:
        lease = dynlock.acquire("invoice:1", limit=1)
        lease.release()
    assert calls == {"UpdateItem": 2}
    assert lease.slot == 0
    assert dynlock.semaphore_limit("invoice:1") is None
    assert [info.key for info in dynlock.leases(include_released=True) if info.key == "invoice:1"] == ["invoice:1"]


def test_a_lock_holder_of_the_key_holds_the_semaphores_slot_0(dynlock):
    """Slot 0 is the key's own item: a process that takes the key as a lock is one of the
    N holders, never an N + 1st."""
    lock = dynlock.acquire("report", wait=0)
    others = [dynlock.acquire("report", limit=2, wait=0)]
    assert others[0].slot == 1
    with pytest.raises(LockNotAcquired):
        dynlock.acquire("report", limit=2, wait=0)
    lock.release()
    others[0].release()


def test_uncontended_costs_one_read_and_one_write_and_a_renewal_one_write(dynlock):
    """Issue 38, what must hold 4. The first use stores the limit: one write more, once."""
    with count_calls(dynlock) as calls:
        first = dynlock.acquire("export:cost", limit=50)
    assert calls == {"BatchGetItem": 1, "UpdateItem": 2}
    first.release()
    with count_calls(dynlock) as calls:
        lease = dynlock.acquire("export:cost", limit=50)
    assert calls == {"BatchGetItem": 1, "UpdateItem": 1}
    with count_calls(dynlock) as calls:
        lease.extend(10.0)
    assert calls == {"UpdateItem": 1}
    with count_calls(dynlock) as calls:
        lease.release()
    assert calls == {"UpdateItem": 1}


@pytest.mark.parametrize("path", ["sync", "async"])
def test_another_limit_raises_semaphore_conflict_before_writing(dynlock, path):
    held = dynlock.acquire("export:x", limit=5)
    other = other_client(dynlock)
    try:
        with count_calls(other) as calls, pytest.raises(SemaphoreConflict) as conflict:
            if path == "sync":
                other.acquire("export:x", limit=3, wait=1)
            else:
                asyncio.run(other.acquire_async("export:x", limit=3, wait=1))
        assert "UpdateItem" not in calls and "PutItem" not in calls
        assert (conflict.value.limit, conflict.value.stored_limit) == (3, 5)
        assert "setlocklimit export:x 3" in str(conflict.value)
        assert other.holders("export:x")[0].token == held.token
    finally:
        other.close()
    held.release()


def test_two_first_users_with_different_limits_do_not_both_store_theirs(dynlock):
    other = other_client(dynlock)
    try:
        dynlock.acquire("fresh", limit=4).release()
        with pytest.raises(SemaphoreConflict):
            other.acquire("fresh", limit=6, wait=0)
        assert dynlock.semaphore_limit("fresh") == 4
    finally:
        other.close()


def test_an_operator_changes_the_limit(dynlock):
    leases = [dynlock.acquire("imports", limit=3, wait=0) for _ in range(3)]
    assert dynlock.set_limit("imports", 2) == 3
    with pytest.raises(SemaphoreConflict):
        dynlock.acquire("imports", limit=3, wait=0)
    # The holder of slot 2 keeps it until it releases: meanwhile 3 hold, the larger limit.
    assert sorted(h.slot for h in dynlock.holders("imports")) == [0, 1, 2]
    for lease in leases:
        lease.release()
    got = [dynlock.acquire("imports", limit=2, wait=0) for _ in range(2)]
    assert sorted(lease.slot for lease in got) == [0, 1]
    assert dynlock.try_acquire("imports", limit=2) is None
    for lease in got:
        lease.release()


def test_arguments_are_checked_before_any_request(dynlock):
    with count_calls(dynlock) as calls:
        for bad in (0, MAX_LIMIT + 1, 2.0, True):
            with pytest.raises(InvalidArgument):
                dynlock.acquire("k", limit=bad)
        with pytest.raises(InvalidKey):
            dynlock.acquire("k" + SLOT_MARK + "1")
        with pytest.raises(InvalidKey):
            dynlock.acquire("k" * 2044, limit=2)
    assert calls == {}
    dynlock.acquire("k" * 2044).release()  # as a lock it fits


def test_async_and_try_forms(dynlock):
    async def main():
        first = await dynlock.acquire_async("a", limit=2, wait=0)
        second = await dynlock.try_acquire_async("a", limit=2)
        third = await dynlock.try_acquire_async("a", limit=2)
        return first, second, third

    first, second, third = asyncio.run(main())
    assert third is None and {first.slot, second.slot} == {0, 1}
    first.release()
    second.release()


def test_per_slot_heartbeat_extend_keep_for_and_loss(dynlock):
    lost = []
    dynlock.add_listener(lambda event, lease=None, **kw: lost.append(lease) if event == "lost" else None)
    lease = dynlock.acquire("hb", limit=3, lease=1.0, wait=0)
    other = dynlock.acquire("hb", limit=3, lease=1.0, wait=0)
    time.sleep(1.5)  # the heartbeat renews each slot
    assert lease.is_held and other.is_held
    lease.extend(4.0)
    holder = next(h for h in dynlock.holders("hb") if h.slot == lease.slot)
    assert holder.lease_seconds == pytest.approx(4.0, abs=0.01) and holder.token == lease.token
    assert dynlock.break_lease("hb", token=lease.token, reason="test") is True  # that holder, not the other
    deadline = time.monotonic() + 5
    while lease.is_held and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not lease.is_held and lost == [lease]
    assert other.is_held and [h.token for h in dynlock.holders("hb")] == [other.token]
    other.keep_for(2.0)  # stops renewing, the slot stays taken for 2 s more
    third = dynlock.acquire("hb", limit=3, wait=0)
    assert dynlock.try_acquire("hb", limit=3) is not None  # the broken slot, free again
    assert dynlock.try_acquire("hb", limit=3) is None
    assert dynlock.break_lease("hb", token=12345) is False
    third.release()


def test_a_renewal_is_one_write_unit_whatever_the_limit(dynlock):
    """Issue 38, what must hold 4: DynamoDB Local's own ConsumedCapacity for a heartbeat's write."""
    if "dynamodb-local" not in dynlock.server.kind:
        pytest.skip("dynalite reports no ConsumedCapacity")
    units: list[float] = []

    def ask(params, **kwargs):
        params["ReturnConsumedCapacity"] = "TOTAL"

    def seen(http_response, parsed, **kwargs):
        if "Error" not in parsed:  # a heartbeat's renewal can meet extend()'s and fail its condition
            units.append(parsed.get("ConsumedCapacity", {}).get("CapacityUnits"))

    leases = [dynlock.acquire("export:units", limit=50, holder={"task": "x" * 200}) for _ in range(50)]
    events = dynlock.boto.meta.events
    events.register("provide-client-params.dynamodb.UpdateItem", ask, unique_id="ask-units")
    events.register("after-call.dynamodb.UpdateItem", seen, unique_id="seen-units")
    try:
        leases[17].extend()
    finally:
        events.unregister("provide-client-params.dynamodb.UpdateItem", unique_id="ask-units")
        events.unregister("after-call.dynamodb.UpdateItem", unique_id="seen-units")
    assert units and set(units) == {1.0}
    for lease in leases:
        lease.release()


def test_a_waiter_on_a_full_semaphore_polls_no_more_often_than_a_lock_waiter(dynlock):
    """Issue 38, what must hold 4: the lock's wait policy, one BatchGetItem a look.

    Counted once the wait has settled (from 1 s on): a lock waiter's first look is a
    write, slower than a read, and the first pause follows how long a look took; over
    the whole 3 s the lock's waiter looked 19-27 times, the semaphore's 26-30 (five runs)."""
    holder = other_client(dynlock)
    waiter = other_client(dynlock)
    try:
        lock = holder.acquire("held-lock", lease=30.0)
        full = [holder.acquire("full", limit=5, lease=30.0) for _ in range(5)]
        waiter.get("warmup")
        settled = {}
        for key, limit in (("held-lock", 1), ("full", 5)):
            sent: list[tuple[float, str]] = []
            unique = f"times-{key}"
            waiter.boto.meta.events.register(
                "before-call.dynamodb",
                lambda model, sent=sent, **kw: sent.append((time.monotonic(), model.name)),
                unique_id=unique,
            )
            began = time.monotonic()
            try:
                with pytest.raises(LockNotAcquired):
                    waiter.acquire(key, limit=limit, wait=3.0)
            finally:
                waiter.boto.meta.events.unregister("before-call.dynamodb", unique_id=unique)
            settled[key] = sum(1 for at, _ in sent if at - began >= 1.0)
            assert {name for _, name in sent} <= {"UpdateItem", "GetItem", "BatchGetItem"}
            print(key, len(sent), "looks,", settled[key], "from 1 s on")
        # One look either way is the phase of the polls against the window's start.
        assert settled["full"] <= settled["held-lock"] + 1, settled
        for lease in [lock, *full]:
            lease.release()
    finally:
        holder.close()
        waiter.close()
