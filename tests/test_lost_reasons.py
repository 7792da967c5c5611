"""A lease lost by expiry says whose slowness lost it: an unanswered renewal points at
DynamoDB, a late heartbeat thread at this process (paused, or starved of CPU or of the
GIL). A 1 s runlocked lease on a loaded CI machine was lost with the same message for
either, and nothing told which (the renewal-in-flight case is in test_exclusion.py)."""

from __future__ import annotations

import sys
import time

import pytest

from django_dynlock.engine.clock import monotonic


@pytest.fixture
def gil_held_for_seconds():
    """Make a pure-Python loop in this thread keep the GIL for up to that many seconds."""
    interval = sys.getswitchinterval()
    yield sys.setswitchinterval
    sys.setswitchinterval(interval)


def test_a_heartbeat_thread_starved_of_the_gil_is_named_as_the_cause(mock_dynlock, gil_held_for_seconds):
    lease = mock_dynlock.acquire("starved", lease=1.0)
    gil_held_for_seconds(5.0)
    end = monotonic() + 2.0
    while monotonic() < end:  # holds the GIL: the heartbeat thread cannot renew
        pass
    gil_held_for_seconds(0.005)
    deadline = time.monotonic() + 2.0
    while lease.upkeep.lost is None and time.monotonic() < deadline:
        time.sleep(0.01)
    lost = str(lease.upkeep.lost)
    assert lease.lost_reason == "expired", lost
    assert "the heartbeat thread ran " in lost and "(this process was paused or starved of CPU)" in lost, lost
    assert "the last renewal took " not in lost  # none was sent: the first was due during the loop
