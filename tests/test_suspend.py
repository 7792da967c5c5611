"""A host suspended for longer than a lease must not trust that lease when it resumes
(issue 29). ``time.monotonic()`` stops while the host sleeps; on Linux the engine's clock
is ``CLOCK_BOOTTIME``, which counts the suspend. No test can suspend the host, so the
suspend is simulated where the kernel reports it: ``time.clock_gettime(CLOCK_BOOTTIME)``
runs a minute ahead, ``time.monotonic()`` does not move."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

import django_dynlock.engine
from django_dynlock import LockLost


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="no CLOCK_BOOTTIME on this platform")
def test_a_lease_is_not_trusted_after_a_suspend_longer_than_it(mock_dynlock, monkeypatch):
    lease = mock_dynlock.acquire("k", lease=5)
    assert lease.is_held
    suspended = [0.0]
    real = time.clock_gettime

    def clock_gettime(clock_id: int) -> float:
        return real(clock_id) + (suspended[0] if clock_id == time.CLOCK_BOOTTIME else 0.0)

    monkeypatch.setattr(time, "clock_gettime", clock_gettime)
    before = time.monotonic()
    suspended[0] = 60.0  # the host slept for a minute
    assert time.monotonic() - before < 5  # which time.monotonic() does not show
    assert not lease.is_held and lease.remaining() == 0.0
    with pytest.raises(LockLost) as lost:
        lease.release()
    assert lost.value.reason == "expired"


# Where a lease's times may be read: one clock for all, or a module that read
# time.monotonic() would compare its times with the lease's across a suspend. Not a
# lease's: clock.py (which defines monotonic()) and table.py (waits for a new table).
NOT_LEASE_TIMES = {"clock.py", "table.py"}


def test_the_engine_reads_lease_times_from_clock_monotonic_only():
    engine = Path(django_dynlock.engine.__file__).parent
    readers = []
    for module in sorted(engine.glob("*.py")):
        if module.name in NOT_LEASE_TIMES:
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "monotonic"
                and isinstance(node.value, ast.Name)
                and node.value.id == "time"
            ):
                readers.append(f"{module.name}:{node.lineno}")
    assert readers == [], f"time.monotonic() read beside clock.monotonic(): {readers}"
