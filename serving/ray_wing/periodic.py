"""Periodic work of the Ray wing's long-lived processes, under one policy: a named task that runs a
step, logs a failure with the task's name and keeps going, waiting at least `BACKOFF_S` after one (a
registry or GCS that is restarting is not hammered), and stops when it is cancelled.

The gateway runs its tasks on its server's event loop (`every`); the control plane, whose API calls
arrive on the registry's threads and wait there for the API's lock, runs its own on a loop of their
own (`PeriodicLoop`), so that reading the registry never waits for a thread behind them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TypeVar

__all__ = ["BACKOFF_S", "PeriodicLoop", "every"]

logger = logging.getLogger("serving.periodic")

BACKOFF_S = 1.0

Step = Callable[[], Awaitable[object]]
T = TypeVar("T")


def every(name: str, step: Step, interval_s: float) -> asyncio.Task[None]:
    """A task named `name` running `step` every `interval_s` seconds (from the end of one run to the
    next)."""

    async def loop() -> None:
        while True:
            wait = interval_s
            try:
                await step()
            except Exception:
                logger.exception("%s failed; retrying", name)
                wait = max(interval_s, BACKOFF_S)
            await asyncio.sleep(wait)

    return asyncio.create_task(loop(), name=name)


class PeriodicLoop:
    """Named tasks (`every`) on an event loop of their own, run by one daemon thread named `name`:
    `steps` maps each task's name to its step and interval. A blocking step hands its work to a
    thread (`asyncio.to_thread`): the loop's own pool, which only these tasks use."""

    def __init__(self, name: str, steps: Mapping[str, tuple[Step, float]]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

        async def start() -> list[asyncio.Task[None]]:
            return [every(task, step, interval_s) for task, (step, interval_s) in steps.items()]

        self.tasks = asyncio.run_coroutine_threadsafe(start(), self._loop).result()

    def submit(self, coroutine: Coroutine[object, object, T]) -> concurrent.futures.Future[T]:
        """Run `coroutine` on this loop (what must share its tasks' loop, as an HTTP session does)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def stopped(self) -> list[str]:
        """The tasks that no longer run (all of them once the loop's thread has ended): a health
        check's answer."""
        if not self._thread.is_alive():
            return [task.get_name() for task in self.tasks]
        return [task.get_name() for task in self.tasks if task.done()]

    def close(self, timeout_s: float = 2.0) -> None:
        """Cancel every task, wait at most `timeout_s` for them to end, then stop the loop. A step
        blocked on a thread is not waited for (the thread is left to finish on its own).
        Idempotent."""
        if not self._thread.is_alive():
            return

        async def cancel() -> None:
            for task in self.tasks:
                task.cancel()
            await asyncio.wait(self.tasks, timeout=timeout_s)

        try:
            asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(timeout_s + 1.0)
        except (concurrent.futures.TimeoutError, RuntimeError):  # a loop already stopping
            logger.warning("the %s tasks did not end within %.0f s", self._thread.name, timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
