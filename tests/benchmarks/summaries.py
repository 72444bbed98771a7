"""Summaries of measured samples, the same in every benchmark's results."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 1]."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spread(values: list[float], digits: int = 1) -> dict[str, float]:
    """p50 (the median) / p95 / max, rounded; empty input gives an empty summary."""
    if not values:
        return {}
    return {
        "p50": round(statistics.median(values), digits),
        "p95": round(percentile(values, 0.95), digits),
        "max": round(max(values), digits),
    }
