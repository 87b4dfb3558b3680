"""The Ray wing's periodic tasks (serving/ray_wing/periodic.py): a failing step is logged and
retried after the back-off, never the end of the task; cancelling stops it; a loop of their own (the
control plane's) runs them off the caller's thread and closes within its bound. No Ray needed."""

from __future__ import annotations

import asyncio
import logging
import threading
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


def test_a_periodic_loop_runs_named_tasks_on_its_own_thread_and_closes_within_its_bound(
    monkeypatch,
) -> None:
    monkeypatch.setattr(periodic, "BACKOFF_S", 0.05)
    seen: dict[str, set[str]] = {"blocking": set(), "failing": set()}
    failures = 0

    def blocking() -> None:  # a step that blocks (a Ray call): on the loop's own threads
        seen["blocking"].add(threading.current_thread().name)
        time.sleep(0.01)

    async def failing() -> None:
        nonlocal failures
        seen["failing"].add(threading.current_thread().name)
        failures += 1
        raise RuntimeError("the registry restarting")

    runner = periodic.PeriodicLoop(
        "test-periodic",
        {"blocks": (lambda: asyncio.to_thread(blocking), 0.0), "fails": (failing, 0.0)},
    )
    deadline = time.monotonic() + 5
    while (failures < 3 or not seen["blocking"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    # a failing step is retried, never the end of its task
    assert failures >= 3 and runner.stopped() == []
    assert [task.get_name() for task in runner.tasks] == ["blocks", "fails"]
    assert (
        seen["failing"] == {"test-periodic"}
        and threading.current_thread().name not in seen["blocking"]
    )
    started = time.monotonic()
    runner.close(timeout_s=1.0)
    assert time.monotonic() - started < 2.0
    assert sorted(runner.stopped()) == ["blocks", "fails"]
    runner.close()  # again: nothing to do


def test_closing_a_periodic_loop_does_not_wait_for_a_step_blocked_on_a_thread() -> None:
    release = threading.Event()
    runner = periodic.PeriodicLoop(
        "test-stuck", {"stuck": (lambda: asyncio.to_thread(release.wait, 30), 0.0)}
    )
    time.sleep(0.05)
    started = time.monotonic()
    runner.close(timeout_s=0.2)
    release.set()
    assert time.monotonic() - started < 1.5 and runner.stopped() == ["stuck"]
