"""Async waiters: they wait with asyncio.sleep and hop to the client's own pool per request."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from django_dynlock import LockNotAcquired, dynamo_lock
from tests.test_engine import other_client

WAITERS = 60


def _threads(prefix: str) -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith(prefix)}


def cancel_while_waiting(start_waiting: Callable[[], Coroutine[Any, Any, object]]) -> None:
    """Start a wait, cancel it 0.3 s in, and check that the cancellation reaches the caller."""

    async def main() -> None:
        waiting = asyncio.create_task(start_waiting())
        await asyncio.sleep(0.3)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())


# A latency percentile (to_thread p99 <= 0.2 s): alone, after the parallel pass (it read
# 0.247 s once among the parallel pass's other tests on 2 cores).
@pytest.mark.solo
def test_sixty_async_waiters_hold_no_thread_and_the_release_does_not_queue(dynlock):
    # issue 28: the decorator ran each acquire on the loop's default executor (6 threads
    # here): with 7 or more waiters nothing succeeded for 2 s (the holder's release queued
    # behind them), and unrelated to_thread work stalled for seconds.
    sections: list[float] = []
    replies: list[float] = []
    busy: list[float] = []

    @dynamo_lock("hot", wait=2)
    async def section() -> None:
        sections.append(time.monotonic())
        await asyncio.sleep(0.1)

    async def request() -> None:
        started = time.monotonic()
        try:
            await section()
        except LockNotAcquired:
            busy.append(time.monotonic() - started)
        replies.append(time.monotonic() - started)

    async def unrelated(latencies: list[float], until: float) -> None:
        while time.monotonic() < until:
            sent = time.monotonic()
            await asyncio.to_thread(lambda: None)
            latencies.append(time.monotonic() - sent)
            await asyncio.sleep(0.02)

    # Only this client's pool: an earlier test's client of the same alias may still have
    # threads finishing a request (CI once counted 9 such names here).
    pool_name = f"dynlock-{dynlock.options.alias}-waiting"
    earlier = _threads(pool_name)

    async def main() -> tuple[list[float], int]:
        latencies: list[float] = []
        began = time.monotonic()
        probe = asyncio.create_task(unrelated(latencies, began + 2.5))
        await asyncio.gather(*(request() for _ in range(WAITERS)))
        pool_threads = len(_threads(pool_name) - earlier)
        await probe
        return latencies, pool_threads

    latencies, pool_threads = asyncio.run(main())
    assert len(replies) == WAITERS
    # Before: 1 section within the wait, 5 more 18 s later, every reply 18-19 s. The
    # issue's >= 15 is its uvicorn figure; here, on 2 loaded cores, one uncontended
    # acquire + release takes about 40 ms, and 10-14 sections fit in the 2 s.
    handoffs = [later - earlier - 0.1 for earlier, later in zip(sections, sections[1:])]
    assert len(sections) >= 8, f"{len(sections)} of {WAITERS} got the key in 2 s"
    assert statistics.median(handoffs) <= 0.15, f"handoffs took {handoffs}"
    assert max(replies) <= 2.6, f"slowest reply {max(replies):.2f}s"
    assert statistics.quantiles(latencies, n=100)[98] <= 0.2, f"to_thread p99 {max(latencies):.3f}s"
    assert pool_threads <= 8  # executors.WAITING_THREADS


def test_an_async_waiter_takes_a_key_another_client_releases(dynlock):
    holder = other_client(dynlock)
    lease = holder.acquire("remote", wait=0)

    async def main() -> float:
        async def release_soon() -> None:
            await asyncio.sleep(0.3)
            await asyncio.to_thread(lease.release)

        releasing = asyncio.create_task(release_soon())
        got = await dynlock.acquire_async("remote", wait=5)
        await releasing
        try:
            assert got.token > lease.token and got.is_held
        finally:
            await dynlock.run_for_holder(got.release)
        return got.token

    try:
        asyncio.run(main())
    finally:
        holder.close()


def test_a_cancelled_async_waiter_leaves_nothing_behind(dynlock):
    holder = other_client(dynlock)
    lease = holder.acquire("cancelled", wait=0)

    try:
        cancel_while_waiting(lambda: dynlock.acquire_async("cancelled", wait=10))
        lease.release()
        # Neither our in-process gate nor a reservation keeps the key from the next caller.
        dynlock.acquire("cancelled", wait=1).release()
    finally:
        holder.close()


def test_acquire_many_async_is_all_or_nothing(dynlock):
    # On DynamoDB Local one transaction; on dynalite (no transactions) one key at a time,
    # the first given back while the second is busy.
    other = other_client(dynlock)
    blocker = other.acquire("acct:2")
    keys = ["acct:3", "acct:1", "acct:2"]

    async def main() -> None:
        with pytest.raises(LockNotAcquired) as caught:
            await dynlock.acquire_many_async(keys, wait=0.3)
        assert caught.value.key == "acct:2" and set(caught.value.keys) == set(keys)
        assert dynlock.get("acct:1") is None and dynlock.get("acct:3") is None

        async def release_soon() -> None:
            await asyncio.sleep(0.3)
            await asyncio.to_thread(blocker.release)

        releasing = asyncio.create_task(release_soon())
        group = await dynlock.acquire_many_async(keys, wait=5)
        await releasing
        try:
            assert group.keys == ["acct:1", "acct:2", "acct:3"] and group.is_held
            assert all(dynlock.get(k).token == t for k, t in group.tokens.items())
            assert group["acct:2"].token > blocker.token
            assert other.try_acquire("acct:1") is None
        finally:
            await dynlock.run_for_holder(group.release)

    try:
        asyncio.run(main())
        assert all(dynlock.get(k) is None for k in keys)
        assert dynlock.has_transactions is (dynlock.server.kind != "dynalite")
    finally:
        other.close()


def test_async_waiters_for_several_keys_hold_no_thread_of_the_loop(dynlock):
    # Several keys waited on a thread of the event loop's default executor, one thread
    # per waiter (decorators._acquire_in_thread): now the same steps as one key.
    holder = other_client(dynlock)
    lease = holder.acquire("pair:2", wait=0)
    sections: list[tuple[float, float]] = []
    default_threads: list[int] = []

    async def section() -> str:
        try:
            async with dynamo_lock("pair:1", "pair:2", wait=3):
                start = time.monotonic()
                await asyncio.sleep(0.02)
                sections.append((start, time.monotonic()))
                return "ok"
        except LockNotAcquired:
            return "busy"

    async def main() -> list[str]:
        waiting = [asyncio.create_task(section()) for _ in range(20)]
        await asyncio.sleep(0.5)
        default_threads.append(len(_threads("asyncio_")))
        await asyncio.to_thread(lease.release)
        return await asyncio.gather(*waiting)

    try:
        outcomes = asyncio.run(main())
    finally:
        holder.close()
    assert default_threads == [0], "waiters for several keys held threads of the loop's default executor"
    assert outcomes.count("ok") >= 1, outcomes
    sections.sort()
    for (_, end), (start, _) in zip(sections, sections[1:]):
        assert start >= end, f"two groups held at once: {sections}"


def test_a_cancelled_async_group_waiter_leaves_nothing_behind(dynlock):
    holder = other_client(dynlock)
    lease = holder.acquire("grp:2", wait=0)

    try:
        cancel_while_waiting(lambda: dynlock.acquire_many_async(["grp:1", "grp:2"], wait=10))
        assert dynlock.get("grp:1") is None  # given back (dynalite), or never written (a transaction)
        lease.release()
        # Neither our in-process gates nor a reservation keeps the keys from the next caller.
        dynlock.acquire_many(["grp:1", "grp:2"], wait=1).release()
    finally:
        holder.close()
