"""How a container process runs its model for a request: one strategy, chosen once when the process
starts.

- `Threaded`: on one of the model's threads (at most `threads` predictions at a time), never on the
  event loop, so that a handler may call back into this server (the tensorflow stack's
  `context.rest_uri`).
- `Inline`: as `Threaded`, but a prediction runs on the event loop itself while the model stays fast
  enough (`inline.InlineGate`): for a model of a fraction of a millisecond the hand-off to a thread
  costs more than it.
- `Batched`: concurrent requests' rows merged into one `predict_fn` call (`batching.Batcher`); what
  cannot be merged runs as it would without batching.
- `MultiModel`: the request's TargetModel loaded (or found loaded) and run by its own runtime.

Each runs a whole answer (`predict`) and a streamed one (`stream`: InvokeEndpointWithResponseStream)
the same way: a stream holds one of the model's threads and is timed until its last chunk, as a
prediction is until its answer. `choose` picks one; the data port's app (`app.ContainerApp`) calls
`predict` and `stream` and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import anyio.to_thread
from anyio import CapacityLimiter

from serving.model_server.batching import Batcher
from serving.model_server.events import EventLog
from serving.model_server.inline import GC_CLOCK, InlineGate, RunQueueClock, loop_hidden
from serving.models.multimodel import MultiModelHandler
from serving.runtimes import InvocationContext, Runtime
from serving.runtimes.concurrency import BatchSettings

__all__ = ["Batched", "Inline", "MultiModel", "Predictor", "Stream", "Threaded", "choose"]

Answer = tuple[bytes, str]


@dataclass
class Stream:
    """A streamed answer: its chunks (made as they are read), its content type, and what its end
    releases."""

    chunks: Iterator[bytes]
    content_type: str
    _release: Callable[[], None] = field(default=lambda: None, repr=False)
    _ended: bool = field(default=False, repr=False)

    def end(self) -> None:
        """The stream is over, however it ended (called once or more): free its model thread, report
        its time."""
        if not self._ended:
            self._ended = True
            self._release()


class Predictor(Protocol):
    """Runs the model on one request's body: the answer's bytes and content type."""

    gate: InlineGate | None  # set by `Inline` only (its counters go to the replica's stats)

    async def predict(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Answer: ...

    async def stream(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Stream: ...


class Threaded:
    """The runtime's whole invocation on one of `threads` model threads, its time reported to
    `model_latency`."""

    gate: InlineGate | None = None

    def __init__(
        self, runtime: Runtime, threads: int, model_latency: Callable[[float], None] | None
    ) -> None:
        self.runtime = runtime
        self.threads = threads
        self.model_latency = model_latency
        self._limiter: CapacityLimiter | None = None  # made on first use: it needs the event loop

    def limiter(self) -> CapacityLimiter:
        if self._limiter is None:
            self._limiter = CapacityLimiter(self.threads)
        return self._limiter

    async def run(self, call: Callable[[], Any]) -> Any:
        """`call` on one of the model's threads (waiting for one to be free)."""
        return await anyio.to_thread.run_sync(call, limiter=self.limiter())

    async def predict(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Answer:
        return await self.run(
            partial(self.timed, partial(self.runtime.invoke, body, content_type, accept, context))
        )

    async def stream(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Stream:
        """The runtime's chunks, holding one of the model's threads (a token of its limiter) until
        the stream ends, and timed from the call to its last chunk."""
        limiter, holder = self.limiter(), object()
        await limiter.acquire_on_behalf_of(holder)
        started = time.perf_counter()
        try:
            # The handler's own code until its first `yield` (the chunks themselves are pumped on a
            # thread of the stream's: model_server.streaming); on a thread, not the loop, as a
            # prediction.
            call = partial(self.runtime.invoke_chunks, body, content_type, accept, context)
            chunks, out_type = await anyio.to_thread.run_sync(call)
        except BaseException:
            limiter.release_on_behalf_of(holder)
            raise

        def release() -> None:
            limiter.release_on_behalf_of(holder)
            if self.model_latency is not None:  # the model's time, to its last chunk
                self.model_latency(time.perf_counter() - started)

        return Stream(chunks, out_type, release)

    def timed(self, call: Callable[[], Answer]) -> Answer:
        """Run the model on this thread, reporting its time (not the wait for a thread); a failure
        reports none."""
        started = time.perf_counter()
        answer = call()
        if self.model_latency is not None:
            self.model_latency(time.perf_counter() - started)
        return answer


class Inline(Threaded):
    """On the event loop while the gate is open, else on a model thread. One model-thread token
    bounds both: a prediction runs on the loop at once when no prediction holds it, or else waits
    for it in line with the thread's requests (under steady load there always is one waiting, and a
    fast model must not be sent back to the thread for that alone)."""

    def __init__(
        self, runtime: Runtime, budget_s: float, model_latency: Callable[[float], None] | None
    ) -> None:
        super().__init__(runtime, 1, model_latency)
        self.gate = InlineGate(budget_s)
        self._run_queue = RunQueueClock()
        GC_CLOCK.install()

    async def predict(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Answer:
        call = partial(self.runtime.invoke, body, content_type, accept, context)
        gate = self.gate
        assert gate is not None
        if gate.open:
            limiter = self.limiter()
            # nothing else can run until this returns: no token needed
            if limiter.borrowed_tokens == 0:
                gate.inline += 1
                return self.timed(call, on_loop=True)
            async with limiter:
                if gate.open:  # still, once it is this request's turn
                    gate.inline += 1
                    return self.timed(call, on_loop=True)
                # this request holds the token
                return await anyio.to_thread.run_sync(partial(self.timed, call))
        return await self.run(partial(self.timed, call))

    def timed(self, call: Callable[[], Answer], on_loop: bool = False) -> Answer:
        """Run the model on this thread, reporting its time and what it cost the gate: its CPU, less
        a collection it set off, and, `on_loop`, the time it spent waiting for anything but a core
        (`model_server.inline`)."""
        gate = self.gate
        assert gate is not None
        started, computed, collected = time.perf_counter(), time.thread_time(), GC_CLOCK()
        queued = self._run_queue() if on_loop else 0.0
        try:
            if on_loop:
                with loop_hidden():
                    answer = call()
            else:
                answer = call()
        finally:  # a slow failure closes the gate as a slow answer does
            cpu = time.thread_time() - computed
            waited = time.perf_counter() - started - cpu if on_loop else None
            # only then ask how long it waited for a core
            if waited is not None and waited > gate.budget_s:
                waited -= self._run_queue() - queued
            # a collection it triggered is not its time
            gate.record(cpu - (GC_CLOCK() - collected), waited)
        if self.model_latency is not None:
            self.model_latency(time.perf_counter() - started)
        return answer


class Batched:
    """Requests whose rows can be merged go through the batcher; the rest run as `alone` runs
    them."""

    def __init__(self, batcher: Batcher, alone: Threaded) -> None:
        self.batcher, self.alone = batcher, alone
        self.gate = alone.gate

    async def predict(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Answer:
        if self.batcher.wants(content_type):
            return await self.batcher.invoke(body, content_type, accept, context)
        return await self.alone.predict(body, content_type, accept, context)

    async def stream(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Stream:
        """A stream is never merged with others: it runs as it would without batching."""
        return await self.alone.stream(body, content_type, accept, context)


class MultiModel:
    """The MultiModel handler: it loads the request's model (reporting the model's own time, not the
    load)."""

    gate: InlineGate | None = None

    def __init__(self, models: MultiModelHandler) -> None:
        self.models = models

    async def predict(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Answer:
        return await self.models.ainvoke(body, content_type, accept, context)

    async def stream(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Stream:
        """The request's model's whole answer, as the stream's one part."""
        out, out_type = await self.models.ainvoke(body, content_type, accept, context)
        return Stream(iter((out,)), out_type)


def choose(
    runtime: Runtime | None = None,
    models: MultiModelHandler | None = None,
    *,
    threads: int = 1,
    batching: BatchSettings | None = None,
    inline_budget_s: float = 0.0,
    model_latency: Callable[[float], None] | None = None,
    events: EventLog | None = None,
) -> Predictor:
    """The strategy for a SingleModel `runtime` (or MultiModel `models`): batching when asked for;
    on the event loop only for a model that runs one prediction at a time anyway and no handler
    calling back into this server; else threads. A user's request hooks run on the loop as the
    stack's own steps do: the gate sends one that blocks back to the thread, and the loop is hidden
    from one that runs asyncio itself (`inline.loop_hidden`)."""
    if models is not None:
        return MultiModel(models)
    assert runtime is not None, "give a runtime (SingleModel) or models (MultiModel)"
    calls_back = hasattr(runtime, "rest_call")  # the tensorflow stack's context.rest_uri
    alone: Threaded
    if threads == 1 and inline_budget_s > 0 and not calls_back:
        alone = Inline(runtime, inline_budget_s, model_latency)
    else:
        alone = Threaded(runtime, threads, model_latency)
    if batching is None:
        return alone
    batcher = Batcher(
        runtime, batching, alone.run, observer=events, model_latency=model_latency, threads=threads
    )
    return Batched(batcher, alone)
