"""The statistics the benchmarks report: medians, percentiles, ratios, fairness."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing or ``b`` is 0."""
    return a / b if a is not None and b else None


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything."""
    return (sum(values) ** 2 / (len(values) * sum(v * v for v in values))) if values and any(values) else None


def latency_summary(latencies: Sequence[float]) -> dict[str, float | None]:
    """p50, p95, mean, min and max of a list of latencies in ms (None when empty)."""
    return {
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "mean_ms": statistics.fmean(latencies) if latencies else None,
        "min_ms": min(latencies) if latencies else None,
        "max_ms": max(latencies) if latencies else None,
    }


__all__ = ["jain", "latency_summary", "median", "percentile", "ratio"]
