"""Fast predictions run on the container process's event loop (`model_server.inline`,
`predictors.Inline`).

Real sklearn and python-stack runtimes behind the container app, driven over httpx's ASGI transport
(the app runs in this test's event loop, on the main thread, so "on the loop" is "on the main
thread").
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from typing import Any

import httpx
import pytest

from serving.model_server.app import ContainerApp, build_container_app
from serving.model_server.inline import GC_CLOCK, MAX_STREAK, STREAK, InlineGate, RunQueueClock
from serving.runtimes import InvocationContext, Runtime
from serving.runtimes.concurrency import inline_budget_s

JSON = "application/json"
# generous: a 1-row iris prediction takes well under 1 ms, even on a busy CI machine
BUDGET_S = 0.05


def where_predictions_run(
    runtime: Runtime, delays: list[float] | None = None, sleeps: list[float] | None = None
) -> list[str]:
    """Record, per predict call, whether it ran on the main thread (the loop); `delays` are spent
    computing and `sleeps` waiting (as on I/O), one per call."""
    places: list[str] = []
    predict = runtime.predict

    def recorded(data: Any, context: InvocationContext) -> Any:
        places.append("loop" if threading.current_thread() is threading.main_thread() else "thread")
        if sleeps:
            time.sleep(sleeps.pop(0))
        if delays:
            until = time.thread_time() + delays.pop(0)
            # CPU, not a sleep: the gate counts a prediction's CPU time
            while time.thread_time() < until:
                pass
        return predict(data, context)

    runtime.predict = recorded  # type: ignore[method-assign]
    return places


async def post_one_by_one(app: ContainerApp, bodies: list[bytes]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://container") as client:
        return [
            await client.post(
                "/invocations", content=body, headers={"content-type": JSON, "accept": JSON}
            )
            for body in bodies
        ]


def test_the_gate_opens_after_a_streak_of_fast_predictions_and_closes_at_a_slow_one() -> None:
    gate = InlineGate(0.002, streak=3)
    for _ in range(2):
        gate.record(0.001)  # on a worker thread: CPU only (its wall time counts waits for the GIL)
    assert not gate.open
    gate.record(0.002)  # at the budget is fast enough
    assert gate.open
    gate.record(0.0021, 0.0)  # over the budget of CPU, on the loop
    assert not gate.open
    # computing slowly is not waiting: the next opening needs the usual streak
    assert gate.required == 3
    for _ in range(3):
        gate.record(0.001)
    assert gate.open
    gate.record(0.0, 0.002)  # on the loop, waiting (not for a core) up to the budget
    assert gate.open
    never = InlineGate(0.0)
    for _ in range(STREAK * 2):
        never.record(0.0)
    assert not never.open


def test_waiting_on_the_loop_doubles_the_streak_and_good_runs_on_the_loop_halve_it() -> None:
    gate = InlineGate(0.002, streak=3)
    for _ in range(3):
        gate.record(0.001)
    # on the loop: past the budget neither running nor waiting for a core
    gate.record(0.0005, 0.0021)
    assert not gate.open and gate.required == 6
    for _ in range(5):
        gate.record(0.001)
    assert not gate.open
    gate.record(0.001)
    assert gate.open
    # good runs on the loop: the gate stays open, and after `required` of them halves it
    for _ in range(5):
        gate.record(0.001, 0.0)
        assert gate.open and gate.required == 6
    gate.record(0.001, 0.0)
    assert gate.required == 3
    for _ in range(20):  # a model that always waits: the streak it needs doubles up to MAX_STREAK
        while not gate.open:
            gate.record(0.001)
        gate.record(0.001, 0.01)
    assert gate.required == MAX_STREAK


def test_the_run_queue_clock_reads_this_threads_wait_for_a_core(tmp_path) -> None:
    clock = RunQueueClock()
    first = clock()
    until = time.thread_time() + 0.02
    while time.thread_time() < until:
        pass
    assert 0.0 <= first <= clock()
    values: list[float] = []
    # its own file: another thread's count
    other = threading.Thread(target=lambda: values.append(clock()))
    other.start()
    other.join()
    assert values and values[0] >= 0.0
    assert RunQueueClock(str(tmp_path / "missing"))() == 0.0  # no schedstat: no wait is subtracted
    garbled = tmp_path / "schedstat"
    garbled.write_text("12\n")
    assert RunQueueClock(str(garbled))() == 0.0


def test_a_fast_model_moves_onto_the_loop_and_a_slow_prediction_moves_it_back(
    loaded, iris_classifier, iris
) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    # Call STREAK + 2 is slow: it ran on the loop (the gate was open), and closes the gate behind
    # it.
    delays = [0.0] * (STREAK + 1) + [BUDGET_S * 2] + [0.0] * (STREAK + 2)  # spent computing
    places = where_predictions_run(runtime, delays)
    app = build_container_app(runtime, "iris", inline_budget_s=BUDGET_S)
    body = json.dumps(iris.data[:1].tolist()).encode()
    responses = asyncio.run(post_one_by_one(app, [body] * len(delays)))
    assert {response.status_code for response in responses} == {200}
    want = json.loads(responses[0].content)
    assert all(json.loads(response.content) == want for response in responses)
    assert places == (
        ["thread"] * STREAK + ["loop", "loop"] + ["thread"] * STREAK + ["loop", "loop"]
    ), (
        "fast predictions run on the loop after a streak; a slow one sends the next STREAK back to a thread"
    )
    assert app.inline is not None and app.inline.inline == 4


def test_a_failure_counts_like_an_answer(loaded, iris_classifier, iris) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    places = where_predictions_run(runtime)
    app = build_container_app(runtime, "iris", inline_budget_s=BUDGET_S)
    good = json.dumps(iris.data[:1].tolist()).encode()
    # the model raises on 3 features (a ModelError, 500)
    narrow = json.dumps(iris.data[:1, :3].tolist()).encode()
    bodies = [good] * STREAK + [narrow, good]
    responses = asyncio.run(post_one_by_one(app, bodies))
    assert [response.status_code for response in responses] == [200] * STREAK + [500, 200]
    assert places[-2:] == ["loop", "loop"]  # the fast failure kept the gate open


def test_what_never_runs_on_the_loop(loaded, iris_classifier, iris) -> None:
    body = json.dumps(iris.data[:1].tolist()).encode()
    sklearn = loaded("sklearn", iris_classifier.path)
    cases = {
        "budget 0": (sklearn, build_container_app(sklearn, "a", inline_budget_s=0.0)),
        "two model threads": (
            sklearn,
            build_container_app(sklearn, "b", threads=2, inline_budget_s=BUDGET_S),
        ),
    }
    for name, (runtime, app) in cases.items():
        places = where_predictions_run(runtime)
        asyncio.run(post_one_by_one(app, [body] * (STREAK + 3)))
        assert app.inline is None, name
        assert set(places) == {"thread"}, name
        del runtime.predict  # the recording wrapper


HOOKS = """
import asyncio
import threading
import time

