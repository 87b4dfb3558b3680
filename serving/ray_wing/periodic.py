"""Periodic work of the Ray wing's long-lived processes, under one policy: a named task that runs a step, logs a
failure with the task's name and keeps going, waiting at least `BACKOFF_S` after one (a registry or GCS that is
restarting is not hammered), and stops when it is cancelled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

__all__ = ["BACKOFF_S", "every"]

logger = logging.getLogger("serving.periodic")

BACKOFF_S = 1.0


def every(name: str, step: Callable[[], Awaitable[object]], interval_s: float) -> asyncio.Task[None]:
    """A task named `name` running `step` every `interval_s` seconds (from the end of one run to the next)."""

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
