"""What each load-test scenario sends, and how much, as plain functions of elapsed time.

No Locust and no I/O here: the runner asks a `Scenario` which target the request sent at
`elapsed` seconds goes to and what the load level is then, so the traffic mix, the shift
schedule, the step shape and the Zipf popularity can be checked without sending anything.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import ClassVar

SCENARIOS = ("direct", "serial", "shift", "step", "zipf")
ENDPOINT_LABEL = "(endpoint)"  # per-target label of requests that name no container (Serial)


@dataclass(frozen=True)
class Target:
    """Where one request goes: a container hostname (None: the endpoint decides) and a MultiModel
    model."""

    container: str | None
    model: str | None = None

    @property
    def label(self) -> str:
        return self.container or ENDPOINT_LABEL


class Weighted:
    """Draws keys in proportion to their weights from one uniform number (so callers own the
    randomness)."""

    def __init__(self, weights: Mapping[str | None, float]) -> None:
        if not weights or any(w < 0 or not math.isfinite(w) for w in weights.values()):
            raise ValueError("weights must be non-negative numbers, at least one")
        total = sum(weights.values())
        if total <= 0:
            raise ValueError("at least one weight must be positive")
        self.keys = list(weights)
        self.probabilities = [w / total for w in weights.values()]
        self._cumulative = list(accumulate(self.probabilities))

    def pick(self, uniform: float) -> str | None:
        index = bisect.bisect_right(self._cumulative, uniform)
        # float rounding can leave the last sum below 1
        return self.keys[min(index, len(self.keys) - 1)]


def zipf_weights(n: int, s: float) -> list[float]:
    """P(rank k) ∝ 1 / k**s for k = 1..n, normalized: a few models get most of the traffic."""
    if n < 1:
        raise ValueError("the number of models must be at least 1")
    if s < 0:
        raise ValueError("the Zipf exponent must not be negative")
    raw = [1.0 / k**s for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def model_names(n: int, pattern: str, start: int = 0) -> list[str]:
    """The n TargetModel names, most popular first: `pattern` with `{i}` = start, start+1, ..."""
    if "{i}" not in pattern:
        raise ValueError("the model pattern must contain {i}, e.g. 'customer-{i}.tar.gz'")
    try:
        return [pattern.format(i=start + k) for k in range(n)]
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(f"the model pattern may only use {{i}}: {error}") from None


def shift_fraction(elapsed: float, duration: float) -> float:
    """Share of traffic on the shift's destination: 0 until 25% of the run, linear to 1 at 75%, then
    1."""
    start, end = 0.25 * duration, 0.75 * duration
    if elapsed <= start:
        return 0.0
    if elapsed >= end:
        return 1.0
    return (elapsed - start) / (end - start)


def step_level(
    elapsed: float, levels: Sequence[float], step_seconds: float, ramp: bool = False
) -> float:
    """The load level at `elapsed`: each level held for `step_seconds` (the last one held after),
    or, with `ramp`, moving linearly from each level to the next over its step."""
    index = int(max(elapsed, 0.0) // step_seconds)
    if index >= len(levels) - 1:
        return float(levels[-1])
    if not ramp:
        return float(levels[index])
    within = (elapsed - index * step_seconds) / step_seconds
    return levels[index] + (levels[index + 1] - levels[index]) * within


def arrival_times(
    rate_at: Callable[[float], float],
    duration: float,
    rng: random.Random | None = None,
    dt: float = 0.001,
) -> Iterator[float]:
    """Intended send times (seconds from the start, below `duration`) of an open-loop schedule.

    The k-th request is due when the integrated rate reaches k (so a constant 50/s for 2 s is
    exactly 100 requests, and a step or ramp gets exactly its area). With `rng`, the gaps in
    integrated rate are exponential instead of 1: a Poisson process that follows the same
    (time-varying) rate.
    """
    area, due, index = 0.0, 0.0, 0
    while True:
        start = index * dt  # from the index, not a running sum: no drift over long runs
        if start >= duration - 1e-9:
            return
        rate = rate_at(start + dt / 2)
        end_area = area + rate * dt
        while rate > 0 and due <= end_area + 1e-9:
            when = start + (due - area) / rate
            if when >= duration - 1e-9:
                return
            yield when
            due += rng.expovariate(1.0) if rng is not None else 1.0
        area = end_area
        index += 1


@dataclass
class Scenario:
    """A traffic mix over time. Subclasses pick each request's target; `level` is the load level
    (requests/s or users) at a time, or None where the run's fixed --rate/--users applies."""

    name: ClassVar[str] = ""

    def target(self, elapsed: float, rng: random.Random) -> Target:
        raise NotImplementedError

    def level(self, elapsed: float) -> float | None:
        return None

    def targets(self) -> list[Target]:
        """Every target this scenario can send to (to encode payloads and headers once, up
        front)."""
        raise NotImplementedError


