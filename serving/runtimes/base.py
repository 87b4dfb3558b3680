"""The runtime interface every serving stack implements, with SageMaker hook overrides.

A runtime turns request bytes into response bytes in four steps named after the
SageMaker handler functions: `model_fn` (load), `input_fn` (decode), `predict_fn`,
`output_fn` (encode). A stack provides framework defaults; a user's
`code/inference.py` overrides any subset of the four.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.errors import ValidationError
from serving.protocol import DEFAULT_ACCEPT_ENV
from serving.runtimes import codecs
from serving.runtimes.handler import HOOK_NAMES, UserCode, load_user_code

# Default response type when a request has no Accept (SageMaker's own variable name,
# used by inference pipelines to make one container emit what the next one reads).


@dataclass
class InvocationContext:
    """Request metadata a handler may read, and the custom attributes it may set."""

    custom_attributes: str | None = None
    target_model: str | None = None
    inference_id: str | None = None
    response_custom_attributes: str | None = None
    model_resolved: bool = False  # a MultiModel container found the TargetModel to be a model and loaded it


class Runtime:
    """One loaded model behind the four SageMaker hooks; subclasses set framework defaults."""

    name = "base"
    # Modules a replica imports before its first model: a MultiModel container loads models on
    # demand, and its first request should pay for the model, not for importing the framework.
    frameworks: tuple[str, ...] = ()
    # Whether the stack may look for its model in a folder below model_dir (SageMaker's `<model>/<version>/`).
    # False for a MultiModel folder TargetModel: that folder is the model, and one below it may be another.
    nested_layouts = True

    @classmethod
    def import_frameworks(cls) -> None:
        for module in cls.frameworks:
            importlib.import_module(module)

    def __init__(self, model_dir: Path | None, environment: Mapping[str, str]) -> None:
        self.model_dir = model_dir
        self.environment = dict(environment)
        self.default_accept = self.environment.get(DEFAULT_ACCEPT_ENV, codecs.DEFAULT_ACCEPT)
        self._hooks: dict[str, Callable[..., Any]] = {}
        self._code: UserCode | None = None
        self.model: Any = None

    # --- framework defaults (override in subclasses) -------------------------------
    def model_fn(self, model_dir: Path | None) -> Any:
        """Load the model from its directory."""
        raise NotImplementedError

    def input_fn(self, body: bytes, content_type: str | None) -> Any:
        """Decode the request body."""
        return codecs.decode(body, content_type)

    def predict_fn(self, data: Any, model: Any) -> Any:
        """Run the model on decoded input."""
        raise NotImplementedError

    def output_fn(self, prediction: Any, accept: str | None) -> tuple[bytes, str]:
        """Encode the prediction; returns (body, content type)."""
        return codecs.encode(prediction, accept)

    # --- lifecycle and invocation ---------------------------------------------------
    def load(self) -> None:
        """Load user hooks (if any), then the model; called once per replica (MultiModel: per load)."""
        if self.model_dir is not None:
            self._code = load_user_code(self.model_dir)
            self._hooks = self._code.hooks if self._code is not None else {}
        try:
            self.model = self._call("model_fn", self.model_dir)
        except BaseException:
            self.unload()  # a failed load keeps none of the model's modules
            raise

    def unload(self) -> None:
        """Drop the model, its hooks and its code's modules (MultiModel eviction)."""
        self.model = None
        self._hooks = {}
        if self._code is not None:
            self._code.unload()
            self._code = None

    def invoke(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> tuple[bytes, str]:
        """Decode, predict and encode one request."""
        if not accept or codecs.media_type(accept) in ("*/*", ""):
            accept = self.default_accept
        if "output_fn" not in self._hooks:
            accept = codecs.choose_accept(accept)  # refuse a bad Accept before predicting
        data = self._call("input_fn", body, content_type, context=context)
        prediction = self._call("predict_fn", data, self.model, context=context)
        result = self._call("output_fn", prediction, accept, context=context)
        return _as_body(result, accept)

    def invoke_chunks(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> tuple[Iterator[bytes], str]:
        """Stand-in (branch stream-errors) for main's streaming invoke: an output_fn that returns a generator
        (or a (generator, content type) pair) yields the chunks; any other answer is one chunk."""
        if not accept or codecs.media_type(accept) in ("*/*", ""):
            accept = self.default_accept
        if "output_fn" not in self._hooks:
            accept = codecs.choose_accept(accept)
        data = self._call("input_fn", body, content_type, context=context)
        prediction = self._call("predict_fn", data, self.model, context=context)
        result = self._call("output_fn", prediction, accept, context=context)
        produced, produced_type = result if isinstance(result, tuple) and len(result) == 2 else (result, accept)
        if inspect.isgenerator(produced):
            chunks: Iterator[bytes] = (chunk.encode() if isinstance(chunk, str) else chunk for chunk in produced)  # type: ignore[misc]
            return chunks, produced_type
        answer, answer_type = _as_body(result, accept)
        return iter((answer,)), answer_type

    def _call(self, hook: str, *args: Any, context: InvocationContext | None = None) -> Any:
        user = self._hooks.get(hook)
        if user is None:
            return getattr(self, hook)(*args)
        if context is not None and _accepts_context(user):
            return user(*args, context)
        return user(*args)


def _accepts_context(function: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return "context" in parameters


def _as_body(result: Any, accept: str) -> tuple[bytes, str]:
    """Normalize what an output_fn returned: bytes/str, or (body, content type)."""
    content_type = accept
    if isinstance(result, tuple) and len(result) == 2:
        result, content_type = result
    if isinstance(result, str):
        result = result.encode()
    if not isinstance(result, (bytes, bytearray, memoryview)):
        raise TypeError(f"output_fn must return bytes, str or (body, content_type), got {type(result).__name__}")
    return bytes(result), content_type


__all__ = ["HOOK_NAMES", "InvocationContext", "Runtime", "ValidationError"]
