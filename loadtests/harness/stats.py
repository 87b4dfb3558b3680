"""Statistics the benchmarks share: percentiles, latency summaries, Zipf popularity, answers within
a tolerance."""

from __future__ import annotations

import statistics
from typing import Any


def percentile(samples: list[float], q: float) -> float:
    """The sample at the q-th percentile (nearest rank, no interpolation)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def zipf_weights(n: int, s: float) -> list[float]:
    """Popularity of ranks 1..n under Zipf's law with exponent s, summing to 1."""
    weights = [1 / (rank**s) for rank in range(1, n + 1)]
    total = sum(weights)
    return [w / total for w in weights]


def summarize_latencies(samples: list[float]) -> dict[str, float]:
    """Count, p50, p99 and mean in ms of latencies given in seconds."""
    return {
        "requests": len(samples),
        "p50_ms": percentile(samples, 50) * 1e3,
        "p99_ms": percentile(samples, 99) * 1e3,
        "mean_ms": statistics.fmean(samples) * 1e3,
    }


def answers_match(got: Any, want: Any, atol: float = 1e-4) -> bool:
    """Nested JSON equal, numbers within `atol` (frameworks differ in the last float32 bits)."""
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(answers_match(got[k], want[k]) for k in want)
        )
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(answers_match(g, w) for g, w in zip(got, want))
        )
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        return isinstance(got, (int, float)) and abs(got - want) <= atol
    return got == want
