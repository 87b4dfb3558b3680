"""A streamed answer takes the predictor's path (serving/model_server/predictors.py): the same
limiter and timing as a whole answer, whichever strategy the container runs, MultiModel included;
and so it does through the data port (`build_container_app`, as the container process builds it)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from botocore.eventstream import EventStreamBuffer

from serving import protocol
from serving.http.server import BackgroundServer
from serving.model_server import predictors
from serving.model_server.app import ContainerApp, build_container_app
from serving.models.multimodel import MultiModelHandler
from serving.runtimes import InvocationContext, runtime_for
from serving.runtimes.concurrency import BatchSettings

# A whole answer echoes its document; {"stream": true} streams two chunks (each JSON, as the default
# output_fn encodes it), the second once the test sets the model's "go" (so the stream stays open as
# long as the test needs).
GATED_HANDLER = """
import json, threading

def model_fn(model_dir):
    return {"go": threading.Event()}

def input_fn(body, content_type):
    return json.loads(body)

def predict_fn(data, model):
    if not data.get("stream"):
        return data
    def chunks():
        yield "first"
        model["go"].wait(30)
        yield "last"
    return chunks()
"""

ECHO_HANDLER = """
import json

def input_fn(body, content_type):
    return json.loads(body)

def predict_fn(data, model):
    return data

def output_fn(prediction, accept):
    return json.dumps({"echo": prediction}), "application/json"
"""


class Model:
    """Stands for a runtime: `invoke` answers at once, `invoke_chunks` yields two chunks (or fails
    first)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def invoke(self, body, content_type, accept, context):
        return b"whole", "application/json"

    def invoke_chunks(self, body, content_type, accept, context):
        if self.fail:
            raise ValueError("the model failed before its first chunk")
        return iter((b"a", b"b")), "text/plain"

    def runs_request_hooks(self) -> bool:
        return False


def test_a_stream_holds_a_model_thread_until_it_ends() -> None:
    latencies: list[float] = []
    threaded = predictors.Threaded(Model(), threads=1, model_latency=latencies.append)

    async def main() -> None:
        stream = await threaded.stream(b"{}", "application/json", None, InvocationContext())
        assert list(stream.chunks) == [b"a", b"b"] and stream.content_type == "text/plain"
        waiting = asyncio.create_task(
            threaded.predict(b"{}", "application/json", None, InvocationContext())
        )
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the one model thread is the stream's until it ends
        assert latencies == []  # timed to its end, not to its first chunk
        stream.end()
        stream.end()  # a second end (the stream's and its background task's) frees nothing more
        assert await asyncio.wait_for(waiting, 10) == (b"whole", "application/json")
        assert threaded.limiter().borrowed_tokens == 0

    asyncio.run(main())
    assert len(latencies) == 2  # the stream's, then the prediction's


def test_a_stream_that_fails_before_its_first_chunk_frees_its_thread() -> None:
    threaded = predictors.Threaded(Model(fail=True), threads=1, model_latency=None)

    async def main() -> None:
        with pytest.raises(ValueError, match="before its first chunk"):
            await threaded.stream(b"{}", None, None, InvocationContext())
        assert threaded.limiter().borrowed_tokens == 0

    asyncio.run(main())


def test_every_strategy_streams_through_the_same_path() -> None:
    inline = predictors.choose(Model(), threads=1, inline_budget_s=0.005)
    assert isinstance(inline, predictors.Inline)

    async def main() -> None:
        stream = await inline.stream(b"{}", None, None, InvocationContext())
        assert inline.limiter().borrowed_tokens == 1  # the token inline predictions share
        stream.end()
        assert inline.limiter().borrowed_tokens == 0

    asyncio.run(main())


def test_a_multi_model_container_streams_its_whole_answer_as_one_part() -> None:
    class Models:
        async def ainvoke(self, body, content_type, accept, context):
            return b"answer of " + context.target_model.encode(), "application/json"

    context = InvocationContext()
    context.target_model = "m1.tar.gz"

    async def main() -> predictors.Stream:
        return await predictors.MultiModel(Models()).stream(b"{}", None, None, context)  # type: ignore[arg-type]

    stream = asyncio.run(main())
    assert (
        list(stream.chunks) == [b"answer of m1.tar.gz"]
        and stream.content_type == "application/json"
    )
    stream.end()


def test_a_batched_container_streams_unmerged_on_its_model_thread() -> None:
    batched = predictors.choose(Model(), threads=1, batching=BatchSettings(4, max_delay_s=0.01))
    assert isinstance(batched, predictors.Batched) and isinstance(
        batched.alone, predictors.Threaded
    )

    async def main() -> None:
        stream = await batched.stream(b"{}", "application/json", None, InvocationContext())
        assert list(stream.chunks) == [b"a", b"b"]
        # the token batches and lone requests run under
        assert batched.alone.limiter().borrowed_tokens == 1
        stream.end()
        assert batched.alone.limiter().borrowed_tokens == 0

    asyncio.run(main())


