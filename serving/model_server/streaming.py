"""A container's streamed answer (a hop carrying `protocol.HOP_STREAM_HEADER`): the model's chunks
as events.

The runtime's `invoke_chunks` gives an iterator of byte chunks (a `predict_fn`/`output_fn` that
returns a generator yields several, any other handler one). One worker thread per stream runs it,
since the model's code blocks, and hands chunks to the event loop with at most `DEPTH` waiting, so a
slow reader slows the model instead of filling memory. Nothing is answered until the first chunk
exists: an error before it is an ordinary error answer (`ContainerApp` answers it); after it, a
`ModelStreamError` event ends the stream. A caller that goes away stops the generator: the thread
closes it after the chunk it is computing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from serving import protocol
from serving.errors import ContainerError
from serving.http import eventstream

logger = logging.getLogger("serving.container")

DEPTH = 4  # chunks computed ahead of what the connection has taken
_PART, _END, _FAILED = "part", "end", "failed"


class ChunkPump:
    """Iterates a model's chunks on a worker thread of its own; `get()` returns them in order on the
    event loop."""

    def __init__(
        self, chunks: Iterator[bytes], loop: asyncio.AbstractEventLoop, hostname: str
    ) -> None:
        self._chunks = chunks
        self._loop = loop
        self._hostname = hostname
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._room = threading.Semaphore(DEPTH)
        self._stopped = threading.Event()
        threading.Thread(target=self._run, name=f"stream-{hostname}", daemon=True).start()

    def _put(self, item: tuple[str, Any]) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is gone (the server stopped): nobody is reading
            self._stopped.set()

    def _run(self) -> None:
        iterator = iter(self._chunks)
        try:
            while not self._stopped.is_set():
                while not self._room.acquire(timeout=0.5):
                    if self._stopped.is_set():
                        return
                if self._stopped.is_set():
                    return
                try:
                    chunk = next(iterator)  # the model's code
                except StopIteration:
                    self._put((_END, None))
                    return
                self._put((_PART, _as_bytes(chunk)))
        except Exception as error:
            logger.exception("container %s: the model's stream failed", self._hostname)
            self._put((_FAILED, ContainerError.of(error)))
        finally:
            close = getattr(iterator, "close", None)
            if close is not None and self._stopped.is_set():
                try:
                    close()  # GeneratorExit in the model's generator: its `finally` runs
                except Exception:
                    logger.exception(
                        "container %s: closing the model's stream failed", self._hostname
                    )

    async def get(self) -> tuple[str, Any]:
        item = await self._queue.get()
        self._room.release()
        return item

    def stop(self) -> None:
        self._stopped.set()
        self._room.release()  # wake the thread if it waits for room


def _as_bytes(chunk: Any) -> bytes:
    if isinstance(chunk, str):
        return chunk.encode()
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        return bytes(chunk)
    raise TypeError(f"a streamed chunk must be bytes or str, got {type(chunk).__name__}")


async def stream_answer(
    chunks: Iterator[bytes],
    content_type: str,
    headers: dict[str, str],
    hostname: str,
    done: Callable[[], None],
) -> Response:
    """The streamed answer, once the first chunk exists (raises what the model raised before it).

    `done()` is called once the stream that this returns has ended, however it ended.
    """
    pump = ChunkPump(chunks, asyncio.get_running_loop(), hostname)
    try:
        kind, value = await pump.get()
    except BaseException:
        pump.stop()
        raise
    if kind == _FAILED:
        pump.stop()
        raise value
    finished = False

    def finish() -> None:
        nonlocal finished
        if not finished:
            finished = True
            pump.stop()
            done()

    async def events() -> AsyncIterator[bytes]:
        try:
            item = (kind, value)
            while item[0] == _PART:
                for message in eventstream.payload_parts(item[1]):
                    yield message
                item = await pump.get()
            if item[0] == _FAILED:
                error: ContainerError = item[1]
                yield eventstream.model_stream_error(protocol.ErrorCode.MODEL_ERROR, error.message)
        finally:
            finish()

    return StreamingResponse(
        events(),
        media_type=protocol.EVENT_STREAM,
        headers={**headers, protocol.STREAM_CONTENT_TYPE: content_type},
        background=BackgroundTask(finish),
    )
