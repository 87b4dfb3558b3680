"""Dynamic batching in a container process: concurrent requests' rows merged into one `predict_fn`
call.

Each request is decoded and encoded alone; rows that can merge (same content type, Accept, array
type, trailing shape, dtype and device) wait in a queue per kind, and a batch runs when it is full,
at a preferred size or after the delay, once a model thread is free, as on Triton. A batch whose
`predict_fn` raises, or whose answer cannot be split by rows, runs again request by request, so one
bad row fails only its own request. The rules users see: docs/spec.md, `Batching`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

import anyio.to_thread
import numpy as np
from anyio import CapacityLimiter

from serving.runtimes import InvocationContext, Runtime
from serving.runtimes.codecs import media_type
from serving.runtimes.concurrency import BatchSettings

logger = logging.getLogger("serving.container")

T = TypeVar("T")
# runs a call on a model thread (bounded by the replica's pool)
Run = Callable[[Callable[[], T]], Awaitable[T]]
Answer = tuple[bytes, str]
# Bodies up to this size, read by the stack's own decoder (no user input_fn), are decoded on the
# event loop: a 1-row JSON request decodes in ~0.1 ms, less than the round trip to a decode thread,
# and a batch's requests then reach the model with one thread hand-off per batch instead of one per
# request and one per batch.
INLINE_DECODE_BYTES = 16 * 1024


class BatchObserver(Protocol):
    """Where the batcher reports its batches (the container's EventLog)."""

    def batch_size(self, rows: int) -> None: ...
    def queue_delay(self, seconds: float) -> None: ...


class UnsplittableError(ValueError):
    """The merged prediction has no batch axis of the batch's row count."""


@dataclass(eq=False)
class _Request:
    data: Any
    rows: Any
    count: int
    accept: str
    context: InvocationContext
    decode_s: float
    future: asyncio.Future[Answer]
    arrived: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _Queue:
    requests: list[_Request] = field(default_factory=list)
    rows: int = 0
    timer: asyncio.TimerHandle | None = None


def batch_key(content_type: str | None, accept: str, rows: Any) -> tuple[Any, ...]:
    """What requests must share to be merged."""
    kind = "numpy" if isinstance(rows, np.ndarray) else type(rows).__module__.split(".")[0]
    return (
        media_type(content_type),
        accept,
        kind,
        tuple(rows.shape[1:]),
        str(rows.dtype),
        str(getattr(rows, "device", "")),
    )


def merge(rows: list[Any]) -> Any:
    """The requests' rows along the first axis."""
    if len(rows) == 1:
        return rows[0]
    if isinstance(rows[0], np.ndarray):
        return np.concatenate(rows)
    import torch  # only a torch tensor gets here, so torch is loaded

    return torch.cat(rows)


def split(prediction: Any, counts: list[int]) -> list[Any]:
    """The merged prediction back per request, by row counts: an array, tensor or list with one
    entry per row, or a dict of those (a model with several outputs)."""
    total = sum(counts)
    if isinstance(prediction, dict):
        columns = {name: split(value, counts) for name, value in prediction.items()}
        return [{name: parts[i] for name, parts in columns.items()} for i in range(len(counts))]
    shape = getattr(prediction, "shape", None)
    length = (
        shape[0]
        if shape is not None and len(shape)
        else len(prediction)
        if isinstance(prediction, list)
        else None
    )
    if length != total:
        raise UnsplittableError(f"the prediction has no batch axis of {total} rows")
    bounds = np.cumsum([0, *counts])
    return [prediction[int(start) : int(end)] for start, end in zip(bounds[:-1], bounds[1:])]


class Batcher:
    """Queues a replica's mergeable requests and runs them as batches on its model threads."""

    def __init__(
        self,
        runtime: Runtime,
        settings: BatchSettings,
        run: Run,
        observer: BatchObserver | None = None,
        model_latency: Callable[[float], None] | None = None,
        threads: int = 1,
    ) -> None:
        """`run(call)`: `call` on a model thread. `threads`: how many batches may run at once (the
        replica's model threads). `model_latency(seconds)`: each request's model time (its decode,
        its batch's predict_fn, its encode)."""
        self.runtime = runtime
        # A user's input_fn may block: only the stack's own decoder runs on the event loop (the
        # runtime is loaded).
        self._inline_decode = not runtime.runs_request_hooks()
        self.slots = threads
        # Decoding runs beside the model, so that requests arriving while every model thread
        # computes are decoded and queued, and go together into the next batch when a thread is free
        # (created on first use).
        self._decode_limiter: CapacityLimiter | None = None
        self.model_latency = model_latency
        self.settings = settings
        self.run = run
        self.observer = observer
        self._queues: dict[tuple[Any, ...], _Queue] = {}
        # batches on model threads (the loop keeps weak references)
        self._running: set[asyncio.Task[None]] = set()

    def wants(self, content_type: str | None) -> bool:
        """Whether a request of this type may be batched at all (else the caller runs it as
        before)."""
        return self.runtime.accepts_batches() and self.runtime.batchable(content_type)

    async def invoke(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> Answer:
        """One request's answer, its rows predicted with others' when they arrive together."""
        decode = partial(self._decode, body, content_type, accept, context)
        if self._inline_decode and len(body) <= INLINE_DECODE_BYTES:
            decoded = decode()
        else:
            if self._decode_limiter is None:
                self._decode_limiter = CapacityLimiter(max(2, self.slots))
            decoded = await anyio.to_thread.run_sync(decode, limiter=self._decode_limiter)
        data, chosen, rows, decode_s = decoded
        if rows is None:  # cannot be merged: the rest of the request runs alone
            return await self.run(lambda: self._alone(data, chosen, context, decode_s))
        request = _Request(
            data,
            rows,
            int(rows.shape[0]),
            chosen,
            context,
            decode_s,
            asyncio.get_running_loop().create_future(),
        )
        key = batch_key(content_type, chosen, rows)
        queue = self._queues.setdefault(key, _Queue())
        queue.requests.append(request)
        queue.rows += request.count
        self._cut(key)
        return await request.future

    # --- on the event loop ------------------------------------------------------------------------
    def _due(self, queue: _Queue) -> bool:
        settings = self.settings
        if queue.rows >= settings.max_batch_size:
            return True
        if settings.preferred and queue.rows >= settings.preferred[-1]:
            return True
        return time.monotonic() - queue.requests[0].arrived >= settings.max_delay_s

    def _take(self, queue: _Queue) -> int:
        """How many requests from the front of the queue form the next batch."""
        taken = total = best = 0
        for request in queue.requests:
            if taken and total + request.count > self.settings.max_batch_size:
                break
            taken += 1
            total += request.count
            if total in self.settings.preferred:
                best = taken
        return best or taken

    def _cut(self, key: tuple[Any, ...]) -> None:
        """Start every batch that is due in this queue while a model thread is free; wake up for the
        rest when its first request has waited long enough, or when a running batch ends."""
        queue = self._queues.get(key)
        if queue is None:
            return
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        while queue.requests and len(self._running) < self.slots and self._due(queue):
            count = self._take(queue)
            batch, queue.requests = queue.requests[:count], queue.requests[count:]
            queue.rows -= sum(request.count for request in batch)
            task = asyncio.ensure_future(self._execute(batch))
            self._running.add(task)
            task.add_done_callback(self._finished)
        if not queue.requests:
            del self._queues[key]
        elif len(self._running) < self.slots:  # not due yet (else a running batch's end cuts it)
            wait = queue.requests[0].arrived + self.settings.max_delay_s - time.monotonic()
            queue.timer = asyncio.get_running_loop().call_later(max(0.0, wait), self._cut, key)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        for key in list(self._queues):  # a model thread is free: what waited for one goes now
            self._cut(key)

    async def _execute(self, batch: list[_Request]) -> None:
        try:
            answers: list[Answer | Exception] = await self.run(lambda: self._predict_batch(batch))
        except Exception as error:  # the pool itself failed: every caller hears of it
            answers = [error] * len(batch)
        except BaseException:
            for request in batch:
                request.future.cancel()
            raise
        for request, answer in zip(batch, answers):
            if request.future.done():  # its caller went away
                continue
            if isinstance(answer, Exception):
                request.future.set_exception(answer)
            else:
                request.future.set_result(answer)

    # --- on a model thread ------------------------------------------------------------------------
    def _decode(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ):
        started, started_ns = time.perf_counter(), time.time_ns()
        data, chosen = self.runtime.decode(body, content_type, accept, context)
        context.step("decode", started_ns)
        return data, chosen, self.runtime.batch_rows(data), time.perf_counter() - started

    def _alone(self, data: Any, accept: str, context: InvocationContext, spent_s: float) -> Answer:
        started, started_ns = time.perf_counter(), time.time_ns()
        prediction = self.runtime.predict(data, context)
        context.step("predict", started_ns)
        encoding = time.time_ns()
        answer = self.runtime.encode(prediction, accept, context)
        context.step("encode", encoding)
        self._latency(spent_s + time.perf_counter() - started)
        return answer

    def _predict_batch(self, batch: list[_Request]) -> list[Answer | Exception]:
        started = time.monotonic()
        if self.observer is not None:
            self.observer.batch_size(sum(request.count for request in batch))
            for request in batch:
                self.observer.queue_delay(started - request.arrived)
        _traced_wait(batch)
        if len(batch) == 1:
            return [self._guarded(partial(self._request_alone, batch[0]))]
        clock, clock_ns = time.perf_counter(), time.time_ns()
        try:
            # The batch's predict_fn sees the first request's context (documented: per-request state
            # belongs in input_fn / output_fn).
            prediction = self.runtime.predict(
                merge([request.rows for request in batch]), batch[0].context
            )
            parts = split(prediction, [request.count for request in batch])
        except Exception as error:  # one request may be at fault: each runs alone and fails alone
            logger.info(
                "a batch of %d requests failed (%s): running each alone",
                len(batch),
                type(error).__name__,
            )
            return [self._guarded(partial(self._request_alone, request)) for request in batch]
        predict_s = time.perf_counter() - clock
        for request in batch:
            request.context.step("predict", clock_ns)
            request.context.batch_size = len(batch)
        return [
            self._guarded(partial(self._encode, request, part, predict_s))
            for request, part in zip(batch, parts)
        ]

    def _request_alone(self, request: _Request) -> Answer:
        return self._alone(request.data, request.accept, request.context, request.decode_s)

    def _encode(self, request: _Request, part: Any, predict_s: float) -> Answer:
        started, started_ns = time.perf_counter(), time.time_ns()
        answer = self.runtime.encode(part, request.accept, request.context)
        request.context.step("encode", started_ns)
        self._latency(request.decode_s + predict_s + time.perf_counter() - started)
        return answer

    def _latency(self, seconds: float) -> None:
        if self.model_latency is not None:  # a failed invocation reports none, as without batching
            self.model_latency(seconds)

    @staticmethod
    def _guarded(call: Callable[[], Answer]) -> Answer | Exception:
        try:
            return call()
        except Exception as error:
            return error


def _traced_wait(batch: list[_Request]) -> None:
    """A traced request's wait for its batch: from its decode's end until the batch runs."""
    for request in batch:
        steps = request.context.steps
        if steps:
            request.context.step("queue", steps[-1][2])


__all__ = ["BatchObserver", "Batcher", "UnsplittableError", "batch_key", "merge", "split"]
