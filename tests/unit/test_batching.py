"""Dynamic batching and the model thread pool of a container's data port (`model_server.batching`,
`app`).

Driven over httpx's ASGI transport (the app in this event loop), with real models: the iris
classifier of conftest (scikit-learn, skops) and a TorchScript layer trained on nothing but saved as
the pytorch stack loads it.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.model_server.app import ContainerApp, build_container_app
from serving.model_server.events import EventLog
from serving.runtimes import InvocationContext, Runtime
from serving.runtimes.concurrency import BatchSettings

JSON = "application/json"
NPY = "application/x-npy"


def npy(array: Any) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def torch_linear(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TorchScript 4 -> 3 linear layer with fixed weights."""
    import torch

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("torch-linear")
    torch.jit.script(torch.nn.Linear(4, 3)).save(str(folder / "model.pt"))
    return folder


def counting(runtime: Runtime) -> list[int]:
    """Record the rows of every predict call of `runtime` (an instance attribute shadows the
    method)."""
    sizes: list[int] = []
    predict = runtime.predict

    def recorded(data: Any, context: InvocationContext) -> Any:
        sizes.append(len(data) if hasattr(data, "__len__") else -1)
        return predict(data, context)

    runtime.predict = recorded  # type: ignore[method-assign]
    return sizes


async def post_all(
    app: ContainerApp, requests: list[tuple[bytes, str]], accept: str = JSON
) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://container") as client:
        return await asyncio.gather(
            *(
                client.post(
                    "/invocations", content=body, headers={"content-type": kind, "accept": accept}
                )
                for body, kind in requests
            )
        )


def answer(response: httpx.Response) -> Any:
    return response.status_code, (
        json.loads(response.content) if response.status_code == 200 else None
    )


def close(got: Any, want: Any) -> bool:
    """The same JSON answer, numbers to float32 precision (a batched matrix product may round
    differently)."""
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(close(got[k], want[k]) for k in want)
        )
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype.kind not in "fiu":
        return got.shape == want.shape and bool(np.all(got == want))
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=1e-5, atol=1e-5))


def alone(runtime: Runtime, body: bytes, kind: str, accept: str = JSON) -> tuple[int, Any]:
    """The unbatched answer: the runtime's whole invoke, as a container without Batching runs it."""
    try:
        out, _ = runtime.invoke(body, kind, accept, InvocationContext())
    except Exception:
        return 0, None
    return 200, json.loads(out)


def test_concurrent_requests_share_one_predict_call(loaded, iris_classifier, iris) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    sizes = counting(runtime)
    # The batch is cut when its 10 rows are in, not when a delay runs out: on a loaded machine the
    # four arrivals may be further apart than any short delay.
    app = build_container_app(runtime, "iris", batching=BatchSettings(10, max_delay_s=30.0))
    rows = [iris.data[i : i + n] for i, n in ((0, 1), (50, 3), (100, 2), (10, 4))]
    responses = asyncio.run(post_all(app, [(json.dumps(r.tolist()).encode(), JSON) for r in rows]))
    assert [r.status_code for r in responses] == [200] * 4
    for got, sent in zip(responses, rows):
        assert json.loads(got.content) == iris_classifier.estimator.predict(sent).tolist()
    assert sizes == [10]  # one predict_fn call for every row


def test_a_full_batch_runs_without_waiting_for_the_delay(loaded, iris_classifier, iris) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    sizes = counting(runtime)
    app = build_container_app(runtime, "iris", batching=BatchSettings(4, max_delay_s=30.0))
    started = time.monotonic()
    responses = asyncio.run(
        post_all(app, [(json.dumps(iris.data[i].tolist()).encode(), JSON) for i in range(4)])
    )
    assert [r.status_code for r in responses] == [200] * 4
    assert time.monotonic() - started < 10  # far below the 30 s delay: the batch was full
    assert sizes == [4]


def test_a_lone_request_waits_at_most_the_delay(loaded, iris_classifier, iris) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    app = build_container_app(runtime, "iris", batching=BatchSettings(64, max_delay_s=0.2))
    started = time.monotonic()
    (response,) = asyncio.run(post_all(app, [(json.dumps(iris.data[0].tolist()).encode(), JSON)]))
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    # it waited for company, then ran: delay plus model time, generously
    assert 0.15 <= elapsed < 0.2 + 3


