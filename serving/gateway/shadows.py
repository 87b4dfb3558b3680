"""ShadowProductionVariants: a sampled invocation is copied to the shadow variant once the caller has its answer.

The copy runs on the gateway's event loop after the production answer is made, so the caller's latency and answer
never depend on it; its answer goes to data capture (as the shadow variant's) and nowhere else, and its failures
count in the shadow's own invocation metrics (its served endpoint, `E@<shadow>@<n>`). A gateway runs at most
MAX_IN_FLIGHT copies at once: past that a copy is dropped and counted, never queued, so a slow shadow cannot hold
the gateway's memory or connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from serving.metrics.invocations import REGISTRY

__all__ = ["MAX_IN_FLIGHT", "SHADOW_COPIES", "ShadowCopies"]

logger = logging.getLogger("serving.shadows")

MAX_IN_FLIGHT = 64
SHADOW_COPIES = Counter(
    "serving_shadow_copies",
    "Invocations copied to a shadow variant, by outcome: answered, failed (the shadow's error, never the "
    "caller's) or dropped (the gateway already ran MAX_IN_FLIGHT copies).",
    labelnames=("endpoint", "variant", "outcome"),
    registry=REGISTRY,
)


class ShadowCopies:
    """The copies one gateway has in flight."""

    def __init__(self) -> None:
        self.in_flight = 0
        self._tasks: set[asyncio.Task] = set()

    def start(self, endpoint: str, variant: str, copy: Callable[[], Awaitable[bool]]) -> None:
        """Run `copy` (True once the shadow answered) in the background, unless too many already run."""
        if self.in_flight >= MAX_IN_FLIGHT:
            SHADOW_COPIES.labels(endpoint, variant, "dropped").inc()
            return
        self.in_flight += 1
        task = asyncio.get_running_loop().create_task(self._run(endpoint, variant, copy))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, endpoint: str, variant: str, copy: Callable[[], Awaitable[bool]]) -> None:
        answered = False
        try:
            answered = await copy()
        except Exception:  # a bug of ours: logged, and still never the caller's
            logger.exception("copying an invocation of %s to shadow variant %s failed", endpoint, variant)
        finally:
            self.in_flight -= 1
            SHADOW_COPIES.labels(endpoint, variant, "answered" if answered else "failed").inc()

    async def close(self) -> None:
        """Cancel the copies still running (the gateway stops)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
