"""The Ray wing's periodic tasks (serving/ray_wing/periodic.py): a failing step is logged and retried after the
back-off, never the end of the task; cancelling stops it. No Ray needed."""

from __future__ import annotations

import asyncio
import logging
import time

from serving.ray_wing import periodic


def test_a_failing_step_is_logged_and_retried_after_the_back_off(caplog, monkeypatch) -> None:
    monkeypatch.setattr(periodic, "BACKOFF_S", 0.05)
    runs: list[float] = []

    async def step() -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            raise RuntimeError("registry restarting")

    async def main() -> None:
        task = periodic.every("test step", step, 0.0)
        while len(runs) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() and task.get_name() == "test step"

    with caplog.at_level(logging.ERROR, logger="serving.periodic"):
        asyncio.run(main())
    assert "test step failed; retrying" in caplog.text and "registry restarting" in caplog.text
    assert runs[1] - runs[0] >= 0.05  # waited the back-off after the failure
