"""Endpoint descriptions as anyone may read them: `GET /endpoints/{name}` answers without
authentication.

A description can name files of the server's machine: a local DataCaptureConfig destination (a spec
may name a folder), and failure reasons that quote an exception (`No such file or directory:
'/home/alice/models/...'`). Those tell a caller who only reached the port where the server keeps its
data and whose home it runs in. So the gateway shows each local path as `.../<its last name>`:
enough to tell which file a failure is about, not where it lies. `s3://` locations are not paths of
this machine and stay whole (SageMaker's DescribeEndpoint shows the destination URI). Where the full
text is: the spec, the server's log, and the control-plane API's DescribeEndpoint for signed
callers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from serving.control.records import EndpointDescription

__all__ = ["public_description", "without_local_paths"]

_NAME = r"[^\s'\"`:,;()\[\]{}<>|/]+"
# file:///a/b, or /a/b and ~/a/b with at least one folder, not inside a word or a URL
# (s3://bucket/key, a/b, HTTP/1.1)
_LOCAL_PATH = re.compile(rf"file://(?:/{_NAME})+/?|(?<![\w.:/~-])~?(?:/{_NAME}){{2,}}/?")


def _shortened(match: re.Match[str]) -> str:
    return ".../" + match.group(0).rstrip("/").rsplit("/", 1)[-1]


def without_local_paths(text: str) -> str:
    """`text` with each local path shown as `.../<its last name>`."""
    return _LOCAL_PATH.sub(_shortened, text) if "/" in text else text


def public_description(description: EndpointDescription) -> EndpointDescription:
    """A copy of a DescribeEndpoint-shaped `description` that names no path of this machine."""
    public: EndpointDescription = _scrubbed(description)
    capture = public.get("DataCaptureConfig")
    destination = capture.get("DestinationS3Uri") if capture is not None else None
    # a folder
    if capture is not None and isinstance(destination, str) and not destination.startswith("s3://"):
        capture["DestinationS3Uri"] = (
            ".../" + destination.removeprefix("file://").rstrip("/").rsplit("/", 1)[-1]
        )
    return public


def _scrubbed(value: Any) -> Any:
    if isinstance(value, str):
        return without_local_paths(value)
    if isinstance(value, Mapping):
        return {key: _scrubbed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrubbed(item) for item in value]
    return value
