"""SageMaker's TensorFlow Serving container contract: request conversion, handler context, handlers.

Mirrors `sagemaker-tensorflow-serving-container`: without `code/inference.py`, its nginx module
(`tensorflowServing.js`) turns JSON, JSON lines and CSV bodies into a TF Serving `:predict` request
and passes TF Serving's answer back (newlines removed when the Accept names a JSON type). With one,
its `python_service.py` calls `handler(data, context)`, or `input_handler` → TF Serving →
`output_handler`, where `data` is the request stream and `context` the namedtuple built by
`tfs_utils.parse_request`; as the TF Serving DLC's current `python_service.py`, it carries `timeout`
(SAGEMAKER_TFS_WAIT_TIME_SECONDS, default 55 for its one TF Serving instance), which the container's
handlers, and scripts written for it, post to `context.rest_uri` with.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections import namedtuple
from collections.abc import Callable, Mapping
from typing import Any

from serving.errors import ContainerAnswerError, without_capabilities
from serving.protocol import CSV, JSON, JSON_LINES, JSONS, TFS_WAIT_TIME_ENV

logger = logging.getLogger("serving.runtimes.tfs")

# tfs_utils.Context, field for field (the DLC's, aws/deep-learning-containers, which added `timeout`).
Context = namedtuple(
    "Context",
    "model_name, model_version, method, rest_uri, grpc_port, channel, "
    "custom_attributes, request_content_type, accept_header, content_length, timeout",
)
# python_service.py's SAGEMAKER_TFS_WAIT_TIME_SECONDS default: 55 // SAGEMAKER_TFS_INSTANCE_COUNT, one
# instance here
DEFAULT_WAIT_TIME_S = 55
# What SageMaker's TFS container reads from `code/inference.py`.
TFS_HANDLERS = ("handler", "input_handler", "output_handler")
# The SageMaker inference toolkit's hooks, which that container does not call: refused, never
# ignored.
TOOLKIT_HOOKS = (
    "model_fn",
    "input_fn",
    "predict_fn",
    "output_fn",
    "transform_fn",
    "pre_model_fn",
    "model_warmup_fn",
)
_ATTRIBUTE = re.compile(r"(tfs-[a-z\-]+=[^,]+)")
JSON_TYPES = (JSON, JSON_LINES, JSONS)


class GrpcNotOffered:
    """`context.grpc_port` / `context.channel`: this runtime has no gRPC port; any use says so."""

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError(
            "the tensorflow stack offers no TF Serving gRPC port (context.grpc_port / context.channel): "
            "post to context.rest_uri instead"
        )

    __getattr__ = __call__ = __str__ = __format__ = __int__ = __index__ = __iter__ = _refuse

    def __repr__(self) -> str:
        return "<gRPC not offered>"


NO_GRPC = GrpcNotOffered()


def tfs_attributes(custom_attributes: str | None) -> dict[str, str]:
    """The `tfs-model-name`, `tfs-model-version`, `tfs-method` entries of the custom attributes."""
    found = _ATTRIBUTE.findall(custom_attributes or "")
    return dict(item.split("=", 1) for item in found if item.count("=") == 1)


def rest_path(model_name: str, attributes: dict[str, str]) -> str:
    """tfs_utils.make_tfs_uri's path: `/v1/models/<name>[/versions/<v>]:<method>`."""
    path = f"/v1/models/{attributes.get('tfs-model-name', model_name)}"
    if attributes.get("tfs-model-version"):
        path += "/versions/" + attributes["tfs-model-version"]
    return path + ":" + attributes.get("tfs-method", "predict")


def wait_time(environment: Mapping[str, str]) -> int:
    """`context.timeout`: SAGEMAKER_TFS_WAIT_TIME_SECONDS, whole seconds (ValueError naming it for
    anything else)."""
    value = environment.get(TFS_WAIT_TIME_ENV) or str(DEFAULT_WAIT_TIME_S)
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"{TFS_WAIT_TIME_ENV} must be a whole number of seconds >= 1, not {value!r}"
        )
    return int(value)


def make_context(
    body: bytes,
    content_type: str | None,
    accept: str | None,
    custom: str | None,
    model_name: str,
    base: str | None,
    timeout: int = DEFAULT_WAIT_TIME_S,
) -> Any:
    """tfs_utils.parse_request's context; `base` is where this process reaches its TF Serving REST
    API, `timeout` its handlers' wait for it (`wait_time`)."""
    attributes = tfs_attributes(custom)
    return Context(
        attributes.get("tfs-model-name"),
        attributes.get("tfs-model-version"),
        attributes.get("tfs-method"),
        base + rest_path(model_name, attributes) if base else None,
        NO_GRPC,
        NO_GRPC,
        custom,
        content_type or JSON,
        accept or JSON,
        len(body),
        timeout,
    )


# --- without user code: tensorflowServing.js ------------------------------------------------------
def predict_body(body: bytes, content_type: str) -> bytes:
    """The `:predict` body the container's nginx module makes of a JSON, JSON-lines or CSV
    request."""
    data = body.decode("utf-8", "surrogateescape")
    if content_type == CSV:
        converted = _csv_request(data)
    elif re.search(r'"(instances|inputs|examples)"\s*:', data):
        converted = data
    elif re.search(r"[}\]]\s*[\[{]", data):
        converted = _json_lines_request(data)
    else:
        converted = (
            '{"instances":' + (data if re.match(r"\s*\[\s*\[", data) else "[" + data + "]") + "}"
        )
    return converted.encode("utf-8", "surrogateescape")


def _lines(data: str) -> list[str]:
    return re.split(r"\r?\n", data.strip())


