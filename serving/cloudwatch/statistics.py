"""A datapoint's statistic set (SampleCount, Sum, Minimum, Maximum) and, for latencies, its
histogram.

Latencies come from Prometheus histograms, so their Minimum and Maximum are the bounds of the lowest
and highest bucket that holds a request, and a percentile is interpolated within its bucket, as
Prometheus's `histogram_quantile` does: exact to within a bucket (docs/cloudwatch.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PERCENTILE", "STATISTICS", "Stat", "merged"]

STATISTICS = ("SampleCount", "Average", "Sum", "Minimum", "Maximum")
PERCENTILE = re.compile(r"^p(\d{1,2}(?:\.\d{1,2})?|100)$")


@dataclass(frozen=True, slots=True)
class Stat:
    """What one series saw in one interval (or period)."""

    count: float
    total: float
    low: float
    high: float
    # (upper bound, observations in the bucket), latencies only
    buckets: tuple[tuple[float, float], ...] = ()

    def merge(self, other: Stat) -> Stat:
        counts: dict[float, float] = dict(self.buckets)
        for bound, observed in other.buckets:
            counts[bound] = counts.get(bound, 0.0) + observed
        return Stat(
            self.count + other.count,
            self.total + other.total,
            min(self.low, other.low),
            max(self.high, other.high),
            tuple(sorted(counts.items())),
        )

    def value(self, statistic: str) -> float | None:
        """One statistic (`Sum`, `p99`, ...); None for a percentile of a metric without a
        histogram."""
        if statistic == "SampleCount":
            return self.count
        if statistic == "Sum":
            return self.total
        if statistic == "Average":
            return self.total / self.count if self.count else 0.0
        if statistic == "Minimum":
            return self.low
        if statistic == "Maximum":
            return self.high
        match = PERCENTILE.match(statistic)
        if match is None or not self.buckets:
            return None
        return self.percentile(float(match.group(1)))

    def percentile(self, percent: float) -> float:
        """Interpolated within the bucket that holds the rank, clamped to Minimum and Maximum."""
        observed = sum(count for _, count in self.buckets)
        rank, below, lower = observed * percent / 100.0, 0.0, 0.0
        for bound, count in self.buckets:
            if count and below + count >= rank:
                upper = bound if bound != float("inf") else self.high
                point = lower + (upper - lower) * (rank - below) / count
                return min(max(point, self.low), self.high)
            below, lower = below + count, bound
        return self.high


def merged(stats: list[Stat]) -> Stat | None:
    """The statistic set of several (None for none)."""
    if not stats:
        return None
    result = stats[0]
    for stat in stats[1:]:
        result = result.merge(stat)
    return result
