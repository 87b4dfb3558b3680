"""A container process's metric events, kept until its supervisor drains and records them.

The container process has no Ray (its tenant code must not reach the cluster), so it cannot
record Ray metrics itself: it keeps each event here, and the replica's supervisor fetches them
(`GET /_serving/stats`, hop-authenticated) and replays them onto `replica_metrics.ReplicaMetrics`,
method by method. Bounded: past `limit` undrained events the oldest are dropped and counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from serving.models.cache import CacheObserver

__all__ = ["DRAIN_MOST", "EVENTS", "EventLog", "replay"]

DRAIN_MOST = 5_000  # events in one stats answer (its supervisor asks again at once for more)

# The methods an event may name: ReplicaMetrics implements each.
EVENTS = frozenset(
    {
        "model_latency",
        "hit",
        "waited",
        "loaded",
        "unloaded",
        "changed",
        "downloaded",
        "batch_size",
        "queue_delay",
        "time_to_first_token",
        "output_tokens",
    }
)


class EventLog(CacheObserver):
    """Records the model cache's, the store's and the runtime's events as plain tuples."""

    def __init__(self, limit: int = 100_000) -> None:
        self._events: deque[tuple[Any, ...]] = deque()
        self.limit = limit
        self.dropped = 0

    def _add(self, *event: Any) -> None:
        self._events.append(event)
        while len(self._events) > self.limit:
            self._events.popleft()
            self.dropped += 1

    def model_latency(self, seconds: float) -> None:
        self._add("model_latency", seconds)

    def hit(self, name: str) -> None:
        self._add("hit", name)

    def waited(self, name: str, seconds: float) -> None:
        self._add("waited", name, seconds)

    def loaded(self, name: str, seconds: float, nbytes: int) -> None:
        self._add("loaded", name, seconds, nbytes)

    def unloaded(self, name: str, seconds: float) -> None:
        self._add("unloaded", name, seconds)

    def changed(self, loaded_count: int, total_bytes: int) -> None:
        self._add("changed", loaded_count, total_bytes)

    def downloaded(self, name: str, seconds: float, nbytes: int) -> None:
        self._add("downloaded", name, seconds, nbytes)

    def batch_size(self, rows: int) -> None:
        """Rows of one dynamic batch (`model_server.batching`)."""
        self._add("batch_size", rows)

    def queue_delay(self, seconds: float) -> None:
        """How long one batched request waited, from its decode to its batch's start."""
        self._add("queue_delay", seconds)

    def time_to_first_token(self, seconds: float) -> None:
        """A generating request's time from its arrival at the model to its first new token."""
        self._add("time_to_first_token", seconds)

    def output_tokens(self, count: int, seconds: float) -> None:
        """A generating request's new tokens, and the time from its first token to its last."""
        self._add("output_tokens", count, seconds)

    def drain(self, most: int = DRAIN_MOST) -> list[tuple[Any, ...]]:
        """The oldest `most` events since the last drain, oldest first (the rest wait for the next:
        one stats answer stays bounded, `supervisor.MAX_STATS_BYTES`)."""
        drained: list[tuple[Any, ...]] = []
        while self._events and len(drained) < most:
            drained.append(self._events.popleft())
        return drained


def replay(events: Iterable[Iterable[Any]], target: Any) -> int:
    """Call `target.<event>(*args)` for each known event; returns how many were replayed."""
    count = 0
    for name, *args in events:
        if name in EVENTS:
            getattr(target, name)(*args)
            count += 1
    return count
