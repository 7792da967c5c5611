"""The undo of an acquire that ended without a lease, in an outage (issue 36, N2 and N3).

An acquire that gives up (busy, an error, an interrupt) undoes the writes of its own that
may have landed unseen, gives back a reserved turn and, in ``acquire_many``, the keys it
already holds. Found on DynamoDB Local through the fault proxy:

- N2: ``acquire_many(wait=1)`` of 10 keys against an unreachable DynamoDB took 22 s: the
  undo waited one request timeout per key (dynalite, one key at a time: one per lease
  given back, three tries each), although docs/protocol.md promised to stop after the
  first undo that cannot reach DynamoDB. Now ``wait`` bounds every acquire in an outage:
  ``wait``, plus one request's timeout, plus one try of the undo, whatever the number of
  keys.
- N3: an undo that could not reach DynamoDB was never tried again, so the keys whose
  writes had landed stayed held by nobody until their expiry. Now it goes on in the
  background, like a failed release, and the keys are free within seconds of the link
  healing. Like the release, it frees a key only while the key carries our write: a
  later holder is never freed by it.

Each runs on DynamoDB Local and dynalite (which has no transactions: ``acquire_many``
takes the keys one at a time there), sync and async, one key and several.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import pytest

from django_dynlock import BackendError
from django_dynlock.engine.items import release_slot
from localdynamo.faultproxy import FaultProxy
from tests.reliability.harness import create_table
from tests.support.clients import client_for
from tests.support.polling import wait_for
from tests.support.tables import delete_table

READ_TIMEOUT = 0.3
CONFIG = {"read_timeout": READ_TIMEOUT, "connect_timeout": 0.5}
WAIT = 1.0
# Room for a shared, loaded machine: a few scheduler delays, never a whole request timeout.
SLACK = 0.5
# Long enough that a key left to its expiry is plainly not one freed by the undo.
LEASE = 9.0
FREED_WITHIN = 3.0

# (how, number of keys): one key through acquire(), several through acquire_many().
CALLS = [("acquire", 1), ("acquire_async", 1), ("acquire_many", 10), ("acquire_many_async", 10)]


def call(client, how: str, keys: list[str], **kwargs):
    """One acquire of ``keys`` the way ``how`` names: sync or async, one key or several."""
    target = keys[0] if how.startswith("acquire_async") or how == "acquire" else keys
    method = getattr(client, how)
    if how.endswith("_async"):
        return asyncio.run(method(target, **kwargs))
    return method(target, **kwargs)


def mentions(body: dict, key: str) -> bool:
    """Whether a request (a write, a read, a transaction) is about ``key``."""
    return f'"{key}"' in json.dumps(body)


def is_acquire(body: dict) -> bool:
    return "SET #owner = :me" in json.dumps(body)


def is_mark(body: dict, owner: str) -> bool:
    """The slot mark an undo writes for ``owner`` (requests.mark_slot, ``undone:`` and its tag)."""
    _, tag = release_slot(owner)
    values = body.get("ExpressionAttributeValues", {})
    return body.get("UpdateExpression", "").startswith("SET #slot = :tag") and values.get(":tag") == {
        "S": "undone:" + tag
    }


def is_release_of(body: dict, owner: str) -> bool:
    return (
        "REMOVE #owner" in body.get("UpdateExpression", "")
        and body.get("ExpressionAttributeValues", {}).get(":me", {}).get("S") == owner
    )


@pytest.fixture
def table(server):
    name = create_table(server.endpoint_url)
    yield server.endpoint_url, name
    delete_table(server.endpoint_url, name)


@pytest.fixture
def link(table):
    """(proxy, holder through the proxy, rival straight to the server)."""
    endpoint, name = table
    with FaultProxy(endpoint, max_seconds=90, record=True) as proxy:
        holder = client_for(proxy.endpoint_url, name, lease_duration=LEASE, heartbeat_period=1.0, client_config=CONFIG)
        rival = client_for(endpoint, name, lease_duration=LEASE, heartbeat_period=1.0)
        try:
            # Built, DynamoDB's clock known, and (dynalite) the missing transactions learnt.
            holder.acquire_many(["warm-1", "warm-2"], wait=1).release()
            yield proxy, holder, rival
        finally:
            holder.close()
            proxy.clear_faults()
            rival.close()


@pytest.mark.parametrize(("how", "count"), CALLS)
def test_wait_bounds_an_acquire_whose_link_hangs(link, how, count):
    """N2. A rival holds the last key; from the first request about it on, every request
    of the holder hangs past its timeout (and is forwarded later). With transactions the
    first one is about every key, and all of them get an undo; without, the keys before
    the last are ours by then, and are given back. Without the change, 10 keys took
    4.3 s on DynamoDB Local (one timeout per key's undo) and 9.7 s on dynalite (three
    tries of each give-back)."""
    proxy, holder, rival = link
    keys = [f"n2-{i:02d}-{uuid.uuid4().hex[:6]}" for i in range(count)]
    last = keys[-1]
    held = rival.acquire(last, wait=0)
    hanging = threading.Event()

    def hangs(body: dict) -> bool:
        if mentions(body, last):
            hanging.set()
        return hanging.is_set()

    proxy.add_fault("delay", match=hangs, delay_seconds=3 * READ_TIMEOUT, times=10_000)
    started = time.monotonic()
    try:
        with pytest.raises(BackendError):
            call(holder, how, keys, wait=WAIT)
        took = time.monotonic() - started
    finally:
        held.release()
    assert hanging.is_set()
    bound = WAIT + 2 * READ_TIMEOUT + SLACK  # the wait, the request in flight, one undo try
    print(f"{how} of {count} key(s), wait={WAIT}: {took:.2f}s")
    assert took < bound, f"{how} of {count} key(s), wait={WAIT}: {took:.2f}s in an outage (bound {bound:.1f}s)"


class Landed(threading.Event):
    at: float | None = None  # monotonic, when the proxy forwarded the write


def cut_after_the_write_lands(proxy: FaultProxy, last: str) -> Landed:
    """The write that takes ``last`` (with transactions, every key) is applied and its
    reply lost; from then on every request is reset (the link is down) until
    ``proxy.clear_faults()``."""
    landed = Landed()

    def takes_last(body: dict) -> bool:
        if is_acquire(body) and mentions(body, last):
            landed.at = time.monotonic()
            landed.set()
            return True
        return False

    proxy.add_fault("drop_reply", match=takes_last, times=1)
    proxy.add_fault("reset", match=lambda body: landed.is_set(), times=100_000)
    return landed


@pytest.mark.parametrize(("how", "count"), [(how, min(count, 4)) for how, count in CALLS])
def test_an_undo_that_could_not_reach_dynamodb_frees_the_keys_once_the_link_heals(link, how, count):
    """N3. The holder's write lands unseen and the link goes down: the call gives up
    and its undo cannot get through. Without the change the keys stayed held by
    nobody until their expiry (a 9 s lease here); now the undo (and, without
    transactions, the release of each key already got) goes on in the background."""
    proxy, holder, rival = link
    keys = [f"n3-{i:02d}-{uuid.uuid4().hex[:6]}" for i in range(count)]
    landed = cut_after_the_write_lands(proxy, keys[-1])
    with pytest.raises(BackendError):
        call(holder, how, keys, wait=WAIT)
    assert landed.is_set()
    # The premise: every key is held, by writes of a call that returned without a lease.
    ghosts = {key: rival.get(key) for key in keys}
    assert all(info is not None for info in ghosts.values()), ghosts
    time.sleep(1.0)  # the outage goes on: the background tries fail too
    proxy.clear_faults()
    healed = time.monotonic()
    wait_for(lambda: all(rival.get(key) is None for key in keys), FREED_WITHIN, "the keys freed after the link healed")
    freed = time.monotonic() - healed
    left = LEASE - (healed - landed.at)  # till the expiry of the last key's write
    print(f"{how} of {count} key(s): freed {freed:.2f}s after the link healed, {left:.2f}s before the expiry")
    assert freed < left - 1.0
    got = rival.acquire_many(keys, wait=0) if count > 1 else rival.acquire(keys[0], wait=0)
    got.release()


@pytest.mark.parametrize("how", ["acquire", "acquire_many_async"])
def test_a_background_undo_never_frees_a_later_holder(link, how):
    """The background undo is the release of a write that may have landed: conditioned on
    our owner id. Here the write lands, the link stays down past its (short) lease, a
    rival takes the key over; when the link heals the undo's mark and release go
    through, and the rival keeps the key."""
    proxy, holder, rival = link
    keys = [f"safe-{i:02d}-{uuid.uuid4().hex[:6]}" for i in range(1 if how == "acquire" else 2)]
    cut_after_the_write_lands(proxy, keys[-1])
    with pytest.raises(BackendError):
        call(holder, how, keys, wait=0.5, lease=1.5)
    ghost = rival.get(keys[-1])
    assert ghost is not None
    taken = [rival.acquire(key, wait=10) for key in keys]  # once the ghost's expiry passes
    healed_at = time.time()
    proxy.clear_faults()

    def undone() -> bool:
        after = [r for r in proxy.log if r.received >= healed_at and r.upstream is not None]
        marked = any(is_mark(r.body, ghost.owner) and r.upstream == 200 for r in after)
        # Refused by DynamoDB: the key is no longer the ghost's (400, its condition failed).
        refused = any(is_release_of(r.body, ghost.owner) and r.upstream == 400 for r in after)
        return marked and refused

    wait_for(undone, FREED_WITHIN, "the background undo's mark and release")
    for lease in taken:
        assert lease.is_held
        info = rival.get(lease.key)
        assert info is not None and info.owner == lease.owner and info.token == lease.token
        lease.release()  # raises LockLost if anything had freed it
