"""S3 in one place: `s3://` URIs parsed and checked, and clients made (from this process's
configuration or a container's Environment) and kept, one per store URL. The gateway (capture, async
invocations), the model stores and the container supervisors all take theirs from here; boto3 is
imported only when a client is made.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from serving.protocol import S3_ENDPOINT_URL_ENV

__all__ = ["Clients", "S3Location", "client", "client_for", "parse_s3_uri"]

# S3's bucket naming rules (3-63 lowercase letters, digits, dots, hyphens; starts and ends
# alphanumeric).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class S3Location:
    """A bucket and a key (or key prefix) parsed from an `s3://bucket/key` URI."""

    __slots__ = ("bucket", "key")

    def __init__(self, bucket: str, key: str) -> None:
        self.bucket, self.key = bucket, key

    @property
    def folder(self) -> str:
        """The key as a folder prefix: '' or ending in '/'."""
        return self.key if not self.key or self.key.endswith("/") else self.key + "/"

    def child(self, name: str) -> S3Location:
        """The object `name` in this folder."""
        return S3Location(self.bucket, self.folder + name)

    def contains(self, other: S3Location) -> bool:
        """Whether `other` lies in this folder (same bucket, key under the folder)."""
        return other.bucket == self.bucket and other.key.startswith(self.folder)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def __repr__(self) -> str:
        return self.uri


def parse_s3_uri(value: str, what: str = "location") -> S3Location:
    """`s3://bucket/key` as an S3Location; ValueError naming `what` for anything else.

    Keys with empty, `.` or `..` segments are refused: some S3-compatible stores normalise them,
    which would let a key leave the prefix it was checked against.
    """
    if not value.startswith("s3://"):
        raise ValueError(
            f"{what} {value!r} is not an s3://bucket/key URI (https:// locations are not supported)"
        )
    bucket, _, key = value.removeprefix("s3://").partition("/")
    if not _BUCKET.match(bucket):
        raise ValueError(f"{what} {value!r} names no valid bucket")
    segments = key.rstrip("/").split("/") if key else []
    if any(segment in ("", ".", "..") for segment in segments):
        raise ValueError(f"{what} {value!r} has an empty, '.' or '..' path segment")
    return S3Location(bucket, key)


def client(endpoint_url: str | None = None) -> Any:
    """A boto3 S3 client for `endpoint_url`, else SERVING_S3_ENDPOINT_URL, else boto3's own
    configuration.

    Credentials come from boto3's usual chain (environment, config files, instance role) of this
    process.
    """
    import boto3  # only S3 locations need it

    # None lets boto3 apply AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 and its config files itself.
    endpoint_url = endpoint_url or os.environ.get(S3_ENDPOINT_URL_ENV) or None
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url)


def client_for(environment: Mapping[str, str]) -> Any:
    """The S3 client a container's model data is fetched with by its supervisor, outside its
    sandbox: with the container's own AWS_* settings if its Environment has them, else the
    supervisor's credentials, which the container process never sees (the API holds such models to
    the operator's s3:// model roots)."""
    endpoint = environment.get(S3_ENDPOINT_URL_ENV) or os.environ.get(S3_ENDPOINT_URL_ENV) or None
    keys = {
        name: environment[variable]
        for name, variable in (
            ("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
            ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
            ("aws_session_token", "AWS_SESSION_TOKEN"),
            ("region_name", "AWS_DEFAULT_REGION"),
        )
        if variable in environment
    }
    if not keys:
        return client(endpoint)
    import boto3

    return boto3.session.Session(**keys).client("s3", endpoint_url=endpoint)


class Clients:
    """One client per store URL (None: boto3's own configuration), made by `factory` on first use;
    boto3's clients are thread-safe, so one serves every thread."""

    def __init__(self, factory: Callable[[str | None], Any] | None = None) -> None:
        self._factory = factory
        self._made: dict[str | None, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, endpoint_url: str | None) -> Any:
        made = self._made.get(endpoint_url)
        if made is None:
            with self._lock:
                made = self._made.get(endpoint_url)
                if made is None:
                    made = self._made[endpoint_url] = (self._factory or client)(endpoint_url)
        return made
