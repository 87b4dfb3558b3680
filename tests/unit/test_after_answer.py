"""serving.gateway.after_answer: one runner for what a gateway does after the caller has its answer.

Each kind is bounded on its own (a kind at its bound drops, the others still run), every task's end
is counted once by kind and outcome, a failing task stops nothing else, and one close cancels every
kind (the last registered first), waits its grace for the handlers and runs its closer.
"""

from __future__ import annotations

import asyncio

from serving.gateway.after_answer import AFTER_ANSWER_TASKS, AfterAnswer


def counts(kind: str) -> dict[str, float]:
    outcomes = ("done", "failed", "cancelled", "dropped")
    return {outcome: AFTER_ANSWER_TASKS.labels(kind, outcome)._value.get() for outcome in outcomes}


def moved(before: dict[str, float], kind: str) -> dict[str, float]:
    return {
        outcome: value - before[outcome]
        for outcome, value in counts(kind).items()
        if value != before[outcome]
    }


def test_each_kind_has_its_own_bound_and_every_end_is_counted_once() -> None:
    async def scenario() -> None:
        runner, release = AfterAnswer(), asyncio.Event()
        runner.register("t-copies", 2)
        runner.register("t-jobs", None)
        before = {kind: counts(kind) for kind in ("t-copies", "t-jobs")}

        async def slow() -> None:
            await release.wait()

        async def broken() -> None:
            raise RuntimeError("a bug of ours: logged and counted, the other tasks go on")

        started = [runner.submit("t-copies", slow) for _ in range(4)]
        assert [task is not None for task in started] == [True, True, False, False]
        assert runner.running("t-copies") == 2
        # no bound of its own: none dropped
        jobs = [runner.submit("t-jobs", slow) for _ in range(5)]
        assert all(jobs) and runner.running("t-jobs") == 5
        assert runner.submit("t-jobs", broken) is not None
        release.set()
        await asyncio.sleep(0.05)
        assert (runner.running("t-copies"), runner.running("t-jobs")) == (0, 0)
        assert moved(before["t-copies"], "t-copies") == {"done": 2, "dropped": 2}
        assert moved(before["t-jobs"], "t-jobs") == {"done": 5, "failed": 1}
        await runner.close()

    asyncio.run(scenario())


def test_close_cancels_each_kind_last_registered_first_and_runs_its_closer() -> None:
    async def scenario() -> list[str]:
        runner, events = AfterAnswer(), []
        forever = asyncio.Event()

        async def closer(kind: str) -> None:
            events.append(f"closed {kind}")

        async def waits(kind: str) -> None:
            try:
                await forever.wait()
            except asyncio.CancelledError:
                events.append(f"cancelled {kind}")  # its own handler runs before its kind's closer
                raise

        for kind in ("t-first", "t-second"):
            runner.register(kind, None, grace_s=1.0, closer=lambda kind=kind: closer(kind))
            runner.submit(kind, lambda kind=kind: waits(kind))
        before = counts("t-first")
        await asyncio.sleep(0)
        await runner.close()
        assert moved(before, "t-first") == {"cancelled": 1}
        return events

    assert asyncio.run(scenario()) == [
        "cancelled t-second",
        "closed t-second",
        "cancelled t-first",
        "closed t-first",
    ]


def test_close_waits_a_kinds_grace_and_no_longer() -> None:
    async def scenario() -> float:
        runner, let_go = AfterAnswer(), asyncio.Event()
        runner.register("t-stubborn", None, grace_s=0.2)

        async def stubborn() -> None:
            while not let_go.is_set():  # ignores cancellation: the gateway must stop all the same
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    continue

        task = runner.submit("t-stubborn", stubborn)
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await runner.close()
        waited = loop.time() - started
        assert task is not None and not task.done()  # abandoned after its grace
        let_go.set()
        await task
        return waited

    waited = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert 0.15 <= waited < 2.0


def test_a_failing_task_stops_nothing_and_a_kind_at_its_bound_takes_a_task_again_as_one_ends() -> (
    None
):
    async def scenario() -> list[bool]:
        runner = AfterAnswer()
        runner.register("t-writer", 1)
        before = counts("t-writer")
        again: list[bool] = []

        async def broken() -> None:
            raise RuntimeError("a bug of ours")

        # what runs next on the loop sees this task ended: its kind has room again
        async def hands_over() -> None:
            asyncio.get_running_loop().call_soon(
                lambda: again.append(runner.submit("t-writer", ok) is not None)
            )

        async def ok() -> None:
            await asyncio.sleep(0)

        first = runner.submit("t-writer", broken)
        assert first is not None and runner.submit("t-writer", ok) is None  # at its bound: dropped
        await asyncio.gather(first, return_exceptions=True)
        # the failure stopped nothing: the kind runs the next
        second = runner.submit("t-writer", hands_over)
        assert second is not None
        await second
        await asyncio.sleep(0.05)
        assert moved(before, "t-writer") == {"failed": 1, "dropped": 1, "done": 2}
        await runner.close()
        return again

    assert asyncio.run(scenario()) == [True]


def test_a_kinds_closer_has_what_is_left_of_its_grace() -> None:
    async def scenario() -> float:
        runner = AfterAnswer()
        closed: list[str] = []

        async def hangs() -> None:  # a destination that never answers
            await asyncio.Event().wait()

        async def writes() -> None:
            closed.append("t-quick")

        runner.register("t-quick", None, grace_s=1.0, closer=writes)
        runner.register("t-hanging", None, grace_s=0.2, closer=hangs)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await runner.close()
        assert closed == ["t-quick"]  # the hanging closer did not keep the next kind from closing
        return loop.time() - started

    assert 0.15 <= asyncio.run(asyncio.wait_for(scenario(), 5)) < 1.0