def model_fn(model_dir):
    return None

def input_fn(body, content_type):
    return body if isinstance(body, str) else body.decode()

def predict_fn(data, model):
    place = "loop" if threading.current_thread() is threading.main_thread() else "thread"
    if data == "async":  # an async client driven from a sync hook, as AWS's toolkits allow
        async def fetch():
            await asyncio.sleep(0)
            return "ran"
        return [place, asyncio.run(fetch())]
    if data == "block":
        time.sleep(%(block_s)r)
    return [place]

def output_fn(prediction, accept):
    return ",".join(prediction)
"""


def test_request_hooks_run_on_the_loop_as_the_stacks_steps_do(loaded, handler_dir) -> None:
    """A script's input_fn / predict_fn / output_fn take the stack's path: on the loop once fast
    (no thread hand-off per call), back to the thread when one blocks, and a hook that runs asyncio
    itself works on the loop as on a thread."""
    scripted = loaded("python", handler_dir(HOOKS % {"block_s": BUDGET_S * 3}))
    app = build_container_app(scripted, "s", inline_budget_s=BUDGET_S)
    assert app.inline is not None
    bodies = [b"fast"] * (STREAK + 2) + [b"async", b"block"] + [b"fast"] * 2
    answers = [response.text for response in asyncio.run(post_one_by_one(app, bodies))]
    assert answers == (
        ["thread"] * STREAK
        + ["loop", "loop"]
        + ["loop,ran", "loop"]  # asyncio.run inside a hook, on the loop
        + ["thread", "thread"]  # the hook that waited closed the gate
    )


def test_no_prediction_runs_on_the_loop_while_one_runs_on_a_thread(
    loaded, iris_classifier, iris
) -> None:
    # The model-thread bound (1) holds across both places: with the gate open but the thread busy, a
    # request waits for the thread instead of computing beside it on the loop.
    runtime = loaded("sklearn", iris_classifier.path)
    app = build_container_app(runtime, "iris", inline_budget_s=BUDGET_S)
    assert app.inline is not None
    body = json.dumps(iris.data[:1].tolist()).encode()
    at_once = {"now": 0, "most": 0}
    lock = threading.Lock()
    predict = runtime.predict

    def counted(data: Any, context: InvocationContext) -> Any:
        with lock:
            at_once["now"] += 1
            at_once["most"] = max(at_once["most"], at_once["now"])
        try:
            return predict(data, context)
        finally:
            with lock:
                at_once["now"] -= 1

    runtime.predict = counted  # type: ignore[method-assign]

    async def run() -> list[httpx.Response]:
        await post_one_by_one(app, [body] * STREAK)
        assert app.inline is not None and app.inline.open
        limiter = app.predictor.limiter()
        assert limiter is not None
        busy = threading.Event()
        # a prediction on the thread, as far as the app can tell
        await limiter.acquire_on_behalf_of(busy)
        request = asyncio.ensure_future(post_one_by_one(app, [body]))
        await asyncio.sleep(0.1)
        assert not request.done(), "the request ran beside the busy model thread"
        limiter.release_on_behalf_of(busy)
        return await asyncio.wait_for(request, 10)

    responses = asyncio.run(run())
    assert responses[0].status_code == 200
    assert at_once["most"] == 1


@pytest.mark.parametrize(
    ("environment", "seconds"),
    [
        ({}, 0.005),
        ({"SERVING_INLINE_BUDGET_MS": "0"}, 0.0),
        ({"SERVING_INLINE_BUDGET_MS": "12.5"}, 0.0125),
    ],
)
def test_the_budget_setting(environment: dict[str, str], seconds: float) -> None:
    assert inline_budget_s(environment) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["-1", "51", "nan", "fast"])
def test_a_bad_budget_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match="SERVING_INLINE_BUDGET_MS"):
        inline_budget_s({"SERVING_INLINE_BUDGET_MS": value})


def test_a_model_that_waits_is_tried_on_the_loop_ever_more_rarely(
    loaded, iris_classifier, iris
) -> None:
    # Sleeping stands for I/O: little CPU, much wall time. On its thread that is not judged (the
    # GIL's waits look the same); on the loop it is, and each time it is caught the next try needs
    # twice the streak.
    runtime = loaded("sklearn", iris_classifier.path)
    calls = STREAK + 1 + 2 * STREAK + 1 + 2
    places = where_predictions_run(runtime, sleeps=[BUDGET_S * 2] * calls)
    app = build_container_app(runtime, "iris", inline_budget_s=BUDGET_S)
    body = json.dumps(iris.data[:1].tolist()).encode()
    responses = asyncio.run(post_one_by_one(app, [body] * calls))
    assert {response.status_code for response in responses} == {200}
    assert (
        places
        == ["thread"] * STREAK + ["loop"] + ["thread"] * (2 * STREAK) + ["loop"] + ["thread"] * 2
    )
    assert app.inline is not None and app.inline.required == 4 * STREAK


def test_requests_queued_behind_a_threads_prediction_run_on_the_loop_in_turn(
    loaded, iris_classifier, iris
) -> None:
    # Under steady load some request always waits for the model's token; once the gate is open the
    # waiting ones run on the loop, one at a time, instead of all going back to the thread because
    # the token was busy.
    runtime = loaded("sklearn", iris_classifier.path)
    app = build_container_app(runtime, "iris", inline_budget_s=BUDGET_S)
    body = json.dumps(iris.data[:1].tolist()).encode()

    async def run() -> tuple[list[httpx.Response], list[str]]:
        await post_one_by_one(app, [body] * STREAK)
        assert app.inline is not None and app.inline.open
        places = where_predictions_run(runtime)
        limiter = app.predictor.limiter()  # the first STREAK predictions ran on the thread
        assert limiter is not None
        busy = threading.Event()
        # a prediction on the thread, as far as the app can tell
        await limiter.acquire_on_behalf_of(busy)
        waiting = [asyncio.ensure_future(post_one_by_one(app, [body])) for _ in range(5)]
        await asyncio.sleep(0.1)
        assert not any(request.done() for request in waiting)
        limiter.release_on_behalf_of(busy)
        answers = await asyncio.wait_for(asyncio.gather(*waiting), 10)
        return [response for answer in answers for response in answer], places

    responses, places = asyncio.run(run())
    assert [response.status_code for response in responses] == [200] * 5
    assert places == ["loop"] * 5
    assert app.predictor.limiter().borrowed_tokens == 0


def test_a_garbage_collection_inside_a_prediction_does_not_close_the_gate(
    loaded, iris_classifier, iris
) -> None:
    # A collection runs in whichever thread's allocation triggers it and stalls the loop wherever it
    # runs; a prediction that happened to trigger one (here: of 300k cycles made before the request,
    # ~70 ms) is not slow.
    runtime = loaded("sklearn", iris_classifier.path)
    places = where_predictions_run(runtime)
    predict = runtime.predict
    spent: list[float] = []

    def collecting(data: Any, context: InvocationContext) -> Any:
        started = time.thread_time()
        gc.collect()
        spent.append(time.thread_time() - started)
        return predict(data, context)

    app = build_container_app(runtime, "iris", inline_budget_s=BUDGET_S)
    body = json.dumps(iris.data[:1].tolist()).encode()

    async def run() -> list[httpx.Response]:
        responses = await post_one_by_one(app, [body] * STREAK)
        runtime.predict = collecting  # type: ignore[method-assign]
        for _ in range(2):
            for _ in range(300_000):  # garbage for the next prediction's collection
                cycle: list[Any] = []
                cycle.append(cycle)
            del cycle
            responses += await post_one_by_one(app, [body])
        runtime.predict = predict  # type: ignore[method-assign]
        return responses + await post_one_by_one(app, [body])

    enabled = gc.isenabled()
    gc.disable()  # the cycles wait for the prediction's own collection
    try:
        responses = asyncio.run(run())
    finally:
        if enabled:
            gc.enable()
    assert {response.status_code for response in responses} == {200}
    assert min(spent) > BUDGET_S, f"each collection should take longer than the budget: {spent}"
    assert places == ["thread"] * STREAK + ["loop"] * 3


def test_the_gc_clock_counts_only_this_threads_collections() -> None:
    GC_CLOCK.install()
    GC_CLOCK.install()  # once, however often asked
    assert gc.callbacks.count(GC_CLOCK._on_gc) == 1
    before = GC_CLOCK()
    other = threading.Thread(target=gc.collect)
    other.start()
    other.join()
    assert GC_CLOCK() == before
    for _ in range(100_000):
        cycle: list[Any] = []
        cycle.append(cycle)
    del cycle
    gc.collect()
    assert GC_CLOCK() > before
