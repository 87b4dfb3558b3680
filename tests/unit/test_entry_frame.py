"""The one entry frame (serving/gateway/entry.py): each outcome of an invocation counted once,
whatever the way in.

The counts are read from the process's real metrics registry, before and after, as
test_router_metrics does; the transports' own use of the frame is covered over real HTTP and gRPC by
test_router_metrics and the Open Inference tests.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from serving.errors import ModelNotReadyError, ServingError, ValidationError
from serving.gateway.entry import invocation_frame
from serving.metrics.invocations import REGISTRY, InvocationTrace

LABELS = {"endpoint": "frame-test", "container": "c", "model": "", "protocol": "sagemaker-runtime"}


def counts() -> dict[str, float]:
    names = {
        "invocations": "serving_invocations_total",
        "4xx": "serving_invocation_4xx_errors_total",
        "5xx": "serving_invocation_5xx_errors_total",
    }
    found = {key: REGISTRY.get_sample_value(name, LABELS) or 0.0 for key, name in names.items()}
    found["aborts"] = (
        REGISTRY.get_sample_value(
            "serving_invocation_client_aborts_total", {"endpoint": "frame-test"}
        )
        or 0.0
    )
    return found


def trace() -> InvocationTrace:
    return InvocationTrace(endpoint="frame-test", chain=("c",))


def run(work, **frame_options):
    """Run `work(frame)` in a frame; returns the frame and the count differences."""
    before = counts()

    async def main():
        async with invocation_frame(trace(), "the test", **frame_options) as frame:
            await work(frame)
        return frame

    frame = asyncio.run(main())
    after = counts()
    return frame, {key: after[key] - before[key] for key in after}


async def answer(frame) -> None:
    pass


def test_an_answer_is_counted_once_as_200() -> None:
    frame, delta = run(answer)
    assert frame.error is None and not frame.aborted
    assert delta == {"invocations": 1, "4xx": 0, "5xx": 0, "aborts": 0}


@pytest.mark.parametrize(
    ("error", "kind"),
    [(ValidationError("bad header"), "4xx"), (ModelNotReadyError("no replica"), "4xx")],
)
def test_a_serving_error_is_the_outcome_and_counted_under_its_status(
    error: ServingError, kind: str
) -> None:
    async def fail(frame) -> None:
        raise error

    frame, delta = run(fail)
    assert frame.error is error
    # no traceback kept: it would hold the work's frames, and a request body with them, past the
    # answer
    assert error.__traceback__ is None
    assert delta == {
        "invocations": 1,
        "4xx": 1 if kind == "4xx" else 0,
        "5xx": 1 if kind == "5xx" else 0,
        "aborts": 0,
    }


def test_a_bug_is_logged_and_becomes_an_internal_failure(caplog) -> None:
    async def bug(frame) -> None:
        raise KeyError("oops")

    with caplog.at_level(logging.ERROR, logger="serving.router"):
        frame, delta = run(bug)
    assert (
        frame.error is not None
        and frame.error.status == 500
        and "internal failure in the test" in frame.error.message
    )
    assert delta == {"invocations": 1, "4xx": 0, "5xx": 1, "aborts": 0}
    assert "an invocation failed inside the test" in caplog.text


class Gone(Exception):
    """Stands for a transport's "the caller left" exception (Starlette's ClientDisconnect)."""


def test_a_caller_who_left_is_an_abort_not_an_invocation() -> None:
    async def leave(frame) -> None:
        raise Gone()

    frame, delta = run(leave, aborts=(Gone,))
    assert frame.aborted and frame.error is None
    assert delta == {"invocations": 0, "4xx": 0, "5xx": 0, "aborts": 1}


def test_an_abort_can_be_raised_on_as_a_cancelled_grpc_call_must_be() -> None:
    async def cancelled(frame) -> None:
        raise asyncio.CancelledError()

    before = counts()
    with pytest.raises(asyncio.CancelledError):
        run(cancelled, aborts=(asyncio.CancelledError,), reraise_abort=True)
    assert (
        counts()["aborts"] - before["aborts"] == 1
        and counts()["invocations"] == before["invocations"]
    )


def test_a_deferred_count_is_made_once_by_whoever_ends_the_answer() -> None:
    ends = []

    async def stream(frame) -> None:
        ends.append(frame.defer())

    frame, delta = run(stream)
    assert delta["invocations"] == 0  # the stream has not ended yet
    before = counts()
    ends[0](200)
    ends[0](500)  # a second end (the stream's and its background task's): not counted again
    after = counts()
    assert after["invocations"] - before["invocations"] == 1 and after["5xx"] == before["5xx"]
