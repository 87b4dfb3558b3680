"""S3 for a MultiModel container whose process has no network: its supervisor makes the calls for
it.

A container process lives in a network namespace of its own (`model_server.netns`), so it cannot
reach an S3 store itself, as SageMaker's platform, not the container, fetches a model for a
multi-model endpoint. Its `ModelStore` gets a `BrokeredS3` client instead, whose three calls
(`head_object`, `list_objects_v2`, `get_object`) travel as JSON lines over a pair of pipes to an
`S3Broker` thread of its supervisor. The broker makes them outside the sandbox, with the S3 client
the supervisor chose (the container's own credentials, if its Environment has them), for objects
under the container's own prefix only, read-only, and writes a fetched object into a file of the
container's scratch folder, which the container opens and unlinks. Tenant code can drive the pipes,
and reach no more than its prefix: what its model store reads anyway.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
from pathlib import Path
from typing import Any, BinaryIO, NotRequired, TypedDict, cast

__all__ = ["BrokeredS3", "S3Broker"]


_MAX_LINE = 64 * 1024  # a request names a bucket, a key and a token: far less
_ARGUMENTS = {
    "head_object": {"Bucket", "Key"},
    "get_object": {"Bucket", "Key"},
    "list_objects_v2": {"Bucket", "Prefix", "Delimiter", "ContinuationToken"},
}


class Head(TypedDict):
    ETag: str | None
    ContentLength: int | None


class Listed(TypedDict):
    Key: str
    ETag: str | None
    Size: int | None


class Listing(TypedDict):
    Contents: list[Listed]
    IsTruncated: NotRequired[bool]
    NextContinuationToken: NotRequired[str]


class Fetched(TypedDict):
    """`get_object` over the pipes: where the broker wrote the object."""

    Path: str
    ETag: str | None
    ContentLength: int


class Opened(TypedDict):
    """`get_object` as the model store gets it: an open body, as boto3's."""

    Body: BinaryIO
    ETag: str | None
    ContentLength: int


class S3Error(TypedDict):
    Code: str
    Message: str


class Answer(TypedDict, total=False):
    """One line back over the pipes: the call's result, or its error."""

    result: Head | Listing | Fetched
    error: S3Error


class BrokeredS3:
    """The container process's S3 client: each call is one request to its supervisor's broker (one
    at a time)."""

    def __init__(self, requests_fd: int, answers_fd: int) -> None:
        self._requests = os.fdopen(requests_fd, "wb", buffering=0)
        self._answers = os.fdopen(answers_fd, "rb")
        self._lock = threading.Lock()

    def head_object(self, **arguments: str) -> Head:
        return cast(Head, self._call("head_object", arguments))

    def list_objects_v2(self, **arguments: str) -> Listing:
        return cast(Listing, self._call("list_objects_v2", arguments))

    def get_object(self, **arguments: str) -> Opened:
        answer = cast(Fetched, self._call("get_object", arguments))
        # the caller closes it, as boto3's StreamingBody
        body: BinaryIO = open(answer["Path"], "rb")  # noqa: SIM115
        os.unlink(answer["Path"])  # its bytes stay readable through the descriptor, and go with it
        return {"Body": body, "ETag": answer["ETag"], "ContentLength": answer["ContentLength"]}

    def _call(self, operation: str, arguments: dict[str, str]) -> Head | Listing | Fetched:
        from botocore.exceptions import ClientError

        with self._lock:
            try:
                self._requests.write(
                    json.dumps({"operation": operation, "arguments": arguments}).encode() + b"\n"
                )
                line = self._answers.readline()
            except OSError:
                line = b""
        answer: Answer = (
            json.loads(line)
            if line
            else _error("SupervisorGone", "its supervisor, which makes its S3 calls, is gone")
        )
        if "error" in answer:
            raise ClientError({"Error": answer["error"]}, operation)
        return answer["result"]


class S3Broker:
    """The supervisor's side: answers one container process's S3 calls under `prefix`, on a thread
    of its own."""

    def __init__(self, prefix: str, client: Any, downloads: Path) -> None:
        bucket, _, key = prefix.removeprefix("s3://").partition("/")
        self.bucket, self.key_prefix = bucket, key
        self.client = client
        self.downloads = downloads
        self._requests, child_requests = os.pipe()
        child_answers, self._answers = os.pipe()
        # the container process's ends: pass, then close here
        self.child_fds = (child_requests, child_answers)

    def start(self) -> None:
        """Close the child's ends (it holds them now) and serve until it closes its own."""
        for descriptor in self.child_fds:
            os.close(descriptor)
        threading.Thread(target=self._serve, name="s3-broker", daemon=True).start()

    def _serve(self) -> None:
        with (
            os.fdopen(self._requests, "rb") as requests,
            os.fdopen(self._answers, "wb", buffering=0) as answers,
        ):
            while line := requests.readline(_MAX_LINE + 1):
                try:
                    answers.write(json.dumps(self._answer(line), default=str).encode() + b"\n")
                except OSError:  # the container process is gone
                    return

    def _answer(self, line: bytes) -> Answer:
        try:
            request = json.loads(line) if len(line) <= _MAX_LINE else None
            operation, arguments = request["operation"], request["arguments"]  # type: ignore[index]
            if (
                operation not in _ARGUMENTS
                or not isinstance(arguments, dict)
                or set(arguments) - _ARGUMENTS[operation]
            ):
                raise ValueError(operation)
        except (ValueError, KeyError, TypeError):
            return _error("InvalidRequest", "not an S3 call a model store makes")
        named = arguments.get("Key", arguments.get("Prefix", ""))
        if (
            arguments.get("Bucket") != self.bucket
            or not isinstance(named, str)
            or not named.startswith(self.key_prefix)
        ):
            return _error(
                "AccessDenied", f"only s3://{self.bucket}/{self.key_prefix} is this container's"
            )
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return {"result": self._call(operation, arguments)}
        except ClientError as error:
            info = error.response.get("Error", {})
            return _error(str(info.get("Code")), str(info.get("Message")))
        except (BotoCoreError, OSError) as error:
            return _error("RequestFailed", str(error))

    def _call(self, operation: str, arguments: dict[str, str]) -> Head | Listing | Fetched:
        if operation == "head_object":
            head = self.client.head_object(**arguments)
            return {"ETag": head.get("ETag"), "ContentLength": head.get("ContentLength")}
        if operation == "list_objects_v2":
            page = self.client.list_objects_v2(**arguments)
            listing: Listing = {
                "Contents": [
                    {"Key": obj.get("Key"), "ETag": obj.get("ETag"), "Size": obj.get("Size")}
                    for obj in page.get("Contents", [])
                ]
            }
            if "IsTruncated" in page:
                listing["IsTruncated"] = page["IsTruncated"]
            if "NextContinuationToken" in page:
                listing["NextContinuationToken"] = page["NextContinuationToken"]
            return listing
        response = self.client.get_object(**arguments)
        self.downloads.mkdir(mode=0o700, exist_ok=True)
        path = self.downloads / secrets.token_hex(8)
        with response["Body"] as body, open(path, "xb") as out:
            shutil.copyfileobj(body, out, 1 << 20)
        return {
            "Path": str(path),
            "ETag": response.get("ETag"),
            "ContentLength": path.stat().st_size,
        }


def _error(code: str, message: str) -> Answer:
    return {"error": {"Code": code, "Message": message}}
