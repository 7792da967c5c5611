"""What a client forgets never stops a takeover (issue 36, N4).

Without a ``Date`` header nobody stores an expiry, so a dead holder's key is taken over
only by a waiter that watched its record version unchanged for a whole lease, and a
client remembers its watches between calls for at most ``WATCHES_KEPT`` keys. Tried
round-robin, more keys than that evicted each watch before the key came round again:
0 of 1,100 dead keys were ever taken (all 1,000 at 1,000 keys).

One process acquires 1,100 keys through a fault proxy that strips ``Date`` and dies
without releasing them; another tries them round-robin with ``try_acquire``, through the
same proxy or (with ``Date``, which does not help: the items hold no expiry) directly.
No key may be taken before its lease ran out, and no try_acquire sent more than
lease + 3 s after the watch could begin (the later of the dead holder's last write and the
taker's first look at the key) may find it busy: whatever the pace of the rounds (0.2-4.7 s
each on the shared machine, up to 10.9 s at load 9), a client without an expiry in the item
cannot learn of a death before it looks. The taker's memory stays bounded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from django_dynlock.engine import waiting
from django_dynlock.engine.clock import ServerClock
from django_dynlock.engine.options import ClientOptions
from django_dynlock.engine.waiting import WATCHES_KEPT, WaitPolicy
from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import REPO_ROOT
from tests.reliability.harness import create_table
from tests.support.tables import delete_table

KEYS = WATCHES_KEPT + 76  # 1,100
LEASE = 2.0
MARGIN = 0.1 * LEASE
BOUND = LEASE + 3.0  # the promise: taken within lease + 3 s of the last successful write


def child(*args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.support.many_keys_child", *map(str, args)], cwd=REPO_ROOT)


def words(report: Path) -> list[list[str]]:
    return [line.split() for line in report.read_text().splitlines() if line.strip()]


def finish(process: subprocess.Popen, seconds: float) -> None:
    try:
        process.wait(seconds)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize("taker_dates", [False, True], ids=["dateless-taker", "taker-with-date"])
def test_a_client_trying_more_keys_than_it_remembers_takes_over_every_dead_holder(
    dynamodb_local_server, tmp_path, taker_dates
):
    endpoint = dynamodb_local_server.endpoint_url
    table = create_table(endpoint)
    held, took = tmp_path / "holder.txt", tmp_path / "taker.txt"
    try:
        with FaultProxy(endpoint, max_seconds=120, max_requests=200_000) as link:
            link.set_dates(strip=True)
            held.touch()
            taker_endpoint = endpoint if taker_dates else link.endpoint_url
            taker = child("take", taker_endpoint, table, KEYS, LEASE, took, BOUND + 15, held)
            try:
                finish(child("hold", link.endpoint_url, table, KEYS, LEASE, held), 60)
                assert ["DONE"] in words(held), "the holder did not acquire its keys"
            finally:
                finish(taker, BOUND + 45)
    finally:
        delete_table(endpoint, table)

    written: dict[str, float] = {}
    for line in words(held):
        if line[0] == "WROTE":
            written[line[1]] = max(written.get(line[1], 0.0), float(line[2]))
    taken = {line[1]: (float(line[2]), float(line[3])) for line in words(took) if line[0] == "TAKEN"}
    first = {line[1]: float(line[2]) for line in words(took) if line[0] == "FIRST"}
    refused = [(line[1], float(line[2])) for line in words(took) if line[0] == "BUSY"]
    rounds = [float(line[1]) for line in words(took) if line[0] == "ROUND"]
    remembered = [int(line[1]) for line in words(took) if line[0] == "REMEMBERED"]
    assert len(written) == KEYS
    assert len(taken) == KEYS, f"{KEYS - len(taken)} of {KEYS} dead holders' keys never taken over (rounds {rounds} s)"
    early = {
        k: round(before - written[k], 2) for k, (before, _) in taken.items() if before < written[k] + LEASE - MARGIN
    }
    assert not early, f"taken before the holder's lease ran out: {sorted(early.items())[:5]}"
    # Measured from when the watch could begin: the later of the holder's last write and the
    # taker's first look at the key. Without an expiry in the item nobody learns of a death
    # before looking, and at load 9 a round of 1,100 keys took 5.7-10.9 s, so calls 5.0-5.8 s
    # after a key's last write were refused while its first look was still under a lease old.
    late = sorted(
        round(sent - max(written[k], first[k]), 2) for k, sent in refused if sent - max(written[k], first[k]) > BOUND
    )
    assert not late, (
        f"{len(late)} calls refused {late[:3]}...{late[-3:]} s after the watch could begin (rounds {rounds} s)"
    )
    delays = sorted(after - written[k] for k, (_, after) in taken.items())
    watched = sorted(after - max(written[k], first[k]) for k, (_, after) in taken.items())
    assert remembered and remembered[0] <= WATCHES_KEPT
    print(
        f"\n{KEYS} keys taken over {delays[0]:.2f}-{delays[-1]:.2f} s after their last write,"
        f" {watched[0]:.2f}-{watched[-1]:.2f} s after the watch could begin (lease {LEASE} s), rounds of {rounds} s"
    )


def held(rvn: str, **more: dict[str, str]) -> dict[str, dict[str, str]]:
    return {"owner": {"S": "someone"}, "rvn": {"S": rvn}, "lease_ms": {"N": "2000"}, **more}


def test_memory_hands_back_the_watches_it_drops_and_drops_those_its_items_keep_first(monkeypatch):
    monkeypatch.setattr(waiting, "WATCHES_KEPT", 3)
    policy = WaitPolicy(ClientOptions(lease_duration=2.0), ServerClock())  # no Date seen: no expiry to go by
    seen = {f"k{i}": policy.observe(None, held(f"r{i}"), 10.0 + i, "me") for i in range(4)}
    assert all(watch is not None and watch.needed and not watch.noted for watch in seen.values())
    for key in ("k0", "k1", "k2"):
        assert policy.remember(key, seen[key]) == []
    assert policy.remember("k3", seen["k3"]) == [("k0", seen["k0"])]  # memory is full: k0 goes to its item
    assert policy.remembered("k0") is None

    # The next look at k0 brings its item, with the note: the watch goes on from 10.0.
    k0 = seen["k0"]
    assert k0 is not None
    note = {policy.note_attribute: {"S": policy.note(k0)}}
    back = policy.observe(None, held("r0", **note), 13.5, "me")
    assert back is not None and back.since == 10.0 and back.noted
    assert back.takeover_rvn(12.0) == "r0"
    # Another record version, or another client's note, is not this watch: it starts afresh.
    assert policy.observe(None, held("r9", **note), 13.5, "me").since == 13.5  # type: ignore[union-attr]
    other = {"watch_0123456789abcdef": {"S": policy.note(k0)}}
    assert policy.observe(None, held("r0", **other), 13.5, "me").since == 13.5  # type: ignore[union-attr]

    # Memory keeps k1-k3, which only it has: k1 goes to its item. After that, k0 (which its
    # item has) is dropped first, and nothing more is written.
    assert policy.remember("k0", back) == [("k1", seen["k1"])]
    k1 = policy.observe(None, held("r1", **{policy.note_attribute: {"S": policy.note(seen["k1"])}}), 14.0, "me")
    assert policy.remember("k1", k1) == []
    assert policy.remembered("k0") is None and policy.remembered("k2") is not None