def _json_lines_request(data: str) -> str:
    lines = _lines(data)
    parts = ['{"instances":', "[" if len(lines) != 1 else ""]
    for number, line in enumerate(lines):
        if line.strip():
            parts.append(("" if number == 0 else ",") + line.strip())
    parts.append("}" if len(lines) == 1 else "]}")
    return "".join(parts)


def _csv_request(data: str) -> str:
    # A first field that is neither quoted nor numeric makes every line a list of strings (as the JS
    # does: its `replace` changes only the first quote and the first comma of a line, and so does
    # this).
    needs_quotes = re.match(r'\s*("|[\d.Ee+\-]+.*)', data) is None
    lines = _lines(data)
    parts = ['{"instances":[']
    for number, raw in enumerate(lines):
        line = raw.strip()
        if not line:
            continue
        several = "," in line
        item = (
            '"' + line.replace('"', '\\"', 1).replace(",", '","', 1) + '"' if needs_quotes else line
        )
        parts.append("[" + item + "]" if several else item)
        if number != len(lines) - 1:
            parts.append(",")
    parts.append("]}")
    return "".join(parts)


def unsupported_media_type(content_type: str | None) -> ContainerAnswerError:
    message = "Unsupported Media Type: " + (content_type or "Unknown")
    return ContainerAnswerError(415, ('{"error": "' + message + '"}').encode(), JSON)


def with_accept(body: bytes, accept: str | None) -> tuple[bytes, str]:
    """The JS callback: an Accept naming a JSON type gets the body without newlines, as its first
    type."""
    if accept is not None:
        types = accept.strip().replace(" ", "", 1).split(",")
        if JSON_LINES in types or JSON in types:
            return body.replace(b"\n", b""), types[0]
    return body, JSON


# --- with user code: python_service.py ------------------------------------------------------------
def resolve_handlers(
    module: Any,
) -> tuple[Callable[..., Any] | None, Callable[..., Any] | None, Callable | None]:
    """(handler, input_handler, output_handler) as `_import_handlers` picks them; raises what it
    refuses."""
    defined = {
        name for name in TFS_HANDLERS + TOOLKIT_HOOKS if callable(getattr(module, name, None))
    }
    toolkit = [name for name in TOOLKIT_HOOKS if name in defined]
    if toolkit:
        raise ValueError(
            f"code/inference.py defines {', '.join(toolkit)}: the tensorflow stack follows SageMaker's TensorFlow "
            "Serving container, which does not call these hooks; write handler(data, context), or "
            "input_handler(data, context) and output_handler(response, context)"
        )
    if "handler" in defined:
        ignored = [name for name in ("input_handler", "output_handler") if name in defined]
        if ignored:
            logger.warning(
                "code/inference.py defines handler and %s: handler is used and %s not called, as in SageMaker's "
                "TensorFlow Serving container",
                " and ".join(ignored),
                "they are" if len(ignored) > 1 else "it is",
            )
        return module.handler, None, None
    if "input_handler" in defined and "output_handler" in defined:
        return None, module.input_handler, module.output_handler
    if "input_handler" in defined or "output_handler" in defined:
        missing = "output_handler" if "input_handler" in defined else "input_handler"
        raise ValueError(
            f"code/inference.py defines {({'input_handler', 'output_handler'} - {missing}).pop()} but not {missing}: "
            "SageMaker's TensorFlow Serving container needs both (or handler) and refuses this script "
            '("Handlers are not implemented correctly in user script.")'
        )
    # ours; the container would refuse the script
    if not callable(getattr(module, "autoscaling_metrics", None)):
        raise ValueError(
            "code/inference.py defines no handler: SageMaker's TensorFlow Serving container needs handler(data, "
            "context), or input_handler and output_handler, and refuses this script"
        )
    return None, None, None


def call_handler(handler: Callable[..., Any], body: bytes, context: Any) -> tuple[bytes, str]:
    """`handler(data, context)` → (body, content type); a failure is the container's 500 `{"error":
    str(e)}`, less the URL of this process's TF Serving route (`context.rest_uri`, whose token is a
    capability)."""
    try:
        out, content_type = handler(io.BytesIO(body), context)
        if isinstance(out, str):
            out = out.encode()
        return bytes(out), content_type or JSON
    except Exception as error:
        logger.exception("code/inference.py handler failed")
        raise ContainerAnswerError(
            500, json.dumps({"error": without_capabilities(str(error))}).encode(), JSON
        ) from error


def response_object(status: int, content: bytes, url: str | None) -> Any:
    """What `requests.post(context.rest_uri, ...)` returns for a TF Serving answer: a
    `requests.Response`."""
    import requests

    response = requests.Response()
    response.status_code = status
    response._content = content
    response.headers["Content-Type"] = JSON
    response.encoding = "utf-8"
    response.url = url or ""
    response.reason = requests.status_codes._codes.get(status, ("",))[0].replace("_", " ").title()
    return response


def posted_body(processed: Any, url: str | None) -> bytes:
    """The bytes `requests.post(url, data=processed)` sends (a dict is form-encoded, a str as
    Latin-1)."""
    import requests

    body: Any = requests.Request("POST", url or "http://localhost/", data=processed).prepare().body
    if body is None:
        return b""
    return body.encode("iso-8859-1") if isinstance(body, str) else bytes(body)


__all__ = [
    "NO_GRPC",
    "Context",
    "call_handler",
    "make_context",
    "posted_body",
    "predict_body",
    "resolve_handlers",
    "response_object",
    "tfs_attributes",
    "unsupported_media_type",
    "wait_time",
    "with_accept",
]
