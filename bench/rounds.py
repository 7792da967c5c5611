"""Rounds and phases: how a measurement is repeated, interleaved and bounded in time.

- ``run_round``: N acquire+release cycles split over threads, timed (wall and CPU).
- ``rotated``: the order of the contenders in round i, rotated and reversed every other
  round, so that drift in the machine's load hits all alike.
- ``run_phase``: one measurement of a server's run, unless over the time budget; a
  failure is noted in the results, not raised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from bench.children import BenchError

T = TypeVar("T")


def run_round(make_cycle: Callable[[int], Callable[[], None]], threads: int, cycles: int, cap: float) -> dict[str, Any]:
    """``cycles`` acquire+release cycles split over ``threads`` threads; stops early at ``cap`` s.
    ``make_cycle(i)`` builds thread i's cycle (before the clock starts)."""
    per_thread = max(1, cycles // threads)
    done = [0] * threads
    errors: list[str] = []
    barrier = threading.Barrier(threads + 1, timeout=30)
    stop_at = [0.0]

    def worker(index: int) -> None:
        try:
            cycle = make_cycle(index)
            barrier.wait()
            for _ in range(per_thread):
                cycle()
                done[index] += 1
                if time.perf_counter() >= stop_at[0]:
                    break
        except Exception as exc:  # reported, the round is discarded
            errors.append(f"{type(exc).__name__}: {exc}")
            barrier.abort()

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for thread in workers:
        thread.start()
    stop_at[0] = time.perf_counter() + cap + 1.0
    barrier.wait()
    started = time.perf_counter()
    cpu_started = time.process_time()  # this whole process: all threads, heartbeat thread too
    stop_at[0] = started + cap
    for thread in workers:
        thread.join(cap + 30)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    if errors:
        raise BenchError(f"round failed: {errors[0]}")
    if any(thread.is_alive() for thread in workers):
        raise BenchError("round did not finish in time")
    total = sum(done)
    return {
        "cycles": total,
        "seconds": elapsed,
        "rate": total / elapsed,
        "cpu_us_per_cycle": cpu / total * 1e6 if total else None,
        "capped": total < per_thread * threads,
    }


def rotated(items: Sequence[T], index: int) -> list[T]:
    """The order of round ``index``: rotated by ``index``, reversed every other round."""
    if not items:
        return []
    shift = index % len(items)
    order = list(items[shift:]) + list(items[:shift])
    if index % 2:
        order.reverse()
    return order


def run_phase(
    result: dict[str, Any], kind: str, name: str, fn: Callable[[], Any], deadline: float, say: Callable[[str], None]
) -> Any:
    """Run one measurement unless over the time budget; a failure is noted, not raised."""
    if time.monotonic() >= deadline:
        result["skipped"].append(name)
        say(f"  {kind}: {name} skipped (over the time budget)")
        return None
    t0 = time.monotonic()
    try:
        value = fn()
    except Exception as exc:
        result["errors"][name] = f"{type(exc).__name__}: {exc}"
        say(f"  {kind}: {name} FAILED: {type(exc).__name__}: {exc}")
        return None
    say(f"  {kind}: {name} done in {time.monotonic() - t0:.1f}s")
    return value


__all__ = ["rotated", "run_phase", "run_round"]