def test_preferred_sizes_cut_the_batch(loaded, handler_dir) -> None:
    runtime = loaded("python", handler_dir(SUMS))
    sizes = counting(runtime)
    app = build_container_app(
        runtime, "sums", batching=BatchSettings(8, max_delay_s=30.0, preferred=(4,))
    )
    responses = asyncio.run(
        post_all(app, [(json.dumps([[i, 1.0]]).encode(), JSON) for i in range(8)])
    )
    assert [json.loads(r.content) for r in responses] == [[i + 1.0] for i in range(8)]
    assert sizes == [4, 4]  # cut at the preferred size each time, long before the delay


SUMS = """
    import json

    import numpy as np

    accepts_batches = True

    def input_fn(body, content_type):
        return np.asarray(json.loads(body), dtype=float)  # an array: rows the batcher can merge

    def predict_fn(data, model):
        if (data < 0).any():
            raise ValueError("negative rows are refused")
        return np.asarray(data).sum(axis=1)
"""


SLOW_SUMS = """
    import json
    import time

    import numpy as np

    accepts_batches = True

    def input_fn(body, content_type):
        return np.asarray(json.loads(body), dtype=float)

    def predict_fn(data, model):
        time.sleep(0.2)
        return data.sum(axis=1)
"""


def test_requests_arriving_while_the_model_computes_go_together_into_the_next_batch(
    loaded, handler_dir
) -> None:
    # MaxDelayMs 0 waits for nobody, yet under load batches form: the queue fills while every thread
    # is busy.
    runtime = loaded("python", handler_dir(SLOW_SUMS))
    sizes = counting(runtime)
    app = build_container_app(
        runtime, "sums", threads=1, batching=BatchSettings(16, max_delay_s=0.0)
    )
    responses = asyncio.run(
        post_all(app, [(json.dumps([[i, 1.0]]).encode(), JSON) for i in range(6)])
    )
    assert [json.loads(r.content) for r in responses] == [[i + 1.0] for i in range(6)]
    assert sum(sizes) == 6 and len(sizes) <= 3 and max(sizes) >= 3, sizes


def test_a_failing_request_in_a_batch_fails_alone(loaded, handler_dir) -> None:
    runtime = loaded("python", handler_dir(SUMS))
    sizes = counting(runtime)
    app = build_container_app(runtime, "sums", batching=BatchSettings(5, max_delay_s=30.0))
    bodies = [[[1.0, 2.0]], [[-1.0, 0.0]], [[3.0, 4.0], [5.0, 6.0]], [[7.0, 8.0]]]
    responses = asyncio.run(post_all(app, [(json.dumps(b).encode(), JSON) for b in bodies]))
    assert [r.status_code for r in responses] == [
        200,
        500,
        200,
        200,
    ]  # the container's own status; the gateway answers ModelError
    assert "negative rows are refused" in responses[1].text
    assert [json.loads(r.content) for r in (responses[0], responses[2], responses[3])] == [
        [3.0],
        [7.0, 11.0],
        [15.0],
    ]
    assert sizes[0] == 5 and sorted(sizes[1:]) == [1, 1, 1, 2]  # the batch, then each request alone


def test_a_request_that_fails_to_decode_fails_alone(loaded, iris_classifier, iris) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    sizes = counting(runtime)
    app = build_container_app(runtime, "iris", batching=BatchSettings(4, max_delay_s=30.0))
    good = json.dumps(iris.data[:2].tolist()).encode()
    responses = asyncio.run(post_all(app, [(good, JSON), (b"[[1, 2", JSON), (good, JSON)]))
    assert [r.status_code for r in responses] == [200, 400, 200]
    assert sizes == [4]


def test_small_bodies_decode_on_the_loop_large_ones_and_scripts_on_threads(
    loaded, iris_classifier, iris
) -> None:
    # A small body the stack's own decoder reads skips the hand-off to a decode thread; a large one
    # (or a user's input_fn, which may block) never runs on the event loop.
    import threading

    from serving.model_server.batching import INLINE_DECODE_BYTES

    runtime = loaded("sklearn", iris_classifier.path)
    threads: list[str] = []
    decode = runtime.decode

    def recorded(*args: Any) -> Any:
        threads.append(
            "loop" if threading.current_thread() is threading.main_thread() else "worker"
        )
        return decode(*args)

    runtime.decode = recorded  # type: ignore[method-assign]
    app = build_container_app(runtime, "iris", batching=BatchSettings(16, max_delay_s=0.01))
    small = json.dumps(iris.data[:2].tolist()).encode()
    large = json.dumps(np.tile(iris.data, (20, 1)).tolist()).encode()
    assert len(small) <= INLINE_DECODE_BYTES < len(large)
    responses = asyncio.run(post_all(app, [(small, JSON)]))
    responses += asyncio.run(post_all(app, [(large, JSON)]))
    assert [r.status_code for r in responses] == [200, 200]
    assert threads == ["loop", "worker"]
    assert len(json.loads(responses[1].content)) == 20 * len(iris.data)


