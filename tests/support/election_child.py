"""Contenders of the election tests, run as child processes (spawned, not forked).

Each builds its own LockClient from plain options, as another host would, and appends
one line per event to a report shared by all (short lines in append mode: whole).
Times are ``django_dynlock.engine.clock.monotonic()``, one clock for every process of
the machine. Every loop is bounded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from typing import Any

from django_dynlock import LockNotAcquired
from django_dynlock.engine.clock import monotonic
from tests.support.clients import client_for


def report(path: str, **line: Any) -> None:
    with open(path, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), **line}) + "\n")


def contend(endpoint: str, table: str, name: str, lease: float, poll: float, path: str, doom: float) -> None:
    """Campaign, lead a while, then resign (and campaign again), or with probability
    ``doom`` say DOOMED and lead on until the test SIGKILLs us. Ends after 120 s."""
    client = client_for(endpoint, table, lease_duration=lease, heartbeat_period=lease / 4)
    election = client.election(name, poll=poll)
    rng = random.Random(os.getpid())
    report(path, event="STARTED")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        term = election.campaign(wait=deadline - time.monotonic())
        report(path, event="ELECTED", token=term.token, at=monotonic())
        if rng.random() < doom:
            report(path, event="DOOMED", token=term.token)
            while term.is_held and time.monotonic() < deadline:
                time.sleep(0.01)
            report(path, event="END", token=term.token, at=term.valid_until, how="lost")
            continue
        time.sleep(rng.uniform(0.1, 0.6))
        ended = monotonic()
        if not term.is_held:
            ended = term.valid_until  # should not happen; the interval ends where it stopped
        report(path, event="END", token=term.token, at=ended, how="resign" if term.is_held else "lost")
        term.release()
    os._exit(0)


FAULTY_CONFIG = {"read_timeout": 0.25, "connect_timeout": 0.5}


def contend_through_faults(
    endpoint: str, table: str, name: str, lease: float, poll: float, path: str, doom: float, cut: float
) -> None:
    """:func:`contend` through a fault proxy (``endpoint``), whose leader may lose its term.

    While it leads it looks at ``term.is_held`` every few milliseconds, and its interval
    ends the moment it sees False (its belief, as ``election.run``'s function would hold
    it), or the loss callback comes, whichever is first. With probability ``doom`` it
    says DOOMED and leads on until SIGKILLed or its term is lost; with probability
    ``cut`` it says CUT and leads on until its term is lost (the test cuts its link),
    else it resigns after a short while. The read timeout is shorter than the proxy's
    delays: a delayed request is sent again while the first is on its way (a
    duplicate), a dropped or held reply is retried after its write was applied.
    """
    client = client_for(endpoint, table, lease_duration=lease, heartbeat_period=lease / 4, client_config=FAULTY_CONFIG)
    election = client.election(name, poll=poll)
    lost_at: dict[int, float] = {}
    election.on_lost(lambda term, reason: lost_at.setdefault(term.token, monotonic()))
    rng = random.Random(os.getpid())
    report(path, event="STARTED")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            term = election.campaign(wait=deadline - time.monotonic())
        except LockNotAcquired:
            break
        report(path, event="ELECTED", token=term.token, at=monotonic())
        fate = rng.random()
        if fate < doom:
            report(path, event="DOOMED", token=term.token)
            hold = deadline - time.monotonic()
        elif fate < doom + cut:
            report(path, event="CUT", token=term.token)
            hold = deadline - time.monotonic()
        else:
            hold = rng.uniform(0.1, 0.6)
        until = time.monotonic() + hold
        while term.is_held and term.token not in lost_at and time.monotonic() < until:
            time.sleep(0.005)
        seen = monotonic()
        if term.is_held and term.token not in lost_at:
            report(path, event="END", token=term.token, at=seen, how="resign")
            term.release()
        else:
            ended = min(seen, lost_at.get(term.token, seen))
            report(path, event="END", token=term.token, at=ended, how="lost", reason=term.lost_reason)
            election.resign()  # a term lost locally may still be named in the table
    os._exit(0)


def lead_then_pause(endpoint: str, table: str, name: str, lease: float, path: str) -> None:
    """Lead, and after a SIGSTOP and SIGCONT, say what the term showed on waking, when
    the loss callback came, and whether our fenced writes were refused."""
    client = client_for(endpoint, table, lease_duration=lease, heartbeat_period=lease / 4)
    election = client.election(name, poll=0.5)
    lost: list[tuple[float, str]] = []
    election.on_lost(lambda term, reason: lost.append((monotonic(), reason)))
    woke: list[tuple[float, bool, int]] = []
    term = election.campaign(wait=30)

    def on_continue(signum: int, frame: Any) -> None:
        # The first thing this process does on waking: look at its term.
        woke.append((monotonic(), term.is_held, len(lost)))

    signal.signal(signal.SIGCONT, on_continue)
    report(path, event="ELECTED", token=term.token, at=monotonic())
    deadline = time.monotonic() + 60
    while not woke and time.monotonic() < deadline:
        time.sleep(0.01)
    wait_until = time.monotonic() + 5
    while not lost and time.monotonic() < wait_until:
        time.sleep(0.001)
    fenced = fenced_put(client, table, term.token)
    checked = condition_checked_put(client, table, term)
    report(
        path,
        event="WOKE",
        woke_at=woke[0][0] if woke else None,
        held_on_waking=woke[0][1] if woke else None,
        lost_before_waking=woke[0][2] if woke else None,
        lost_at=lost[0][0] if lost else None,
        lost_reason=lost[0][1] if lost else None,
        held_now=term.is_held,
        fenced_put=fenced,
        condition_checked_put=checked,
    )
    os._exit(0)


def fenced_put(client: Any, table: str, token: int) -> bool:
    """Write the data item only if no higher token has written it: fencing where the data lives."""
    try:
        client.boto.update_item(
            TableName=table,
            Key={client.options.key_attribute: {"S": "data:fenced"}},
            UpdateExpression="SET fence = :t, writer = :w",
            ConditionExpression="attribute_not_exists(fence) OR fence <= :t",
            ExpressionAttributeValues={":t": {"N": str(token)}, ":w": {"S": str(os.getpid())}},
        )
    except client.boto.exceptions.ConditionalCheckFailedException:
        return False
    return True


def condition_checked_put(client: Any, table: str, term: Any) -> bool:
    """Write the data item in one transaction with the term's condition check."""
    try:
        client.boto.transact_write_items(
            TransactItems=[
                term.condition_check(),
                {
                    "Put": {
                        "TableName": table,
                        "Item": {
                            client.options.key_attribute: {"S": "data:checked"},
                            "writer": {"S": str(os.getpid())},
                        },
                    }
                },
            ]
        )
    except client.boto.exceptions.TransactionCanceledException:
        return False
    return True


if __name__ == "__main__":
    role, endpoint, table, name, *rest = sys.argv[1:]
    if role == "contend":
        contend(endpoint, table, name, float(rest[0]), float(rest[1]), rest[2], float(rest[3]))
    elif role == "faulty":
        contend_through_faults(
            endpoint, table, name, float(rest[0]), float(rest[1]), rest[2], float(rest[3]), float(rest[4])
        )
    elif role == "pause":
        lead_then_pause(endpoint, table, name, float(rest[0]), rest[1])
    else:
        raise SystemExit(f"unknown role {role!r}")
