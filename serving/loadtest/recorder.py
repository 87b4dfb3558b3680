"""Raw outcomes of one run, kept per request so the report can cut them any way it needs.

Appends only (each is atomic under gevent and under the GIL), one small tuple per request: a
ten-minute run at 1000 requests/s is 600k tuples, well within memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Sample(NamedTuple):
    """One request that was sent: when it was due, how long until its answer, and what came back."""

    sent: float  # seconds from the run's start to the request's intended send time
    latency_ms: float  # from the intended send time to the end of the answer
    label: str  # the container it targeted (scenarios.ENDPOINT_LABEL when none)
    model: str | None  # its TargetModel, for MultiModel traffic
    status: int  # HTTP status; 0 when no answer came (connection refused, reset, timeout)
    # None on 2xx; else the error code (x-amzn-ErrorType), or the exception's name
    error: str | None


@dataclass
class RunResult:
    """What one run produced, before any statistics: per-request samples and side observations."""

    name: str  # "main" or "baseline"
    started_at: float = 0.0  # wall clock (epoch seconds) at the run's time 0
    ended_at: float = 0.0  # wall clock when the last answer was in (or the drain gave up)
    samples: list[Sample] = field(default_factory=list)
    # (due time, label): refused by --max-in-flight
    dropped: list[tuple[float, str]] = field(default_factory=list)
    # still in flight when the drain timed out (neither answered nor counted as dropped)
    unfinished: int = 0
    # open loop: how late each request left its schedule
    lag_ms: list[float] = field(default_factory=list)
    # (seconds from start, counts)
    replicas: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    replica_errors: list[str] = field(default_factory=list)
    levels: list[float] = field(default_factory=list)  # planned load level at each second
    cpu_warning: bool = False  # Locust saw the load generator's CPU above 90%
    interrupted: bool = False  # stopped early (Ctrl-C or the web UI's stop)

    def add(
        self,
        sent: float,
        latency_ms: float,
        label: str,
        model: str | None,
        status: int,
        error: str | None,
    ) -> None:
        self.samples.append(Sample(sent, latency_ms, label, model, status, error))

    def drop(self, sent: float, label: str) -> None:
        self.dropped.append((sent, label))

    @property
    def answered(self) -> int:
        """Requests the server answered (any status): what the server's own counters should have
        seen."""
        return sum(1 for s in self.samples if s.status)


__all__ = ["RunResult", "Sample"]
