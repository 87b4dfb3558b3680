"""InvokeEndpointWithResponseStream's answer: the last container's event stream, relayed to the
caller.

The container answers a streaming hop in SageMaker's own framing (`http.eventstream`): `PayloadPart`
events, and a `ModelStreamError` event if its model raised after the first part. The relay parses
whole messages with botocore's parser and re-encodes each (so a container that dies mid-message
never leaves a torn message in the caller's stream), hands each on as it arrives, and ends the
stream with one error event when something goes wrong after the first byte, when the status line can
no longer say so:

- the container's own `ModelStreamError`: passed on;
- the stream outlasting `SERVING_STREAM_TIMEOUT_S`: `ModelStreamError`
  `ModelInvocationTimeExceeded`;
- the connection to the container breaking (its process died): `ModelStreamError` `StreamBroken`;
- anything the container sends that is not one of those events, or a bug here:
  `InternalStreamFailure`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from botocore.eventstream import EventStreamBuffer, ParserError

from serving import protocol
from serving.gateway.transport import HopStream, StreamBroken
from serving.http import eventstream

logger = logging.getLogger("serving.router")

# The status an invocation is counted with when its stream ended this way (the status line said
# 200).
STREAMED, MODEL_FAILED, INTERNAL_FAILED = 200, 424, 500


@dataclass(frozen=True)
class Framing:
    """How the caller's stream frames a container's bytes and the errors that end it."""

    payload: Callable[[bytes], list[bytes]]
    model_error: Callable[[str, str], bytes]  # (code, message)
    internal_failure: Callable[[str], bytes]


# InvokeEndpointWithResponseStream's: SageMaker's event stream
EVENT_STREAM = Framing(
    eventstream.payload_parts, eventstream.model_stream_error, eventstream.internal_stream_failure
)


async def relay(
    hop: HopStream,
    container: str,
    finished: Callable[[int], None],
    framing: Framing = EVENT_STREAM,
) -> AsyncIterator[bytes]:
    """The caller's stream in `framing`; `finished(status)` is called once when it ends (see the
    module's list)."""
    status = STREAMED
    try:
        buffer = EventStreamBuffer()
        async for data in hop:
            buffer.add_data(data)
            for message in buffer:
                headers = message.headers
                if headers.get(":event-type") == protocol.STREAM_PAYLOAD_EVENT:
                    for part in framing.payload(message.payload):
                        yield part
                    continue
                if headers.get(":exception-type") == protocol.STREAM_MODEL_ERROR_EVENT:
                    status = MODEL_FAILED
                    yield _model_error(framing, container, message.payload)
                else:
                    status = INTERNAL_FAILED
                    yield framing.internal_failure(
                        f"container {container} sent an unexpected event"
                    )
                return
    except TimeoutError:
        status = MODEL_FAILED
        yield framing.model_error(
            protocol.STREAM_TIMEOUT_CODE,
            f"Your model {container} did not complete sending the inference response in the allotted time.",
        )
    except StreamBroken as error:
        status = MODEL_FAILED
        yield framing.model_error(
            protocol.STREAM_BROKEN_CODE,
            f"The connection to container {container} was closed or reset: {error}",
        )
    except ParserError:
        status = INTERNAL_FAILED
        yield framing.internal_failure(f"container {container} sent a malformed event stream")
    except Exception:  # a bug of ours: say so in the stream's documented shape
        logger.exception("response stream of container %s failed inside the router", container)
        status = INTERNAL_FAILED
        yield framing.internal_failure("internal failure in the endpoint router")
    finally:
        hop.close()
        finished(status)


def _model_error(framing: Framing, container: str, payload: bytes) -> bytes:
    """The container's ModelStreamError, naming the container (its fields kept)."""
    try:
        document = json.loads(payload)
    except ValueError:
        document = {}
    if not isinstance(document, dict):
        document = {}
    code = str(document.get(protocol.STREAM_ERROR_CODE) or protocol.ErrorCode.MODEL_ERROR)
    return framing.model_error(code, f"container {container}: {document.get('Message', '')}")
