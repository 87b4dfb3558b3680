"""Work a gateway does after the caller has its answer: shadow copies, data capture's writes,
InvokeEndpointAsync's jobs. One runner per gateway holds every such task.

- Each kind has its own bound on the tasks it runs at once: past it a new task is dropped and
  counted, never queued, so that one kind cannot take the gateway's memory or connections from the
  others (a kind whose admission is bounded where it is admitted, as async jobs are by their
  endpoint's queue, has none here).
- One counter family counts every task's end: `serving_after_answer_tasks_total{kind, outcome}`, the
  outcome `done`, `failed` (it raised: a bug of ours, logged), `cancelled` (the gateway stopped
  first) or `dropped`.
- One close stops them all, kind by kind, the last registered first: each kind's tasks are cancelled
  and given its grace to end (their own handlers run: an async job writes its failure object), then
  the kind's closer runs (data capture writes what it still holds) in what is left of that grace: a
  gateway stops within the sum of its kinds' graces, whatever a destination does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import Counter

from serving.metrics.invocations import REGISTRY

__all__ = ["AFTER_ANSWER_TASKS", "AfterAnswer"]

logger = logging.getLogger("serving.after_answer")

AFTER_ANSWER_TASKS = Counter(
    "serving_after_answer_tasks",
    "Tasks a gateway ran after the caller had its answer (shadow copies, data capture writes, async jobs), by "
    "kind and outcome: done, failed (a bug of ours, logged), cancelled (the gateway stopped first) or dropped "
    "(the kind already ran as many as it may).",
    labelnames=("kind", "outcome"),
    registry=REGISTRY,
)


@dataclass
class _Kind:
    bound: int | None  # tasks at once; None: bounded where they are admitted
    grace_s: float  # how long `close` waits for them to end once cancelled
    closer: Callable[[], Awaitable[None]] | None
    tasks: set[asyncio.Task] = field(default_factory=set)


class AfterAnswer:
    """The gateway's after-the-answer tasks, by kind."""

    def __init__(self) -> None:
        self._kinds: dict[str, _Kind] = {}

    def register(
        self,
        kind: str,
        bound: int | None,
        grace_s: float = 5.0,
        closer: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Declare a kind of task: at most `bound` at once; at close, `grace_s` to end once
        cancelled, then `closer`."""
        self._kinds[kind] = _Kind(bound, grace_s, closer)

    def running(self, kind: str) -> int:
        return len(self._kinds[kind].tasks)

    def submit(
        self, kind: str, work: Callable[[], Awaitable[object]], what: str = ""
    ) -> asyncio.Task | None:
        """Run `work()` in the background on this event loop; None when `kind` is at its bound
        (dropped, counted). `what`: the task in words, for the log line if it fails."""
        held = self._kinds[kind]
        if held.bound is not None and len(held.tasks) >= held.bound:
            AFTER_ANSWER_TASKS.labels(kind, "dropped").inc()
            return None
        task = asyncio.get_running_loop().create_task(
            self._run(kind, work, what), name=f"after-answer:{kind}"
        )
        held.tasks.add(task)
        task.add_done_callback(held.tasks.discard)
        return task

    async def _run(self, kind: str, work: Callable[[], Awaitable[object]], what: str) -> None:
        outcome, held = "failed", self._kinds[kind]
        try:
            await work()
            outcome = "done"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        # a bug of ours: logged, counted, and never the caller's (who has their answer)
        except Exception:
            logger.exception("%s failed after its caller was answered", what or f"a {kind} task")
        finally:
            # Out of its kind's count as it ends, not when its done-callback runs later: a submit in
            # between (data capture restarting its writer) would find the kind full and drop.
            task = asyncio.current_task()
            if task is not None:
                held.tasks.discard(task)
            AFTER_ANSWER_TASKS.labels(kind, outcome).inc()

    async def close(self) -> None:
        """Stop every kind, the last registered first: cancel its tasks, give them its grace to end
        (their own handlers run), then its closer, within the same grace."""
        loop = asyncio.get_running_loop()
        for kind, held in reversed(self._kinds.items()):
            deadline = loop.time() + held.grace_s
            running = list(held.tasks)
            for task in running:
                task.cancel()
            if running:
                _, late = await asyncio.wait(running, timeout=held.grace_s)
                if late:
                    logger.warning(
                        "%d %s tasks did not end within %.0f s of the gateway stopping",
                        len(late),
                        kind,
                        held.grace_s,
                    )
            if held.closer is not None:
                try:
                    await asyncio.wait_for(held.closer(), max(deadline - loop.time(), 0.0))
                except TimeoutError:
                    logger.warning(
                        "closing the gateway's %s tasks took more than %.0f s", kind, held.grace_s
                    )
                except Exception:
                    logger.exception("closing the gateway's %s tasks failed", kind)
