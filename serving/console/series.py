"""The console's charts as data: a variant's or a container's CloudWatch series over the last hour,
one value a minute, on one time axis shared by every chart of an endpoint (what uPlot draws).

Read straight from the control plane's `MetricStore` (the datapoints CloudWatch's API answers
from), so a page of 15 containers is one call, not one GetMetricData per chart. Rates are per
second of the part of each minute the store has recorded: the minute under way shows its calls so
far, not a dip.
"""

from __future__ import annotations

from collections.abc import Callable

from serving.cloudwatch.datapoints import RESOLUTION_S, MetricStore
from serving.cloudwatch.sampler import Dimensions
from serving.cloudwatch.statistics import Stat
from serving.protocol import SAGEMAKER_NAMESPACE

__all__ = ["CHARTS", "PERIOD_S", "WINDOW_S", "Series", "axis", "series"]

PERIOD_S = 60
WINDOW_S = 3600
Series = dict[str, list[float | None]]
MICROSECONDS_PER_MS = 1000.0

# chart line -> (CloudWatch metric, statistic, how a period's value is shown: "rate" per second,
# "ms" from microseconds)
CHARTS: dict[str, tuple[str, str, str]] = {
    "InvocationsPerSecond": ("Invocations", "Sum", "rate"),
    "ModelLatencyP50Ms": ("ModelLatency", "p50", "ms"),
    "ModelLatencyP99Ms": ("ModelLatency", "p99", "ms"),
    "Invocation4XXPerSecond": ("Invocation4XXErrors", "Sum", "rate"),
    "Invocation5XXPerSecond": ("Invocation5XXErrors", "Sum", "rate"),
    "CacheHitsPerSecond": ("ModelCacheHit", "Sum", "rate"),
    "ModelLoadsPerSecond": ("ModelLoadingTime", "SampleCount", "rate"),
}


def axis(latest: float) -> list[float]:
    """The start of every minute of the last hour up to the one `latest` (the store's last recorded
    instant) falls in."""
    last = latest - latest % PERIOD_S if latest > 0 else 0.0
    return [last - PERIOD_S * back for back in range(WINDOW_S // PERIOD_S - 1, -1, -1)]


def series(
    store: MetricStore, dimensions: Dimensions, times: list[float], fallback: Dimensions = ()
) -> Series:
    """Every CHARTS line for the series with `dimensions` (`fallback`'s where it has none: a
    container of a one-container endpoint is recorded as its variant), None where a minute has no
    datapoint."""
    if not times:
        return {line: [] for line in CHARTS}
    start, end, latest = times[0], times[-1] + PERIOD_S, store.latest
    found: dict[str, dict[float, Stat]] = {}
    for metric in {metric for metric, _, _ in CHARTS.values()}:
        points = _periods(store, metric, dimensions, start, end)
        if not points and fallback:
            points = _periods(store, metric, fallback, start, end)
        found[metric] = dict(points)
    shown: Series = {}
    for line, (metric, statistic, unit) in CHARTS.items():
        convert = _converter(unit, latest)
        shown[line] = [
            convert(at, value)
            if (stat := found[metric].get(at)) is not None
            and (value := stat.value(statistic)) is not None
            else None
            for at in times
        ]
    return shown


def _periods(
    store: MetricStore, metric: str, dimensions: Dimensions, start: float, end: float
) -> list[tuple[float, Stat]]:
    key = (SAGEMAKER_NAMESPACE, metric, tuple(sorted(dimensions)))
    return store.periods(key, start, end, PERIOD_S)


def _converter(unit: str, latest: float) -> Callable[[float, float], float]:
    if unit == "ms":
        return lambda at, value: round(value / MICROSECONDS_PER_MS, 3)

    def rate(at: float, value: float) -> float:
        covered = min(max(latest - at, RESOLUTION_S), PERIOD_S)
        return round(value / covered, 4)

    return rate
