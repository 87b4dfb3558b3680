"""ShadowProductionVariants: a sampled invocation is copied to the shadow variant once the caller
has its answer.

The copy runs on the gateway's event loop after the production answer is made, so the caller's
latency and answer never depend on it; its answer goes to data capture (as the shadow variant's) and
nowhere else, and its failures count in the shadow's own invocation metrics (its served endpoint,
`E@<shadow>@<n>`). A gateway runs at most MAX_IN_FLIGHT copies at once (its after-the-answer
runner's bound for them): past that a copy is dropped and counted, never queued, so a slow shadow
cannot hold the gateway's memory or connections.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from serving.gateway.after_answer import AfterAnswer
from serving.metrics.invocations import REGISTRY

__all__ = ["MAX_IN_FLIGHT", "SHADOW_COPIES", "ShadowCopies"]

MAX_IN_FLIGHT = 64
SHADOW_COPIES = Counter(
    "serving_shadow_copies",
    "Invocations copied to a shadow variant, by outcome: answered, failed (the shadow's error, never the "
    "caller's) or dropped (the gateway already ran MAX_IN_FLIGHT copies).",
    labelnames=("endpoint", "variant", "outcome"),
    registry=REGISTRY,
)


class ShadowCopies:
    """Starts one gateway's shadow copies on its after-the-answer runner (cancelled when the gateway
    stops)."""

    KIND = "shadow"

    def __init__(self, after: AfterAnswer) -> None:
        self.after = after
        after.register(self.KIND, MAX_IN_FLIGHT)

    @property
    def in_flight(self) -> int:
        return self.after.running(self.KIND)

    def start(self, endpoint: str, variant: str, copy: Callable[[], Awaitable[bool]]) -> None:
        """Run `copy` (True once the shadow answered) in the background, unless too many already
        run."""
        what = f"copying an invocation of {endpoint} to shadow variant {variant}"
        if self.after.submit(self.KIND, lambda: self._run(endpoint, variant, copy), what) is None:
            SHADOW_COPIES.labels(endpoint, variant, "dropped").inc()

    async def _run(self, endpoint: str, variant: str, copy: Callable[[], Awaitable[bool]]) -> None:
        answered = False
        try:
            # a bug of ours raises: the runner logs it, and it is never the caller's
            answered = await copy()
        finally:
            SHADOW_COPIES.labels(endpoint, variant, "answered" if answered else "failed").inc()
