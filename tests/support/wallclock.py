"""A process' wall clock set wrong on purpose, and the true wall time despite it."""

from __future__ import annotations

import time


def _wall_minus_monotonic(samples: int = 50) -> float:
    """This host's true wall clock as an offset to the monotonic one (which no shift
    touches), from the tightest of ``samples`` reads of the wall clock between two of the
    monotonic one. One unbracketed pair, as before, could be off by however long the
    process was preempted between its two reads (milliseconds on a loaded machine): two
    processes then disagreed by that much on when each other's holders began and ended,
    and the semaphore test counted 3 holders of 2 slots for 4.6 ms (CI-like run)."""
    best: tuple[float, float] | None = None
    for _ in range(samples):
        before = time.monotonic()
        wall = time.time()
        after = time.monotonic()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) / 2)
    assert best is not None
    return best[1]


TRUE_WALL_MINUS_MONOTONIC = _wall_minus_monotonic()


def true_wall(monotonic_time: float | None = None) -> float:
    """The true wall time of a monotonic instant (default: now), even after shift_wall_clock()."""
    return (time.monotonic() if monotonic_time is None else monotonic_time) + TRUE_WALL_MINUS_MONOTONIC


def shift_wall_clock(offset: float) -> None:
    """Make this whole process' wall clock (``time.time``/``time_ns``) run ``offset`` seconds off,
    as on a host whose clock is wrong; its monotonic clock and timed waits are untouched."""
    if offset:
        real_time, real_time_ns = time.time, time.time_ns
        time.time = lambda: real_time() + offset  # type: ignore[assignment]
        time.time_ns = lambda: real_time_ns() + int(offset * 1e9)  # type: ignore[assignment]
