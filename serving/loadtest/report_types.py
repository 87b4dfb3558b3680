"""The shape of `report.json`, key by key (docs/loadtest.md describes each)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# The plan's settings and the scenario's own attributes: open, each scenario has its own.
Parameters = dict[str, Any]


class Percentiles(TypedDict):
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    mean: float | None


class Totals(TypedDict):
    requests: int
    ok: int
    failures: int
    answered: int
    dropped: int
    unfinished: int
    failures_by_status: dict[str, int]  # "429", "no answer" ...
    failures_by_code: dict[str, int]  # ThrottlingException ...


class TargetSummary(TypedDict):
    requests: int
    failures: int
    dropped: int
    latency_ms: Percentiles


class Second(TypedDict):
    """One second of the run, by intended send time."""

    t: int
    level: float | None
    requests: int
    ok: int
    errors: int
    errors_by_code: dict[str, int]
    dropped: int
    p50: float | None
    p90: float | None
    p99: float | None


class ReplicaSeries(TypedDict):
    containers: dict[str, list[list[float]]]  # container -> [[seconds, replicas], ...]
    errors: list[str]


class Throughput(TypedDict):
    requests: float
    ok: float
    window_s: float


class GeneratorHealth(TypedDict):
    lag_ms: Percentiles | None
    cpu_warning: bool
    warning: str | None


class Summary(TypedDict):
    """Everything the report says about one run."""

    start: str | None
    end: str | None
    elapsed_s: float
    interrupted: bool
    totals: Totals
    latency_ms: Percentiles
    throughput_rps: Throughput
    per_target: dict[str, TargetSummary]
    per_model: dict[str, int]
    timeseries: list[Second]
    replicas: ReplicaSeries
    generator: GeneratorHealth


class BaselineSummary(TypedDict):
    url: str | None
    start: str | None
    end: str | None
    elapsed_s: float
    totals: Totals
    latency_ms: Percentiles
    throughput_rps: Throughput
    timeseries: list[Second]
    generator: GeneratorHealth


class Ratios(TypedDict):
    """ours / baseline."""

    p50: float | None
    p99: float | None
    throughput: float | None


class MetricsCheck(TypedDict):
    """The server's serving_invocations_total around the run, against the harness's count."""

    metric: str
    before: float | None
    after: float | None
    difference: float | None
    harness_answered: int
    matches: bool | None
    error: str | None


class Report(Summary):
    scenario: str
    parameters: Parameters
    baseline: NotRequired[BaselineSummary]
    ratios: NotRequired[Ratios]
    metrics_check: NotRequired[MetricsCheck]
