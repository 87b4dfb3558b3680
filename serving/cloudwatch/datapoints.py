"""Datapoints at RESOLUTION_S, kept RETENTION_S, by (namespace, metric, dimensions), in the control
plane's memory: a restarted control plane starts with none (docs/cloudwatch.md). Periods are
multiples of the resolution that CloudWatch accepts: 10, 30, or a multiple of 60 seconds.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from serving.cloudwatch.sampler import Dimensions, Key
from serving.cloudwatch.statistics import Stat, merged

__all__ = ["PERIODS_HELP", "RESOLUTION_S", "RETENTION_S", "MetricStore", "valid_period"]

RESOLUTION_S = 10
RETENTION_S = 3 * 3600
PERIODS_HELP = f"10, 30 or a multiple of 60 seconds, at most {RETENTION_S} (the {RETENTION_S // 3600} hours kept)"


def valid_period(period: int) -> bool:
    return period in (10, 30) or (period % 60 == 0 and 0 < period <= RETENTION_S)


class MetricStore:
    """Each series' datapoints, oldest first, each stamped with the start of its interval."""

    def __init__(self) -> None:
        self._series: dict[Key, deque[tuple[float, Stat]]] = {}
        self._lock = threading.Lock()
        self.latest = 0.0  # the end of the last interval recorded

    def record(self, start: float, points: dict[Key, Stat], end: float) -> None:
        """The datapoints of the interval [start, end)."""
        with self._lock:
            for key, stat in points.items():
                self._series.setdefault(key, deque(maxlen=RETENTION_S // RESOLUTION_S)).append(
                    (start, stat)
                )
            self.latest = end
            for key in [
                key
                for key, points in self._series.items()
                if points and points[-1][0] < end - RETENTION_S
            ]:
                del self._series[key]

    def periods(self, key: Key, start: float, end: float, period: int) -> list[tuple[float, Stat]]:
        """The datapoints in [start, end) merged per period, periods aligned to multiples of
        `period`."""
        with self._lock:
            points = list(self._series.get(key, ()))
        grouped: dict[float, list[Stat]] = {}
        for at, stat in points:
            if start <= at < end:
                grouped.setdefault(at - at % period, []).append(stat)
        return [
            (at, total)
            for at, stats in sorted(grouped.items())
            if (total := merged(stats)) is not None
        ]

    def window(self, key: Key, end: float, period: int, count: int) -> list[Stat | None]:
        """The last `count` periods of `period` seconds that end at `end`, oldest first (None: no
        data)."""
        with self._lock:
            points = [
                (at, stat)
                for at, stat in self._series.get(key, ())
                if end - period * count <= at < end
            ]
        windows: list[list[Stat]] = [[] for _ in range(count)]
        for at, stat in points:
            windows[int((at - (end - period * count)) // period)].append(stat)
        return [merged(stats) for stats in windows]

    def keys(self, since: float = 0.0) -> Iterable[tuple[str, str, Dimensions]]:
        """Every series with a datapoint at or after `since`."""
        with self._lock:
            return [
                key for key, points in self._series.items() if points and points[-1][0] >= since
            ]