@dataclass
class Direct(Scenario):
    """Invoke the endpoint's containers in proportion to `weights` (hostname → weight)."""

    name: ClassVar[str] = "direct"

    weights: Mapping[str | None, float]

    def __post_init__(self) -> None:
        self._picker = Weighted(self.weights)

    def target(self, elapsed: float, rng: random.Random) -> Target:
        return Target(self._picker.pick(rng.random()))

    def targets(self) -> list[Target]:
        return [Target(c) for c in self.weights]


@dataclass
class Serial(Scenario):
    """Invoke a Serial endpoint (an inference pipeline) without naming a container."""

    name: ClassVar[str] = "serial"

    def target(self, elapsed: float, rng: random.Random) -> Target:
        return Target(None)

    def targets(self) -> list[Target]:
        return [Target(None)]


@dataclass
class Shift(Scenario):
    """Move traffic from container `source` to `destination` at constant total volume (see
    shift_fraction)."""

    name: ClassVar[str] = "shift"

    source: str
    destination: str
    duration: float

    def fraction(self, elapsed: float) -> float:
        return shift_fraction(elapsed, self.duration)

    def target(self, elapsed: float, rng: random.Random) -> Target:
        return Target(self.destination if rng.random() < self.fraction(elapsed) else self.source)

    def targets(self) -> list[Target]:
        return [Target(self.source), Target(self.destination)]


@dataclass
class Step(Scenario):
    """A step (or ramp) load shape for autoscaling: `levels` each held `step_seconds`, over the
    traffic mix of `inner` (Direct across containers, or Serial)."""

    name: ClassVar[str] = "step"

    levels: Sequence[float]
    step_seconds: float
    inner: Scenario
    ramp: bool = False

    def __post_init__(self) -> None:
        if not self.levels or any(v < 0 for v in self.levels) or max(self.levels) <= 0:
            raise ValueError("steps must be non-negative numbers, at least one of them positive")
        if self.step_seconds <= 0:
            raise ValueError("step seconds must be positive")

    @property
    def shape_seconds(self) -> float:
        return len(self.levels) * self.step_seconds

    def level(self, elapsed: float) -> float:
        return step_level(elapsed, self.levels, self.step_seconds, self.ramp)

    def target(self, elapsed: float, rng: random.Random) -> Target:
        return self.inner.target(elapsed, rng)

    def targets(self) -> list[Target]:
        return self.inner.targets()


@dataclass
class Zipf(Scenario):
    """MultiModel traffic: each request's TargetModel drawn from `models` with Zipf(s) popularity
    (first name most popular), sent to `container` (None: the endpoint's only container)."""

    name: ClassVar[str] = "zipf"

    models: Sequence[str]
    s: float
    container: str | None = None

    def __post_init__(self) -> None:
        self.probabilities = zipf_weights(len(self.models), self.s)
        self._picker = Weighted(dict(zip(self.models, self.probabilities)))

    def target(self, elapsed: float, rng: random.Random) -> Target:
        return Target(self.container, self._picker.pick(rng.random()))

    def targets(self) -> list[Target]:
        return [Target(self.container, m) for m in self.models]


__all__ = [
    "Direct",
    "ENDPOINT_LABEL",
    "SCENARIOS",
    "Scenario",
    "Serial",
    "Shift",
    "Step",
    "Target",
    "Weighted",
    "Zipf",
    "arrival_times",
    "model_names",
    "shift_fraction",
    "step_level",
    "zipf_weights",
]
