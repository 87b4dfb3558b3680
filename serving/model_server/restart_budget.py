"""How many times a replica's supervisor may start its container process again, in place, after the
process died on its own: a few, so that a crashed model is back in well under a second where a new
replica would take seconds, but not forever, so that a model that keeps dying leaves its replica to
fail its health check and Serve to replace it (and the endpoint to show it)."""

from __future__ import annotations

import time
from collections.abc import Callable

RESTARTS = 3  # in place, within WINDOW_S
WINDOW_S = 300.0


class RestartBudget:
    """At most `restarts` restarts in any `window_s` seconds."""

    def __init__(
        self,
        restarts: int = RESTARTS,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.restarts, self.window_s, self._clock = restarts, window_s, clock
        self._taken: list[float] = []

    def take(self) -> bool:
        """Whether one more restart is allowed now (and, if so, count it)."""
        now = self._clock()
        self._taken = [when for when in self._taken if now - when < self.window_s]
        if len(self._taken) >= self.restarts:
            return False
        self._taken.append(now)
        return True
