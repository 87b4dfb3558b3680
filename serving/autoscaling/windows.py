"""Each replica's autoscaling samples over the look-back window, averaged: what Serve's controller
hands a policy as `aggregated_metrics`, for replicas it does not run (container hosts' replicas,
sampled by the registry). Pure: the clock is the caller's."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from typing import Any


def tracked(sample: Mapping[str, Any], names: Collection[str]) -> dict[str, float]:
    """The finite numbers of a replica's sample that its policies track, nothing else: a sample
    carries the model's own `autoscaling_metrics`, which tenant code chooses (any names, any
    values, as many as it likes), and it travels to the registry, which every container shares."""
    return {
        name: float(value)
        for name, value in sample.items()
        if name in names
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


class MetricWindows:
    """Samples per replica, kept for `look_back_s`; each metric's mean per replica."""

    def __init__(self, look_back_s: float) -> None:
        self.look_back_s = look_back_s
        self._samples: dict[str, deque[tuple[float, Mapping[str, float]]]] = {}

    def add(self, replica: str, sample: Mapping[str, float], now: float) -> None:
        window = self._samples.setdefault(replica, deque())
        window.append((now, dict(sample)))
        while window and window[0][0] < now - self.look_back_s:
            window.popleft()

    def averages(self, replicas: Iterable[str], now: float) -> dict[str, dict[str, float]]:
        """metric -> replica -> its mean over the window (replicas with no sample in it left out)."""
        sums: dict[str, dict[str, list[float]]] = {}
        for replica in replicas:
            for then, sample in self._samples.get(replica, ()):
                if then < now - self.look_back_s:
                    continue
                for name, value in sample.items():
                    sums.setdefault(name, {}).setdefault(replica, []).append(float(value))
        return {
            name: {replica: sum(values) / len(values) for replica, values in by_replica.items()}
            for name, by_replica in sums.items()
        }

    def keep(self, replicas: Iterable[str]) -> None:
        """Forget every replica but these (stopped, replaced)."""
        wanted = set(replicas)
        for replica in [r for r in self._samples if r not in wanted]:
            del self._samples[replica]
