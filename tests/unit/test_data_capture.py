"""DataCaptureConfig and serving.gateway.capture without Ray: the record format, sampling, where
files go, and that a failing destination costs records, never an answer. S3 is moto's
ThreadedMotoServer (a real HTTP server on loopback speaking the S3 API), since no cloud is reachable
here. End to end through a gateway: tests/integration/test_data_capture.py."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer
from pydantic import ValidationError

from serving.config.data_capture import DataCaptureConfig
from serving.gateway.after_answer import AfterAnswer
from serving.gateway.capture import CAPTURED, CaptureWriter, record

HEADERS = {"content-type": "application/json"}


def config(destination: str, percent: int = 100, **fields) -> DataCaptureConfig:
    return DataCaptureConfig.model_validate(
        {
            "InitialSamplingPercentage": percent,
            "DestinationS3Uri": destination,
            "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
            **fields,
        }
    )


def count(endpoint: str, outcome: str) -> float:
    return CAPTURED.labels(endpoint, "AllTraffic", outcome)._value.get()


def lines_under(folder: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(folder.rglob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


# --- the record -----------------------------------------------------------------------------------


def test_a_record_is_sagemakers_format_and_decodes_to_the_bytes_sent_and_answered(
    tmp_path: Path,
) -> None:
    line = record(
        config(str(tmp_path)),
        b"[[1, 2]]",
        "application/json",
        b"1,0\n",
        "text/csv; charset=utf-8",
        "order-7",
        1764241200.5,
    )
    document = json.loads(line)
    assert document["eventVersion"] == "0"
    assert document["captureData"]["endpointInput"] == {
        "observedContentType": "application/json",
        "mode": "INPUT",
        "data": "[[1, 2]]",
        "encoding": "JSON",
    }
    assert document["captureData"]["endpointOutput"] == {
        "observedContentType": "text/csv; charset=utf-8",
        "mode": "OUTPUT",
        "data": "1,0\n",
        "encoding": "CSV",
    }
    metadata = document["eventMetadata"]
    assert (
        metadata["inferenceTime"] == "2025-11-27T11:00:00Z" and metadata["inferenceId"] == "order-7"
    )
    assert re.fullmatch(r"[0-9a-f-]{36}", metadata["eventId"])


def test_types_not_named_and_bytes_that_are_not_utf8_are_captured_as_base64(tmp_path: Path) -> None:
    answer = bytes(range(256))
    document = json.loads(
        record(
            config(str(tmp_path)),
            b"\xff\xfe",
            "application/json",
            answer,
            "application/x-npy",
            None,
            0.0,
        )
    )
    sent, answered = (
        document["captureData"]["endpointInput"],
        document["captureData"]["endpointOutput"],
    )
    assert sent["encoding"] == answered["encoding"] == "BASE64"
    assert (
        base64.b64decode(sent["data"]) == b"\xff\xfe"
        and base64.b64decode(answered["data"]) == answer
    )
    assert "inferenceId" not in document["eventMetadata"]


def test_capture_options_choose_the_sides(tmp_path: Path) -> None:
    only_input = config(str(tmp_path), CaptureOptions=[{"CaptureMode": "Input"}])
    assert list(
        json.loads(record(only_input, b"1", "text/csv", b"2", "text/csv", None, 0.0))["captureData"]
    ) == ["endpointInput"]


# --- the config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"InitialSamplingPercentage": 101}, "less than or equal to 100"),
        ({"CaptureOptions": []}, "at least 1"),
        ({"CaptureOptions": [{"CaptureMode": "Everything"}]}, "Input"),
        (
            {"DestinationS3Uri": "https://bucket.s3.amazonaws.com/x"},
            "https:// destinations are not supported",
        ),
        ({"DestinationS3Uri": "s3://Not_A_Bucket/x"}, "names no valid bucket"),
        ({"KmsKeyId": "alias/capture"}, "KmsKeyId applies to an s3:// DestinationS3Uri only"),
        ({"CaptureContentTypeHeader": {"JsonContentTypes": ["json"]}}, "is not a content type"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(
    tmp_path: Path, fields: dict, fragment: str
) -> None:
    document = {
        "InitialSamplingPercentage": 10,
        "DestinationS3Uri": str(tmp_path),
        "CaptureOptions": [{"CaptureMode": "Input"}],
        **fields,
    }
    with pytest.raises(ValidationError) as refused:
        DataCaptureConfig.model_validate(document)
    assert fragment in str(refused.value)


def test_a_local_destination_may_be_a_file_uri_or_a_path_relative_to_the_spec(
    tmp_path: Path,
) -> None:
    assert config(f"file://{tmp_path}/c").folder == tmp_path / "c"
    relative = DataCaptureConfig.model_validate(
        {
            "InitialSamplingPercentage": 5,
            "DestinationS3Uri": "captured",
            "CaptureOptions": [{"CaptureMode": "Input"}],
        },
        context={"base_dir": str(tmp_path)},
    )
    assert relative.folder == tmp_path / "captured"
    assert (
        config("s3://bucket/prefix/", KmsKeyId="alias/k").DestinationS3Uri == "s3://bucket/prefix"
    )


# --- the writer -----------------------------------------------------------------------------------


def test_every_sampled_call_is_one_record_in_a_file_named_as_sagemaker_names_them(
    tmp_path: Path,
) -> None:
    async def main() -> CaptureWriter:
        writer = CaptureWriter(AfterAnswer())
        for n in range(25):
            assert writer.offer(
                config(str(tmp_path)),
                "local",
                "AllTraffic",
                f"[{n}]".encode(),
                HEADERS,
                f"{n * 2}".encode(),
                "application/json",
            )
        await writer.after.close()  # what the gateway's lifespan does
        return writer

    written = count("local", "written")
    asyncio.run(main())
    records = lines_under(tmp_path)
    assert sorted(
        json.loads(r["captureData"]["endpointInput"]["data"])[0] for r in records
    ) == list(range(25))
    assert all(
        r["captureData"]["endpointOutput"]["data"]
        == str(2 * json.loads(r["captureData"]["endpointInput"]["data"])[0])
        for r in records
    )
    (path,) = list(tmp_path.rglob("*.jsonl"))
    relative = path.relative_to(tmp_path).as_posix()
    assert re.fullmatch(
        r"local/AllTraffic/\d{4}/\d\d/\d\d/\d\d/\d\d-\d\d-\d{3}-[0-9a-f-]{36}\.jsonl", relative
    )
    assert not list(tmp_path.rglob(".*.part"))
    assert count("local", "written") - written == 25


def test_sampling_draws_once_per_call(tmp_path: Path) -> None:
    draws = iter([0.05, 0.29, 0.30, 0.99])

    async def main() -> list[bool]:
        writer = CaptureWriter(AfterAnswer(), draw=lambda: next(draws))
        taken = [
            writer.offer(
                config(str(tmp_path), 30),
                "sampled",
                "AllTraffic",
                b"[1]",
                HEADERS,
                b"1",
                "application/json",
            )
            for _ in range(4)
        ]
        await writer.after.close()  # what the gateway's lifespan does
        return taken

    assert asyncio.run(main()) == [True, True, False, False]
    assert len(lines_under(tmp_path)) == 2


def test_a_destination_that_refuses_writes_costs_records_never_an_answer(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")

    async def main() -> None:
        writer = CaptureWriter(AfterAnswer())
        for _ in range(3):
            assert writer.offer(
                config(str(blocked)), "refused", "AllTraffic", b"[1]", HEADERS, b"1", "text/csv"
            )
        await writer.after.close()  # what the gateway's lifespan does

    failed = count("refused", "failed")
    asyncio.run(main())  # raises nothing
    assert count("refused", "failed") - failed == 3


def test_past_its_byte_bound_the_queue_drops_records_and_counts_them(tmp_path: Path) -> None:
    async def main() -> None:
        writer = CaptureWriter(AfterAnswer(), queue_bytes=100)
        for _ in range(5):
            writer.offer(
                config(str(tmp_path)),
                "bounded",
                "AllTraffic",
                b"x" * 40,
                HEADERS,
                b"y" * 10,
                "text/csv",
            )
        await writer.after.close()  # what the gateway's lifespan does

    dropped = count("bounded", "dropped")
    asyncio.run(main())
    assert count("bounded", "dropped") - dropped == 3
    assert len(lines_under(tmp_path)) == 2


def test_an_s3_destination_gets_one_object_per_flush_under_endpoint_variant_and_hour() -> None:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"

        def client(_: str | None):
            return boto3.client(
                "s3",
                endpoint_url=url,
                region_name="us-east-1",
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )

        s3 = client(None)
        s3.create_bucket(Bucket="capture")

        async def main() -> None:
            writer = CaptureWriter(AfterAnswer(), s3_client=client)
            for n in range(3):
                writer.offer(
                    config("s3://capture/monitoring"),
                    "remote",
                    "AllTraffic",
                    f"[{n}]".encode(),
                    HEADERS,
                    b"0",
                    "application/json",
                )
            await writer.after.close()  # what the gateway's lifespan does

        asyncio.run(main())
        (key,) = [item["Key"] for item in s3.list_objects_v2(Bucket="capture")["Contents"]]
        assert re.fullmatch(
            r"monitoring/remote/AllTraffic/\d{4}/\d\d/\d\d/\d\d/[0-9a-f-]{46}\.jsonl",
            key.replace("-", "-"),
        )
        body = s3.get_object(Bucket="capture", Key=key)["Body"].read().decode()
        assert len(body.splitlines()) == 3
    finally:
        server.stop()
