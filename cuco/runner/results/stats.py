"""Summaries of per-iteration, per-rank times: the slowest rank counts."""

from __future__ import annotations

import statistics
from typing import Any


def slowest_rank(per_rank_ms: list[list[float]]) -> list[float]:
    """Per iteration, the time of the slowest rank."""
    n = min(len(r) for r in per_rank_ms)
    return [max(r[i] for r in per_rank_ms) for i in range(n)]


def summarize(per_rank_ms: list[list[float]]) -> dict[str, Any]:
    times = sorted(slowest_rank(per_rank_ms))
    if not times:
        return {"median_ms": None, "iters": 0}
    n = len(times)
    q = lambda f: times[min(n - 1, int(round(f * (n - 1))))]  # noqa: E731
    med = statistics.median(times)
    return {
        "median_ms": med,
        "p10_ms": q(0.1),
        "p90_ms": q(0.9),
        "min_ms": times[0],
        "max_ms": times[-1],
        "spread_pct": 100.0 * (q(0.9) - q(0.1)) / med if med > 0 else 0.0,
        "iters": n,
        "per_rank_median_ms": [statistics.median(r) if r else None for r in per_rank_ms],
    }
