"""The control-plane API (`POST /`) against a hostile caller (issue 41, findings 4 and 7c).

Before the fix the API read up to 1 MB of every request before looking at its credentials: 1,000
unauthenticated connections from the network added 882 MB to the gateway at peak. Now the headers
authenticate first (an unknown key is refused before a byte of the body is read) and a signed body
waits for its signature within the gateway's one pre-authentication budget, as invocations do.
Malformed bodies are the caller's 400s, never 500s.
"""

from __future__ import annotations

import io
import json
import socket
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
import yaml

from tests.unit.sagemaker_harness import KEY, SECRET, Harness, refused

BODY = 1_000_000  # the API's largest body
BUDGET_MB = 8


@pytest.fixture
def signed_harness(tmp_path: Path):
    (tmp_path / "all.json").write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "sagemaker:*", "Resource": "*"}],
            }
        )
    )
    (tmp_path / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "deployer",
                        "AccessKeyId": KEY,
                        "SecretAccessKey": SECRET,
                        "PolicyDocuments": ["all.json"],
                    }
                ]
            }
        )
    )
    harness = Harness(
        tmp_path,
        api_identities=str(tmp_path / "identities.yaml"),
        preauth_body_budget_mb=BUDGET_MB,
        max_payload_mb=1,
    )
    yield harness
    harness.stop()


def _head(url: str, key: str, length: int) -> bytes:
    """A ListModels request's line and headers, signed (SigV4 in form, with a made-up signature) by
    `key`."""
    host = url.removeprefix("http://")
    now = datetime.now(UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    authorization = (
        f"AWS4-HMAC-SHA256 Credential={key}/{day}/us-east-1/sagemaker/aws4_request, "
        f"SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature={'0' * 64}"
    )
    return (
        f"POST / HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-amz-json-1.1\r\n"
        f"X-Amz-Target: SageMaker.ListModels\r\nX-Amz-Date: {stamp}\r\nAuthorization: {authorization}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _status(connection: socket.socket, wait: float) -> int | None:
    connection.settimeout(wait)
    try:
        line = connection.recv(64)
    except (TimeoutError, BlockingIOError):
        return None
    return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None


def test_an_unknown_key_is_refused_before_the_body_is_read(signed_harness: Harness) -> None:
    with _connect(signed_harness.url) as connection:
        # and no body at all
        connection.sendall(_head(signed_harness.url, "AKIAUNKNOWNCALLER001", BODY))
        assert _status(connection, wait=5) == 403  # before: the API waited for the megabyte first


def test_signed_bodies_wait_for_their_signature_within_the_preauth_budget(
    signed_harness: Harness,
) -> None:
    # Each connection sends a known key's headers and all but the last byte of a 1 MB body, so each
    # body is held while its signature cannot be checked yet. The budget holds 8 of them; the rest
    # are refused at once (429).
    me = psutil.Process()
    before = me.memory_info().rss
    connections, refused_early = [], 0
    try:
        for _ in range(60):
            connection = _connect(signed_harness.url)
            connections.append(connection)
            connection.sendall(_head(signed_harness.url, KEY, BODY))
            try:
                connection.sendall(b" " * (BODY - 1))
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before its body: the server closed the connection
        time.sleep(1.0)
        grown = me.memory_info().rss - before
        refused_early = sum(_status(connection, wait=0.2) == 429 for connection in connections)
    finally:
        for connection in connections:
            connection.close()
    assert refused_early >= 60 - BUDGET_MB - 2, refused_early  # before: none (every body was read)
    assert grown < (BUDGET_MB + 24) * 2**20, f"{grown / 2**20:.0f} MiB for 60 held bodies"


def test_deeply_nested_json_is_a_validation_error(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    try:
        import httpx

        deep = b"[" * 100_000 + b"]" * 100_000
        answer = httpx.post(
            harness.url + "/",
            content=deep,
            headers={
                "X-Amz-Target": "SageMaker.ListModels",
                "Content-Type": "application/x-amz-json-1.1",
            },
            timeout=30,
        )
        assert answer.status_code == 400, answer.text  # before: 500 (RecursionError)
        assert answer.json()["__type"] == "ValidationException"
        assert "nests too deeply" in answer.json()["message"]
    finally:
        harness.stop()


def test_an_uncompressed_tar_named_tar_gz_is_a_validation_error(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    try:
        archive = harness.models / "plain.tar.gz"
        payload = b"def predict_fn(data, model):\n    return data\n"
        with tarfile.open(archive, "w") as tar:  # no compression
            info = tarfile.TarInfo("code/inference.py")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        message = refused(
            lambda: harness.sm.create_model(
                ModelName="plain",
                PrimaryContainer={"Image": "python", "ModelDataUrl": str(archive)},
            ),
            "ValidationException",
            "plain.tar.gz",
        )
        # before: 500 InternalFailure
        assert "not a readable gzip-compressed tar archive" in message
    finally:
        harness.stop()
