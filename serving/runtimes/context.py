"""The handler context: what SageMaker's model servers hand a hook that takes one more argument.

The inference toolkit passes its model server's context (MMS / TorchServe `Context`) to any hook
with one parameter more than the hook's usual ones, whatever that parameter is called. Scripts read
`context.system_properties["model_dir"]` and `["gpu_id"]`, request headers through
`context.request_processor[0].get_request_properties()` or `context.get_request_header(0, name)`,
and set the answer's status, content type and headers through `set_response_*`. This class offers
the same methods (request index 0: one request per call here), plus this runtime's own fields
(`custom_attributes`, `target_model`, `inference_id`, `response_custom_attributes`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

SERVER_NAME = "serving"


class SystemProperties(TypedDict, total=False):
    """`context.system_properties`, the keys MMS / TorchServe fill (all of them, or none before the
    runtime gives a request's context its load-time ones)."""

    model_dir: str | None
    gpu_id: int | None  # None on a container without a GPU
    batch_size: int
    server_name: str
    server_version: str
    limit_max_image_pixels: bool
    model_name: str | None


class ManifestModel(TypedDict):
    modelName: str | None  # noqa: N815 (TorchServe's key)


class Manifest(TypedDict):
    """`context.manifest`: what TorchServe's MAR manifest says of the model (its name only,
    here)."""

    model: ManifestModel


class Headers(dict):
    """Request headers looked up case-insensitively (scripts ask for "Accept" and "accept"
    alike)."""

    def __init__(self, headers: Mapping[str, str] | None = None) -> None:
        super().__init__((key.lower(), value) for key, value in (headers or {}).items())

    @classmethod
    def from_asgi(cls, raw: Sequence[tuple[bytes, bytes]]) -> Headers:
        """An ASGI scope's headers. Of a repeated name the first counts, as for Starlette's
        `Headers.get`, so that whoever checks a header (a hop's signature) and whoever reads it (the
        model) see the same value."""
        headers = cls()
        dict.update(
            headers,
            [
                (key.decode("latin-1").lower(), value.decode("latin-1"))
                for key, value in reversed(raw)
            ],
        )
        return headers

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


class RequestProcessor:
    """MMS's per-request view: the request's headers, and where a status for the answer is
    reported."""

    def __init__(self, context: InvocationContext) -> None:
        self._context = context

    def get_request_properties(self) -> Headers:
        return self._context.headers

    def get_request_property(self, key: str) -> str | None:
        return self._context.headers.get(key)

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self._context.set_response_status(code, reason_phrase or "")

    def add_response_property(self, key: str, value: str) -> None:
        self._context.set_response_header(0, key, value)


@dataclass
class InvocationContext:
    """One request's metadata for the hooks, and what they may set on the answer."""

    custom_attributes: str | None = None
    target_model: str | None = None
    inference_id: str | None = None
    response_custom_attributes: str | None = None
    # a MultiModel container found the TargetModel to be a model and loaded it
    model_resolved: bool = False
    # where this process reaches its own model's TF Serving REST API (tensorflow)
    local_api: str | None = None
    headers: Headers = field(default_factory=Headers)
    system_properties: SystemProperties = field(default_factory=lambda: SystemProperties())
    model_name: str | None = None
    response_status: int = 200
    response_phrase: str = ""
    response_content_type: str | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    # A traced hop's steps (name, start and end in ns since the epoch): None unless the gateway
    # asked (a signed `traceparent`), so an untraced request times nothing.
    steps: list[tuple[str, int, int]] | None = None
    batch_size: int | None = None  # requests whose rows went into the model call that answered

    def step(self, name: str, started_ns: int) -> None:
        """Note a traced step that began at `started_ns` and ends now."""
        if self.steps is not None:
            self.steps.append((name, started_ns, time.time_ns()))

    @classmethod
    def for_request(cls, headers: Mapping[str, str], **fields: Any) -> InvocationContext:
        return cls(headers=Headers(headers), **fields)

    # --- the MMS / TorchServe Context methods scripts call (idx is always 0 here) -----------------
    @property
    def request_processor(self) -> list[RequestProcessor]:
        return [RequestProcessor(self)]

    @property
    def manifest(self) -> Manifest:
        return {"model": {"modelName": self.model_name}}

    def get_request_id(self, idx: int = 0) -> str | None:
        return self.inference_id

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self.headers.get(key)

    def get_all_request_header(self, idx: int = 0) -> Headers:
        return self.headers

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.response_content_type = value

    def get_response_content_type(self, idx: int = 0) -> str | None:
        return self.response_content_type

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.response_status, self.response_phrase = int(code), phrase

    def get_response_status(self, idx: int = 0) -> tuple[int, str]:
        return self.response_status, self.response_phrase

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self.response_headers[str(key)] = str(value)

    def get_response_headers(self, idx: int = 0) -> dict[str, str]:
        return self.response_headers


def system_properties(
    model_dir: str | None, gpus: float, model_name: str | None = None
) -> SystemProperties:
    """`context.system_properties` as MMS fills it: `gpu_id` is None on a container without a
    GPU."""
    return {
        "model_dir": model_dir,
        "gpu_id": 0 if gpus > 0 else None,
        "batch_size": 1,
        "server_name": SERVER_NAME,
        "server_version": _version(),
        "limit_max_image_pixels": True,
        "model_name": model_name,
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("serving")
    except PackageNotFoundError:
        return "0"
