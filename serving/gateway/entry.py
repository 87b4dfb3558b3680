"""One frame for every way into an invocation: its clock, its trace, its outcome and its count.

InvokeEndpoint and its response stream, InvokeEndpointAsync (its admission and each run), the Open
Inference Protocol over REST and gRPC, and a shadow variant's copy all run inside
`invocation_frame`. The frame catches what the work raises and makes it one outcome: a
`ServingError` as it is, a caller who left (counted as such, never as a failure), anything else a
bug of ours (logged, and `InternalFailure`). Then it counts the invocation once
(`metrics.invocations`), unless the answer is a stream, whose end counts it (`Frame.defer`). With
tracing on, the frame also holds the invocation's root span (`Frame.span`, `tracing.spans`): the
current span while the work runs, joined to the caller's `traceparent` in `carrier`, ended with the
count. Each
transport only turns the outcome into its own wire: a response, a gRPC status, a failure object in
S3. A change to how a request is timed, counted or mapped to an error is made here, for all of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from serving.errors import InternalFailureError, ServingError
from serving.metrics.invocations import InvocationTrace, record_client_abort, record_invocation
from serving.tracing import spans as tracing

if TYPE_CHECKING:
    from serving.tracing.otel_sdk import InvocationSpan

__all__ = ["Frame", "invocation_frame"]

logger = logging.getLogger("serving.router")
_CALLER_LEFT = 499  # a root span's status when the caller left first (nginx's "client closed")


class Frame:
    """One invocation as it runs: when it started, what it learned (`trace`) and how it ended."""

    def __init__(self, trace: InvocationTrace, span: InvocationSpan | None = None) -> None:
        self.trace = trace
        self.span = span  # its root span, with tracing on
        self.started = time.perf_counter()
        self.error: ServingError | None = None  # how it failed, for the transport's wire
        self.aborted = False  # the caller left before it was answered
        self._deferred = False
        self._counted = False

    @property
    def status(self) -> int:
        """The status its count carries: the error's, or 200."""
        return self.error.counted_status if self.error is not None else 200

    def count(self, status: int) -> None:
        """Count the invocation (once, whoever asks first) with its latencies up to now."""
        if not self._counted:
            self._counted = True
            record_invocation(self.trace, status, time.perf_counter() - self.started)
            if self.span is not None:
                self.span.end(status, self._attributes())

    def _attributes(self) -> dict[str, str | tuple[str, ...] | None]:
        """What the root span carries of what the invocation learned."""
        trace = self.trace
        return {
            tracing.ENDPOINT: trace.endpoint,
            tracing.CONTAINERS: trace.chain,
            tracing.VARIANT: trace.variant,
            tracing.MODEL: trace.model,
            tracing.PROTOCOL: trace.protocol,
            tracing.ERROR_CODE: self.error.code if self.error is not None else None,
        }

    def defer(self) -> Callable[[int], None]:
        """Leave the count to whoever ends the answer (a stream, when it ends however it ends):
        `count`."""
        self._deferred = True
        return self.count


@asynccontextmanager
async def invocation_frame(
    trace: InvocationTrace,
    where: str,
    aborts: tuple[type[BaseException], ...] = (),
    reraise_abort: bool = False,
    *,
    carrier: Mapping[str, str] | None = None,
    operation: str = "invocation",
    link: Mapping[str, str] | None = None,
) -> AsyncIterator[Frame]:
    """Run an invocation's work in its frame: `aborts` are the exceptions that mean the caller left
    (re-raised with `reraise_abort`, as a cancelled gRPC call must be); `where` names the failing
    part in an internal failure. With tracing on, `operation` names its root span, `carrier`
    (the request's headers) may hold the caller's trace context, and `link` the context of the
    span that set this work off (a shadow copy's caller, an async run's admission)."""
    frame = Frame(trace, tracing.begin(operation, carrier, link))
    try:
        yield frame
    # the caller's doing, not a failure of ours: counted as an abort, never as an invocation
    except aborts:
        record_client_abort(trace)
        frame.aborted = True
        if frame.span is not None:
            frame.span.end(_CALLER_LEFT, frame._attributes())
        if reraise_abort:
            raise
        return
    except ServingError as error:
        # Kept without its traceback: that would hold the failed work's frames (a request body among
        # their locals) in a cycle through this frame, for the garbage collector to find, long after
        # the answer was sent.
        error.__traceback__ = error.__context__ = error.__cause__ = None
        frame.error = error
    except Exception:  # a bug of ours: said in the documented shape, and the server keeps serving
        logger.exception("an invocation failed inside %s", where)
        frame.error = InternalFailureError(f"internal failure in {where}")
    finally:
        if frame.span is not None:
            frame.span.leave()  # a deferred answer's span stays open until its count ends it
    if not frame._deferred:
        frame.count(frame.status)
