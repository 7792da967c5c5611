"""Handing a lease to another process (engine/handover.py), as a Celery enqueuer hands
its once-only lease to the worker: against DynamoDB Local and dynalite."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from django_dynlock import InvalidArgument, LockClient, LockLost
from django_dynlock.engine import Handover


def other_client(client: LockClient) -> LockClient:
    """A second, independent client on the same table: another process."""
    return LockClient(replace(client.options))


def test_a_handed_over_lease_is_continued_by_its_adopter(dynlock):
    worker = other_client(dynlock)
    try:
        lease = dynlock.acquire("report:1", lease=5, holder={"task": "t", "task_id": "abc"})
        handover = lease.hand_over(keep=20)
        assert not lease.is_held and dynlock.held == []
        info = dynlock.get("report:1")
        assert info is not None and info.lease_seconds == 20 and info.token == lease.token
        assert dynlock.try_acquire("report:1") is None  # nobody holds it in a process, yet it is busy

        # 6 s, renewed every 2 s: a 3 s lease once ran out while four other test runs loaded the 2 cores.
        adopted = worker.adopt(Handover.from_dict(handover.as_dict()), lease=6)
        assert adopted.is_held and adopted.token == lease.token and adopted.holder == {"task": "t", "task_id": "abc"}
        time.sleep(7)  # past the adopted lease: renewed by the adopter's heartbeat
        assert adopted.is_held and worker.try_acquire("report:1") is None
        assert dynlock.get("report:1").lease_seconds == 6
        adopted.release()
        assert dynlock.get("report:1") is None
    finally:
        worker.close()


def test_only_one_process_adopts_a_lease_delivered_twice(dynlock):
    first, second = other_client(dynlock), other_client(dynlock)
    try:
        handover = dynlock.acquire("k").hand_over(keep=10)
        adopted = first.adopt(handover)
        with pytest.raises(LockLost) as lost:
            second.adopt(handover)
        assert lost.value.reason == "taken"
        assert adopted.is_held
        adopted.release()
        with pytest.raises(LockLost) as lost:
            second.adopt(handover)
        assert lost.value.reason == "released"
    finally:
        first.close()
        second.close()


def test_release_handover_ends_that_lease_and_never_a_later_one(dynlock):
    handover = dynlock.acquire("k", lease=1).hand_over()
    assert dynlock.release_handover(handover) is True
    assert dynlock.get("k") is None
    assert dynlock.release_handover(handover) is True  # repeated: still that lease, released

    stale = dynlock.acquire("k", lease=1).hand_over()  # never adopted nor released: it runs out
    time.sleep(1.5)
    later = other_client(dynlock)
    try:
        current = later.acquire("k", wait=10)
        assert current.token > stale.token
        assert dynlock.release_handover(stale) is False
        assert current.is_held and dynlock.get("k").owner == current.owner
        with pytest.raises(LockLost):
            dynlock.adopt(stale)
        current.release()
    finally:
        later.close()


def test_release_handover_after_the_adopter_released(dynlock):
    worker = other_client(dynlock)
    try:
        handover = dynlock.acquire("k").hand_over(keep=10)
        worker.adopt(handover).release()
        assert dynlock.release_handover(handover) is True
        assert dynlock.get("k") is None
    finally:
        worker.close()


def test_release_handover_leaves_an_adopted_lease_alone(dynlock):
    worker, third = other_client(dynlock), other_client(dynlock)
    try:
        handover = dynlock.acquire("k").hand_over(keep=10)
        adopted = worker.adopt(handover, lease=5)
        # Same owner id, but not the giver's lease any more: a revoke hook must not end it.
        assert dynlock.release_handover(handover) is False
        assert adopted.is_held and dynlock.get("k").owner == handover.owner
        assert third.try_acquire("k") is None
        # Unless the caller knows the adopter is dead (its process was killed).
        assert dynlock.release_handover(handover, even_if_adopted=True) is True
        assert dynlock.get("k") is None
    finally:
        worker.close()
        third.close()


@pytest.mark.parametrize(
    "data",
    [{}, {"key": "k", "owner": "o", "token": "x", "seq": "1"}, {"key": "", "owner": "o", "token": "1", "seq": "1"}],
)
def test_malformed_handovers_are_refused(data):
    with pytest.raises(InvalidArgument):
        Handover.from_dict(data)
