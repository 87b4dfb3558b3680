"""A streamed answer takes the predictor's path (serving/model_server/predictors.py): the same limiter and timing as
a whole answer, whichever strategy the container runs, MultiModel included."""

from __future__ import annotations

import asyncio

import pytest

from serving.model_server import predictors
from serving.runtimes import InvocationContext


class Model:
    """Stands for a runtime: `invoke` answers at once, `invoke_chunks` yields two chunks (or fails first)."""

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
        waiting = asyncio.create_task(threaded.predict(b"{}", "application/json", None, InvocationContext()))
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
    assert list(stream.chunks) == [b"answer of m1.tar.gz"] and stream.content_type == "application/json"
    stream.end()
