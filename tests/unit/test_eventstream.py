"""The event-stream encoder, checked with botocore's own parser and the sagemaker-runtime service
model."""

from __future__ import annotations

import botocore.session
import pytest
from botocore.eventstream import EventStream, EventStreamBuffer
from botocore.exceptions import EventStreamError
from botocore.parsers import EventStreamJSONParser

from serving.http import eventstream


def parse(data: bytes) -> list:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return list(buffer)


class _Raw:
    """What botocore's EventStream reads: an object with `stream()`, here fed in small pieces."""

    def __init__(self, data: bytes, piece: int = 7) -> None:
        self.data, self.piece = data, piece

    def stream(self):
        for at in range(0, len(self.data), self.piece):
            yield self.data[at : at + self.piece]

    def close(self) -> None:
        pass


def boto_events(data: bytes) -> EventStream:
    """The stream as boto3's invoke_endpoint_with_response_stream hands it to a caller."""
    model = botocore.session.get_session().get_service_model("sagemaker-runtime")
    shape = model.operation_model("InvokeEndpointWithResponseStream").output_shape.members["Body"]
    return EventStream(
        _Raw(data), shape, EventStreamJSONParser(), "InvokeEndpointWithResponseStream"
    )


def test_a_payload_part_round_trips_through_botocores_parser() -> None:
    (message,) = parse(b"".join(eventstream.payload_parts(b'{"token": "h\xc3\xa9"}')))
    assert message.headers == {
        ":event-type": "PayloadPart",
        ":content-type": "application/octet-stream",
        ":message-type": "event",
    }
    assert message.payload == b'{"token": "h\xc3\xa9"}'


def test_boto3_reads_parts_then_raises_the_model_stream_error() -> None:
    data = b"".join(
        [
            *eventstream.payload_parts(b"one"),
            *eventstream.payload_parts(b""),
            *eventstream.payload_parts(b"two"),
        ]
    )
    data += eventstream.model_stream_error("ModelError", "container c: ValueError: bad token")
    events = iter(boto_events(data))
    assert [next(events) for _ in range(3)] == [
        {"PayloadPart": {"Bytes": b"one"}},
        {"PayloadPart": {"Bytes": b""}},
        {"PayloadPart": {"Bytes": b"two"}},
    ]
    with pytest.raises(EventStreamError) as raised:
        next(events)
    assert raised.value.response["Error"] == {
        "Code": "ModelStreamError",
        "Message": "container c: ValueError: bad token",
    }


def test_internal_stream_failure_is_botocores_too() -> None:
    with pytest.raises(EventStreamError) as raised:
        list(boto_events(eventstream.internal_stream_failure("router bug")))
    assert raised.value.response["Error"]["Code"] == "InternalStreamFailure"


def test_a_large_payload_is_split_into_parts_botocore_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(eventstream, "MAX_PAYLOAD_LENGTH", 4)
    parts = eventstream.payload_parts(b"0123456789")
    assert [message.payload for message in parse(b"".join(parts))] == [b"0123", b"4567", b"89"]


def test_a_corrupted_message_fails_botocores_checksums() -> None:
    (data,) = eventstream.payload_parts(b"payload")
    tampered = data[:-6] + b"X" + data[-5:]
    from botocore.eventstream import ChecksumMismatch

    with pytest.raises(ChecksumMismatch):
        parse(tampered)
