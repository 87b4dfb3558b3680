"""Data capture: a sampled share of an endpoint's invocations, written in SageMaker's capture record
format.

Off the caller's path: an invocation that is sampled hands its request and answer (references, no
copy) to a bounded queue and returns; a task of the gateway has them made into JSON lines and
written on a thread, grouped by destination, endpoint, variant and hour, one file (or S3 object) per
flush, under `<destination>/<endpoint>/<variant>/yyyy/mm/dd/hh/MM-SS-mmm-<uuid>.jsonl`, as SageMaker
names them. A full queue, a full disk or an unreachable bucket costs records, never an answer: each
is counted (`serving_data_capture_records_total{outcome}`) and logged. What is lost when the gateway
dies: the records not yet written (at most `FLUSH_S` of them, and whatever the queue held). A local
destination's files are 0600 and the folders made for them 0700: callers' requests and answers, for
this user only. docs/spec.md, "DataCaptureConfig".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from serving import protocol
from serving.config.data_capture import DataCaptureConfig
from serving.gateway.after_answer import AfterAnswer
from serving.metrics.invocations import REGISTRY
from serving.s3 import Clients, parse_s3_uri

__all__ = ["CAPTURED", "CaptureWriter", "record"]

logger = logging.getLogger("serving.capture")

FLUSH_S = 1.0  # how long a record waits for others to share its file
MAX_BATCH = 1000  # records per file at most
# request and answer bytes waiting to be written, at most; past it records are dropped
QUEUE_BYTES = 64 << 20
# a stopping gateway writes what the queue holds within this, else leaves the rest unwritten
CLOSE_GRACE_S = 10.0

CAPTURED = Counter(
    "serving_data_capture_records",
    "Invocations sampled for data capture, by outcome: written, dropped (the queue was full) or failed (the "
    "destination refused the write).",
    labelnames=("endpoint", "variant", "outcome"),
    registry=REGISTRY,
)


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _part(
    config: DataCaptureConfig, mode: str, body: bytes, content_type: str | None
) -> dict[str, str]:
    """One side of a record: text for the CSV and JSON types the config names (when it is UTF-8),
    else base64."""
    kind = _media_type(content_type)
    headers = config.CaptureContentTypeHeader
    encoding = (
        "CSV"
        if kind in headers.CsvContentTypes
        else "JSON"
        if kind in headers.JsonContentTypes
        else "BASE64"
    )
    if encoding != "BASE64":
        try:
            data = bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            encoding = "BASE64"
    if encoding == "BASE64":
        data = base64.b64encode(body).decode("ascii")
    return {
        "observedContentType": content_type or "",
        "mode": mode,
        "data": data,
        "encoding": encoding,
    }


def record(
    config: DataCaptureConfig,
    body: bytes,
    content_type: str | None,
    answer: bytes,
    answer_type: str | None,
    inference_id: str | None,
    at: float,
) -> str:
    """One capture record, as one JSON line (SageMaker's format, `eventVersion` 0)."""
    captured: dict[str, dict[str, str]] = {}
    if config.captures_input:
        captured["endpointInput"] = _part(config, "INPUT", body, content_type)
    if config.captures_output:
        captured["endpointOutput"] = _part(config, "OUTPUT", answer, answer_type)
    metadata = {
        "eventId": str(uuid.uuid4()),
        "inferenceTime": datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if inference_id is not None:
        metadata["inferenceId"] = inference_id
    return json.dumps(
        {"captureData": captured, "eventMetadata": metadata, "eventVersion": "0"},
        separators=(",", ":"),
    )


@dataclass
class _Pending:
    config: DataCaptureConfig
    endpoint: str
    variant: str
    body: bytes
    content_type: str | None
    answer: bytes
    answer_type: str | None
    inference_id: str | None
    at: float
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.body) + len(self.answer)


class CaptureWriter:
    """Samples invocations and writes the sampled ones; one per gateway process."""

    KIND = "capture"

    def __init__(
        self,
        after: AfterAnswer,
        s3_client: Callable[[str | None], Any] | None = None,
        draw: Callable[[], float] = random.random,
        queue_bytes: int = QUEUE_BYTES,
    ) -> None:
        """`after`: the gateway's after-the-answer runner, which runs the writing task (one at a
        time) and, at close, the last write of what is queued (within CLOSE_GRACE_S)."""
        self.after = after
        after.register(self.KIND, 1, grace_s=CLOSE_GRACE_S, closer=self.flush)
        self._clients = Clients(s3_client)
        self._draw = draw
        self.queue_bytes = queue_bytes
        self._pending: list[_Pending] = []
        self._bytes = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def offer(
        self,
        config: DataCaptureConfig,
        endpoint: str,
        variant: str,
        body: bytes,
        headers: Mapping[str, str],
        answer: bytes,
        answer_type: str | None,
    ) -> bool:
        """Sample one answered invocation; queue it if drawn (True). Never raises, never waits."""
        if self._draw() * 100 >= config.InitialSamplingPercentage:
            return False
        pending = _Pending(
            config,
            endpoint,
            variant,
            body,
            headers.get("content-type"),
            answer,
            answer_type,
            headers.get(protocol.INFERENCE_ID),
            time.time(),
        )
        if self._bytes + pending.size > self.queue_bytes:
            CAPTURED.labels(endpoint, variant, "dropped").inc()
            return True
        self._pending.append(pending)
        self._bytes += pending.size
        self._start()
        return True

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = self.after.submit(self.KIND, self._run)
        elif len(self._pending) >= MAX_BATCH and self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        while self._pending:
            assert self._wake is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FLUSH_S)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write every queued record now (a file per destination, endpoint, variant and hour)."""
        taken, self._pending, self._bytes = self._pending, [], 0
        groups: dict[tuple[str, str | None, str | None, str, str, str], list[_Pending]] = {}
        for item in taken:
            hour = datetime.fromtimestamp(item.at, UTC).strftime("%Y/%m/%d/%H")
            key = (
                item.config.DestinationS3Uri,
                item.config.S3EndpointUrl,
                item.config.KmsKeyId,
                item.endpoint,
                item.variant,
                hour,
            )
            groups.setdefault(key, []).append(item)
        for (destination, _, _, endpoint, variant, hour), items in groups.items():
            for start in range(0, len(items), MAX_BATCH):
                batch = items[start : start + MAX_BATCH]
                await self._write(
                    batch, f"{endpoint}/{variant}/{hour}", endpoint, variant, destination
                )

    async def _write(
        self, batch: list[_Pending], folder: str, endpoint: str, variant: str, destination: str
    ) -> None:
        # on a thread: a second's records made into JSON lines on the event loop would stall every
        # request
        try:
            await asyncio.to_thread(self._write_now, batch, folder)
        # a full disk, a refused or unreachable bucket: the records are lost, counted
        except Exception as error:
            CAPTURED.labels(endpoint, variant, "failed").inc(len(batch))
            logger.error(
                "data capture of %s/%s: %d records not written to %s: %s",
                endpoint,
                variant,
                len(batch),
                destination,
                error,
            )
            return
        CAPTURED.labels(endpoint, variant, "written").inc(len(batch))

    def _write_now(self, batch: list[_Pending], folder: str) -> None:
        lines = "".join(
            record(i.config, i.body, i.content_type, i.answer, i.answer_type, i.inference_id, i.at)
            + "\n"
            for i in batch
        ).encode()
        first = datetime.fromtimestamp(batch[0].at, UTC)
        name = f"{first:%M-%S}-{first.microsecond // 1000:03d}-{uuid.uuid4()}.jsonl"
        config = batch[0].config
        if config.is_s3:
            self._put(config, f"{folder}/{name}", lines)
        else:
            _write_file(config.folder / folder, name, lines)

    def _put(self, config: DataCaptureConfig, key: str, lines: bytes) -> None:
        client = self._clients(config.S3EndpointUrl)
        location = parse_s3_uri(config.DestinationS3Uri)
        extra = (
            {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": config.KmsKeyId}
            if config.KmsKeyId
            else {}
        )
        client.put_object(
            Bucket=location.bucket,
            Key=f"{location.folder}{key}",
            Body=lines,
            ContentType="application/jsonl",
            **extra,
        )


def _write_file(folder: Path, name: str, lines: bytes) -> None:
    """Write a whole file under a temporary name, then rename it: a reader never sees half a file.
    Callers' requests and answers: readable by this user only (0600, in folders made 0700), whatever
    the gateway's umask."""
    _make_folders(folder)
    temporary = folder / f".{name}.part"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(temporary, flags, 0o600), "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)  # open's mode is masked by the umask
            handle.write(lines)
        os.replace(temporary, folder / name)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def _make_folders(folder: Path) -> None:
    """`folder` with its missing parents, each one made here 0700 (mkdir's mode is masked by the
    umask); folders that exist (the destination the operator made) are left as they are."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        # another gateway of this node made it, 0700 too (or a file is in the way: the next
        except FileExistsError:
            continue  # mkdir, or the file's open, fails and the records are counted as failed)
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(descriptor, 0o700)
        finally:
            os.close(descriptor)