@contextmanager
def serve(app: ContainerApp) -> Iterator[str]:
    server = BackgroundServer(app, "127.0.0.1", 0)
    assert server.wait_started(), "the data port did not start"
    try:
        yield server.url
    finally:
        server.stop()


def payloads(raw: Iterator[bytes]) -> Iterator[bytes]:
    """The PayloadPart events' bytes of a container's event stream, as they arrive."""
    buffer = EventStreamBuffer()
    for data in raw:
        buffer.add_data(data)
        for message in buffer:
            assert message.headers[":event-type"] == "PayloadPart", message.headers
            yield message.payload


def hop(document: dict, stream: bool, **headers: str) -> dict:
    headers = {"content-type": "application/json", "accept": "application/json", **headers}
    if stream:
        headers[protocol.HOP_STREAM_HEADER] = "true"
    return {"content": json.dumps(document).encode(), "headers": headers, "timeout": 30}


def settle(app: ContainerApp) -> None:
    """Wait for the data port to finish with the requests it answered (a stream's end runs after its
    last byte)."""
    deadline = time.monotonic() + 10
    while app.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert app.in_flight == 0


def test_through_the_data_port_a_stream_holds_the_model_thread_a_whole_answer_waits_for(
    tmp_path: Path,
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(GATED_HANDLER)
    runtime = runtime_for("python", tmp_path, {})
    runtime.load()
    latencies: list[float] = []
    app = build_container_app(runtime, "gated", threads=1, model_latency=latencies.append)
    assert isinstance(app.predictor, predictors.Threaded)
    with serve(app) as url, httpx.Client(base_url=url) as client, ThreadPoolExecutor(1) as pool:
        request = hop({"stream": True}, stream=True)
        with client.stream("POST", protocol.INVOCATIONS_PATH, **request) as streamed:
            assert streamed.status_code == 200
            parts = payloads(streamed.iter_raw())
            assert json.loads(next(parts)) == "first"  # the stream is open, its model thread held
            whole = pool.submit(
                client.post, protocol.INVOCATIONS_PATH, **hop({"row": 1}, stream=False)
            )
            time.sleep(0.3)
            assert not whole.done()  # the one model thread is the stream's until its last chunk
            assert app.predictor.limiter().borrowed_tokens == 1
            assert latencies == []  # a stream is timed to its last chunk, not its first
            runtime.model["go"].set()
            assert [json.loads(part) for part in parts] == ["last"]
        answer = whole.result(timeout=30)
        assert answer.status_code == 200 and answer.json() == {"row": 1}
        settle(app)
    assert app.predictor.limiter().borrowed_tokens == 0
    # the stream's (its wait included), then the answer's
    assert len(latencies) == 2 and latencies[0] >= 0.3
    assert app.invocations == 2


def test_through_the_data_port_a_multimodel_stream_is_its_models_timed_answer(
    tmp_path: Path,
) -> None:
    (tmp_path / "echo" / "code").mkdir(parents=True)
    (tmp_path / "echo" / "code" / "inference.py").write_text(ECHO_HANDLER)
    latencies: list[float] = []
    handler = MultiModelHandler(
        "python", str(tmp_path), {}, hostname="mm", model_latency=latencies.append
    )
    app = build_container_app(None, "mm", models=handler)
    assert isinstance(app.predictor, predictors.MultiModel)
    target = {protocol.TARGET_MODEL: "echo"}
    try:
        with serve(app) as url, httpx.Client(base_url=url) as client:
            with client.stream(
                "POST", protocol.INVOCATIONS_PATH, **hop({"row": 1}, True, **target)
            ) as streamed:
                assert streamed.status_code == 200
                assert streamed.headers[protocol.MODEL_RESOLVED] == "true"
                assert [json.loads(part) for part in payloads(streamed.iter_raw())] == [
                    {"echo": {"row": 1}}
                ]
            whole = client.post(protocol.INVOCATIONS_PATH, **hop({"row": 1}, False, **target))
            assert whole.status_code == 200 and whole.json() == {"echo": {"row": 1}}
            unknown = client.post(
                protocol.INVOCATIONS_PATH, **hop({}, True, **{protocol.TARGET_MODEL: "none"})
            )
            assert unknown.status_code == 400 and unknown.headers[protocol.PLATFORM_ERROR] == "true"
            settle(app)
        # the stream's model time and the whole answer's, each without the load
        assert len(latencies) == 2
    finally:
        handler.close()
