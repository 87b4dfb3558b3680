"""One interval's datapoints from two successive readings of the merged metric families.

Counters and histograms become what they gained since the last reading that had them (a counter that
went down, such as a restarted gateway's, counts from its new value); gauges are read as they are,
when a reading has them. Each served endpoint's numbers go to its public (EndpointName,
VariantName), per container as well for an endpoint of several containers. The first reading only
sets the baseline: a control plane that restarts does not count everything again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from serving.cloudwatch.catalogue import CACHE_MISS_FAMILY, METRICS, Source
from serving.cloudwatch.statistics import Stat, merged

__all__ = ["Dimensions", "Key", "Sampler", "Served"]

Dimensions = tuple[tuple[str, str], ...]  # sorted by name
Key = tuple[str, str, Dimensions]  # namespace, metric, dimensions
Series = tuple[str, str, str]  # family, served endpoint, container ("" when the request named none)
MICROSECONDS = 1e6
_FAMILIES = {source.family for source in METRICS.values()} | {CACHE_MISS_FAMILY}


@dataclass(frozen=True)
class Served:
    """A served endpoint as CloudWatch names it: its endpoint and variant, how it runs, its
    replicas."""

    endpoint: str
    variant: str
    serial: bool = False
    replicas: Mapping[str, int] = field(default_factory=dict)  # container -> replicas serving


@dataclass
class _Reading:
    counters: dict[Series, float] = field(default_factory=lambda: defaultdict(float))
    histograms: dict[Series, tuple[float, float, dict[float, float]]] = field(default_factory=dict)
    gauges: dict[Series, list[float]] = field(default_factory=lambda: defaultdict(list))


def _read(families: Iterable[Metric]) -> _Reading:
    reading = _Reading()
    for family in families:
        if family.name not in _FAMILIES:
            continue
        for sample in family.samples:
            labels = sample.labels
            series = (family.name, labels.get("endpoint", ""), labels.get("container", ""))
            if family.type == "counter" and sample.name.endswith("_total"):
                reading.counters[series] += sample.value
            elif family.type == "gauge":
                reading.gauges[series].append(sample.value)
            elif family.type == "histogram":
                count, total, buckets = reading.histograms.get(series, (0.0, 0.0, {}))
                if sample.name.endswith("_count"):
                    count += sample.value
                elif sample.name.endswith("_sum"):
                    total += sample.value
                elif sample.name.endswith("_bucket"):
                    bound = float(labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + sample.value
                reading.histograms[series] = (count, total, buckets)
    return reading


def _gain(now: float, before: float | None) -> float:
    return now if before is None or now < before else now - before


def _latency(now: tuple[float, float, dict[float, float]], before: tuple | None) -> Stat | None:
    """A histogram's gain as a statistic set in microseconds (bounds of the lowest and highest
    bucket hit)."""
    count, total, cumulative = now
    old_count, old_total, old_cumulative = (
        before if before is not None and before[0] <= count else (0.0, 0.0, {})
    )
    gained = count - old_count
    if gained <= 0:
        return None
    buckets, below, lower, low, high = [], 0.0, 0.0, None, 0.0
    for bound in sorted(cumulative):
        up_to = cumulative[bound] - old_cumulative.get(bound, 0.0)
        in_bucket = max(up_to - below, 0.0)
        if in_bucket:
            buckets.append((bound * MICROSECONDS, in_bucket))
            low = lower if low is None else low
            high = bound if bound != float("inf") else max(lower, (total - old_total) / gained)
        below, lower = max(up_to, below), bound
    span = (total - old_total) * MICROSECONDS
    return Stat(gained, span, (low or 0.0) * MICROSECONDS, high * MICROSECONDS, tuple(buckets))


class Sampler:
    """Turns successive readings into the datapoints of the intervals between them."""

    def __init__(self) -> None:
        self._last: _Reading | None = None

    def interval(
        self, families: Iterable[Metric], layout: Callable[[str], Served | None]
    ) -> dict[Key, Stat]:
        """The datapoints since the last call; `layout(served endpoint)` names it (None: not an
        endpoint)."""
        reading, before = _read(families), self._last
        if before is None:
            self._last = reading
            return {}
        # A series this reading lacks (its node's metrics not read this time) keeps its baseline, so
        # that its gain is counted, once, in the next reading that has it.
        self._last = _Reading(
            counters=defaultdict(float, {**before.counters, **reading.counters}),
            histograms={**before.histograms, **reading.histograms},
        )
        gains = {
            series: _gain(value, before.counters.get(series))
            for series, value in reading.counters.items()
        }
        latencies = {
            series: stat
            for series, value in reading.histograms.items()
            if (stat := _latency(value, before.histograms.get(series))) is not None
        }
        served = {series[1] for series in [*gains, *latencies, *reading.gauges]}
        points: dict[Key, list[Stat]] = defaultdict(list)
        for name in served:
            where = layout(name)
            if where is not None:
                for key, stat in _endpoint(name, where, gains, latencies, reading.gauges):
                    points[key].append(stat)
        return {key: stat for key, stats in points.items() if (stat := merged(stats)) is not None}


def _endpoint(
    name: str,
    where: Served,
    gains: Mapping[Series, float],
    latencies: Mapping[Series, Stat],
    gauges: Mapping[Series, list[float]],
) -> Iterable[tuple[Key, Stat]]:
    """Every datapoint of one served endpoint: per container (several only) and for the whole
    variant."""
    containers = sorted(
        {series[2] for series in [*gains, *latencies, *gauges] if series[1] == name} - {""}
    )
    base: Dimensions = (("EndpointName", where.endpoint), ("VariantName", where.variant))
    per_container = len(set(containers) | set(where.replicas)) > 1
    for source in METRICS.values():
        stats = {
            c: _stat(source, name, c, where, gains, latencies, gauges) for c in [*containers, ""]
        }
        if per_container:
            for container in containers:
                if (stat := stats[container]) is not None:
                    for namespace in source.namespaces:
                        yield (
                            (
                                namespace,
                                source.metric,
                                tuple(sorted((*base, ("ContainerName", container)))),
                            ),
                            stat,
                        )
        whole = _whole(source, name, containers, where, gains, stats)
        if whole is not None:
            for namespace in source.namespaces:
                yield (namespace, source.metric, base), whole


def _stat(
    source: Source,
    name: str,
    container: str,
    where: Served,
    gains: Mapping[Series, float],
    latencies: Mapping[Series, Stat],
    gauges: Mapping[Series, list[float]],
) -> Stat | None:
    """One container's datapoint of `source` ("": the requests that named no container)."""
    calls = gains.get(("serving_invocations", name, container), 0.0)
    if source.kind == "invocations":
        return Stat(calls, calls, 1.0, 1.0) if calls else None
    if source.kind == "errors":
        failed = gains.get((source.family, name, container), 0.0)
        return (
            Stat(calls, failed, 0.0 if failed < calls else 1.0, 1.0 if failed else 0.0)
            if calls
            else None
        )
    if source.kind == "per_instance":
        share = calls / max(where.replicas.get(container, 1), 1)
        return Stat(1.0, share, share, share) if calls else None
    if source.kind == "latency":
        return latencies.get((source.family, name, container))
    if source.kind == "cache_hits":
        hits = gains.get((source.family, name, container), 0.0)
        looked = hits + gains.get((CACHE_MISS_FAMILY, name, container), 0.0)
        return (
            Stat(looked, hits, 0.0 if hits < looked else 1.0, 1.0 if hits else 0.0)
            if looked
            else None
        )
    values = gauges.get((source.family, name, container))
    return Stat(len(values), sum(values), min(values), max(values)) if values else None


def _whole(
    source: Source,
    name: str,
    containers: list[str],
    where: Served,
    gains: Mapping[Series, float],
    stats: Mapping[str, Stat | None],
) -> Stat | None:
    """The variant's datapoint: its requests (a Serial chain's once, not once per container) and
    their errors."""
    calls = [gains.get(("serving_invocations", name, c), 0.0) for c in containers]
    requests = (max(calls, default=0.0) if where.serial else sum(calls)) + gains.get(
        ("serving_invocations", name, ""), 0.0
    )
    if source.kind == "invocations":
        return Stat(requests, requests, 1.0, 1.0) if requests else None
    if source.kind == "errors":
        failed = sum(gains.get((source.family, name, c), 0.0) for c in [*containers, ""])
        return (
            Stat(requests, failed, 0.0 if failed < requests else 1.0, 1.0 if failed else 0.0)
            if requests
            else None
        )
    if source.kind == "per_instance":
        share = requests / max(max(where.replicas.values(), default=1), 1)
        return Stat(1.0, share, share, share) if requests else None
    return merged([stat for stat in stats.values() if stat is not None])
