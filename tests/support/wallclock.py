"""A process' wall clock set wrong on purpose, and the true wall time despite it."""

from __future__ import annotations

import time

# This host's true wall clock, as an offset to the monotonic one (which no shift touches).
TRUE_WALL_MINUS_MONOTONIC = time.time() - time.monotonic()


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