def test_a_python_container_batches_only_when_it_says_so(loaded, handler_dir) -> None:
    runtime = loaded("python", handler_dir(SUMS.replace("accepts_batches = True", "")))
    sizes = counting(runtime)
    app = build_container_app(runtime, "sums", batching=BatchSettings(16, max_delay_s=0.3))
    responses = asyncio.run(
        post_all(app, [(json.dumps([[i, 1.0]]).encode(), JSON) for i in range(3)])
    )
    assert [r.status_code for r in responses] == [200] * 3
    assert sizes == [1, 1, 1]


def test_batches_are_reported_as_metric_events(loaded, iris_classifier, iris) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    events = EventLog()
    app = build_container_app(
        runtime,
        "iris",
        events=events,
        model_latency=events.model_latency,
        batching=BatchSettings(6, max_delay_s=30.0),  # cut when its 6 rows are in
    )

    async def run() -> httpx.Response:
        await post_all(
            app, [(json.dumps(iris.data[i : i + 2].tolist()).encode(), JSON) for i in range(3)]
        )
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://container"
        ) as client:
            return await client.get("/_serving/stats")

    drained = asyncio.run(run()).json()["events"]
    assert [event for event in drained if event[0] == "batch_size"] == [["batch_size", 6]]
    delays = [event[1] for event in drained if event[0] == "queue_delay"]
    assert len(delays) == 3 and all(0 <= delay < 5 for delay in delays)
    assert len([event for event in drained if event[0] == "model_latency"]) == 3


SLOW = """
    import threading
    import time

    import numpy as np

    state = {"now": 0, "most": 0}
    lock = threading.Lock()

    def predict_fn(data, model):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.15)
        with lock:
            state["now"] -= 1
        return [state["most"]]
"""


@pytest.mark.parametrize("threads", [1, 3])
def test_predictions_run_on_a_bounded_pool(loaded, handler_dir, threads: int) -> None:
    runtime = loaded("python", handler_dir(SLOW))
    app = build_container_app(runtime, "slow", threads=threads)
    responses = asyncio.run(post_all(app, [(b"[1]", JSON)] * 9))
    most = max(json.loads(r.content)[0] for r in responses)
    assert most == threads


# --- the property: whatever the mix, each caller gets exactly its own rows' predictions -----------
def _request(stack: str, rows: int, kind: str, seed: int) -> tuple[bytes, str]:
    data = np.random.default_rng(seed).uniform(0, 8, size=(rows, 4)).round(2)
    if kind == "json":
        return json.dumps(data.tolist()).encode(), JSON
    if kind == "csv":
        return "\n".join(",".join(map(str, row)) for row in data).encode(), "text/csv"
    if kind == "npy32":
        return npy(data.astype(np.float32)), NPY
    if kind == "npy64":
        return npy(data), NPY
    if kind == "narrow":  # the wrong trailing shape: fails, alone
        return json.dumps(data[:, :3].tolist()).encode(), JSON
    if kind == "instances":  # an object: cannot be merged, runs alone
        return json.dumps({"instances": data.tolist()}).encode(), JSON
    return b"\x00\x01", "application/x-unknown"


