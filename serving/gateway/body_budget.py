"""What a gateway holds of request bodies before their senders are verified: one budget for all its
connections.

A Signature V4 covers the body, so a signed request's body must be read before its sender is known;
these bodies share one bound (`SERVING_PREAUTH_BODY_BUDGET_MB`), so that unauthenticated callers
cannot fill the gateway's memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from serving.errors import ThrottlingError

__all__ = ["BodyBudget", "Hold"]


class BodyBudget:
    """Bytes of request bodies held before their sender is verified, across all of the gateway's
    connections.

    Only the server's event loop uses it, so plain arithmetic is enough.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[Hold]:
        """A hold that grows as a body arrives; what it took is given back when the block ends."""
        hold = Hold(self)
        try:
            yield hold
        finally:
            self.held -= hold.bytes


class Hold:
    """One body's share of a BodyBudget."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.bytes = 0

    def grow_to(self, total: int) -> None:
        """Hold `total` bytes, or raise ThrottlingError (429) when the budget cannot take them."""
        extra = total - self.bytes
        if extra <= 0:
            return
        budget = self.budget
        if budget.held + extra > budget.limit:
            # Refused at once rather than queued: the caller's SDK backs off and retries (botocore
            # treats ThrottlingException as throttling), and no connection waits here holding a
            # partial body.
            raise ThrottlingError(
                f"the gateway is already receiving as many signed request bodies as it holds before verifying "
                f"their signatures ({budget.limit} bytes, SERVING_PREAUTH_BODY_BUDGET_MB); retry shortly"
            )
        budget.held += extra
        self.bytes = total
