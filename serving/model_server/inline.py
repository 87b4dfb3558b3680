"""When a container process may run a prediction on its event loop instead of handing it to a worker thread.

Handing a prediction to a worker thread and its answer back costs two thread wake-ups and a GIL hand-over each
way: ~0.4-0.6 ms of CPU per request on a 2-core VM, more than a small scikit-learn pipeline's own prediction
(docs/performance.md). A model that is fast enough may run on the loop instead: the loop then waits for it, and
so do `/ping` and every other request, for about the budget at most. The gate opens only after `streak`
predictions in a row each took at most the budget (of CPU; see `record`), and closes again at the first slower
one, so a slow or variable model (a cold cache, a long input) keeps running on its thread. The budget:
`concurrency.inline_budget_s`.
"""

from __future__ import annotations

STREAK = 8  # fast predictions in a row before one runs on the loop
WALL_FACTOR = 4  # a prediction whose wall time passes this many budgets is slow, whatever its CPU time


class InlineGate:
    """Counts fast predictions in a row; `open` says whether the next one may run on the event loop."""

    def __init__(self, budget_s: float, streak: int = STREAK) -> None:
        self.budget_s = budget_s
        self.streak = streak
        self._fast = 0
        self.inline = 0  # predictions run on the loop (the stats say how many)

    @property
    def open(self) -> bool:
        return self.budget_s > 0 and self._fast >= self.streak

    def record(self, cpu_s: float, wall_s: float) -> None:
        """One prediction's CPU time on its thread and its wall time, wherever it ran (a failed one counts too).

        Fast means CPU time within the budget: on a busy machine the wall time of a 0.5 ms prediction often passes
        2 ms while other processes hold the cores, and closing the gate then would add the hand-off's CPU exactly
        when CPU is short. A wall time past WALL_FACTOR budgets (a prediction waiting on I/O, or on threads of its
        own) is slow all the same."""
        fast = cpu_s <= self.budget_s and wall_s <= WALL_FACTOR * self.budget_s
        self._fast = self._fast + 1 if fast else 0