MIXES = st.lists(
    st.tuples(
        st.integers(1, 5),
        st.sampled_from(
            ["json", "json", "csv", "npy32", "npy64", "narrow", "instances", "unknown"]
        ),
        st.integers(0, 2**16),
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.frameworks
@pytest.mark.parametrize("stack", ["sklearn", "pytorch"])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mix=MIXES, max_batch=st.integers(2, 12))
def test_each_caller_gets_its_own_rows(
    stack, loaded, iris_classifier, torch_linear, mix, max_batch
) -> None:
    runtime = loaded(stack, iris_classifier.path if stack == "sklearn" else torch_linear)
    requests = [_request(stack, rows, kind, seed) for rows, kind, seed in mix]
    expected = [alone(runtime, body, kind) for body, kind in requests]
    app = build_container_app(
        runtime, stack, threads=2, batching=BatchSettings(max_batch, max_delay_s=0.02)
    )
    responses = asyncio.run(post_all(app, requests))
    for (status, want), response in zip(expected, responses):
        got_status, got = answer(response)
        assert (got_status == 200) == (status == 200), response.text
        if status == 200:
            assert close(got, want), (got, want)


def test_every_metric_event_has_a_replica_metric() -> None:
    # The supervisor replays each drained event as a ReplicaMetrics method (read without importing
    # Ray).
    import ast

    from serving.model_server.events import EVENTS

    source = Path(__file__).resolve().parents[2] / "serving" / "ray_wing" / "replica_metrics.py"
    (cls,) = [
        n
        for n in ast.parse(source.read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "ReplicaMetrics"
    ]
    methods = {node.name for node in cls.body if isinstance(node, ast.FunctionDef)}
    assert {"batch_size", "queue_delay"} <= EVENTS <= methods


@pytest.mark.parametrize(
    ("folder", "stack", "merged"),
    [
        ("hetero-iris-torchscript", "pytorch", True),
        # a script's model_fn only: the toolkit's tensors merge
        ("hetero-iris-state", "pytorch", True),
        ("hetero-onnx-iris", "onnx", True),
        ("hetero-onnx-two", "onnx", False),  # two named inputs: a plain array is refused, alone
        # NPY takes the tensor path; JSON is TF Serving's, alone
        ("hetero-tf-iris", "tensorflow", True),
    ],
)
@pytest.mark.frameworks
def test_the_framework_stacks_batch_their_own_steps(
    hetero_models, loaded, folder, stack, merged
) -> None:
    runtime = loaded(stack, hetero_models / folder)
    sizes = counting(runtime)
    rows = np.random.default_rng(7).uniform(0.1, 7.9, size=(6, 4)).astype(np.float32)
    requests = [
        (npy(rows[0:1]), NPY),
        (npy(rows[1:3]), NPY),
        (npy(rows[3:6]), NPY),
        (json.dumps(rows[:2].tolist()).encode(), JSON),
    ]
    expected = [alone(runtime, body, kind) for body, kind in requests]
    sizes.clear()
    # the NPY rows (6) fill a batch at once; the JSON request waits out the delay alone
    app = build_container_app(runtime, stack, threads=2, batching=BatchSettings(6, max_delay_s=1.0))
    responses = asyncio.run(post_all(app, requests))
    for (status, want), response in zip(expected, responses):
        assert response.status_code == (200 if status == 200 else 500), response.text
        if status == 200:
            assert close(json.loads(response.content), want)
    assert (6 in sizes) == merged, sizes


@pytest.mark.frameworks
def test_xgboost_requests_run_alone_and_answer_as_without_batching(tmp_path) -> None:
    # Its input_fn gives a DMatrix, which has no rows to merge: each request runs as it always did.
    from serving.runtimes import runtime_for
    from tests.unit.test_xgboost_stack import save_algorithm_model, train_booster

    booster, x = train_booster("binary")
    runtime = runtime_for("xgboost", save_algorithm_model(tmp_path / "xgb", booster), {})
    runtime.load()
    sizes = counting(runtime)
    requests = [
        ("\n".join(",".join(map(str, row)) for row in x[i : i + n]).encode(), "text/csv")
        for i, n in ((0, 1), (5, 3))
    ]
    expected = [alone(runtime, body, kind) for body, kind in requests]
    sizes.clear()
    app = build_container_app(
        runtime, "xgb", threads=2, batching=BatchSettings(16, max_delay_s=0.2)
    )
    responses = asyncio.run(post_all(app, requests))
    assert [answer(r) for r in responses] == expected
    assert len(sizes) == 2


@pytest.mark.frameworks
def test_a_script_with_request_hooks_is_not_assumed_thread_safe(
    loaded, handler_dir, torch_linear
) -> None:
    # What the container process passes as `scripted` to model_threads
    # (serving/model_server/main.py).
    assert not loaded("pytorch", torch_linear).runs_request_hooks()
    loader = """
        import torch

        def model_fn(model_dir):
            return torch.jit.load(model_dir + "/model.pt")

        def autoscaling_metrics(model):
            return {}
    """
    weights = (torch_linear / "model.pt").read_bytes()
    assert not loaded("pytorch", handler_dir(loader, {"model.pt": weights})).runs_request_hooks()
    assert loaded("python", handler_dir(SUMS)).runs_request_hooks()
