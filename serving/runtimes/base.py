"""The runtime interface every serving stack implements, with SageMaker's handler contract.

A runtime turns request bytes into response bytes in the steps named after the SageMaker handler
functions: `model_fn` (load), `input_fn` (decode), `predict_fn`, `output_fn` (encode), or
`transform_fn` (all three at once). A stack provides defaults; a user's script (`code/inference.py`,
or `SAGEMAKER_PROGRAM` in `SAGEMAKER_SUBMIT_DIRECTORY`) overrides any subset, called as AWS's
inference toolkit calls them (`transformer.py`): a hook with one parameter more than usual gets the
context (`runtimes.context`), `input_fn` gets `str` for exactly `application/json` / `text/csv` and
`bytes` otherwise, `model_fn` gets the model directory as a `str`. With a script, the steps it
leaves out are the ones that stack's SageMaker container would run (`script_defaults`); without one,
the stack's own defaults run (named, checked inputs; see docs/sagemaker-compatibility.md).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from serving.errors import ValidationError
from serving.protocol import (
    DEFAULT_ACCEPT_ENV,
    GPUS_ENV,
    JSON,
    NPY,
    PROGRAM_ENV,
    SUBMIT_DIRECTORY_ENV,
    TENSOR_SIGNATURE_ENV,
)
from serving.runtimes import codecs, toolkit
from serving.runtimes.answers import answer_chunks, is_stream
from serving.runtimes.context import InvocationContext, system_properties
from serving.runtimes.handler import HOOK_NAMES, UserCode, load_user_code
from serving.runtimes.script_hooks import (
    BATCH_OPT_IN,
    SCRIPT_HOOKS,
    call_hook,
    check_hooks,
    check_requirements,
    parameter_count,
)
from serving.runtimes.tensor_metadata import ModelTensors, TensorSignature


class Runtime:
    """One loaded model behind the SageMaker hooks; subclasses set framework defaults."""

    name = "base"
    # Modules a replica imports before its first model: a MultiModel container loads models on
    # demand, and its first request should pay for the model, not for importing the framework.
    frameworks: tuple[str, ...] = ()
    # Whether the stack may look for its model in a folder below model_dir (SageMaker's
    # `<model>/<version>/`). False for a MultiModel folder TargetModel: that folder is the model,
    # and one below it may be another.
    nested_layouts = True
    # The script hooks this stack runs; a script defining any other hook of HOOK_NAMES is refused at
    # load.
    supported_hooks: tuple[str, ...] = (*SCRIPT_HOOKS, "autoscaling_metrics")
    # the hooks' context.model_name: a MultiModel container's TargetModel
    model_name: str | None = None
    # True where this is the only model its process will load (a container process without
    # MultiModel): a stack may then leave out imports that only another model or a script could use
    # (tensorflow: Keras' sklearn wrappers).
    only_model_in_process = False
    # Where a stack reports events of its own (`model_server.events.EventLog`), set by the container
    # process: the huggingface stack's time to first token and tokens per second.
    events: Any = None
    # How an Open Inference request's one numeric tensor reaches the stack's own handlers, and the
    # Accept it answers
    tensor_types = (NPY, f"{NPY}, {JSON}")

    @classmethod
    def import_frameworks(cls) -> None:
        for module in cls.frameworks:
            importlib.import_module(module)

    def __init__(self, model_dir: Path | None, environment: Mapping[str, str]) -> None:
        self.model_dir = model_dir
        self.environment = dict(environment)
        self.default_accept = self.environment.get(DEFAULT_ACCEPT_ENV, codecs.DEFAULT_ACCEPT)
        self._hooks: dict[str, Callable[..., Any]] = {}
        self._arity: dict[str, int | None] = {}
        self._code: UserCode | None = None
        self._code_loaded = False
        self.model: Any = None
        self.load_context = InvocationContext()

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

    def choose_accept(self, accept: str) -> str:
        """The response type the stack's own `output_fn` answers an Accept with; refuses one it
        cannot encode."""
        return codecs.choose_accept(accept)

    def tensor_signature(self) -> TensorSignature:
        """The model's tensors for Open Inference metadata: `{"inputs": [...], "outputs": [...]}`,
        each `{"name", "datatype", "shape"}` (-1: any size), and the `content_type` / `accept` that
        carry one tensor to and from it. The container's declaration (TENSOR_SIGNATURE_ENV) wins;
        else the stack's reading of the loaded model (`model_tensors`), empty where a script's hooks
        decide (which then get JSON)."""
        body, accept = (JSON, JSON) if self.scripted else self.tensor_types
        signature: TensorSignature = {
            "inputs": [],
            "outputs": [],
            "content_type": body,
            "accept": accept,
        }
        declared = self.environment.get(TENSOR_SIGNATURE_ENV)
        if declared:
            # checked when the spec was read (config.container): `inputs`, `outputs` or both
            tensors = json.loads(declared)
            signature["inputs"] = tensors.get("inputs", [])
            signature["outputs"] = tensors.get("outputs", [])
            return signature
        if not self.scripted and self.model is not None:
            # a model the stack cannot describe is still served
            with contextlib.suppress(Exception):
                read = self.model_tensors(self.model)
                signature["inputs"], signature["outputs"] = read["inputs"], read["outputs"]
        return signature

    def model_tensors(self, model: Any) -> ModelTensors:
        """What the stack can tell of a loaded model's inputs and outputs (override per stack)."""
        return {"inputs": [], "outputs": []}

    def script_defaults(self) -> dict[str, Callable[..., Any]]:
        """The steps this stack's SageMaker container runs where a user's script leaves them out
        (input_fn, predict_fn, output_fn); a step not named here uses the stack's own default."""
        return {}

    # --- lifecycle and invocation ---------------------------------------------------
    @property
    def scripted(self) -> bool:
        """Whether a user's script was loaded (its missing steps then follow the SageMaker
        container)."""
        return self._code is not None

    def load(self) -> None:
        """Load the user's script (if any), then the model; called once per replica (MultiModel: per
        load)."""
        model_dir = str(self.model_dir) if self.model_dir is not None else None
        gpus = float(self.environment.get(GPUS_ENV) or 0)
        self.load_context = InvocationContext(
            system_properties=system_properties(model_dir, gpus, self.model_name),
            model_name=self.model_name,
        )
        self.load_code()
        try:
            self._check_hooks()
            self._check_requirements()
            if "pre_model_fn" in self._hooks:
                self._run_hook("pre_model_fn", self.load_context, model_dir)
            if "model_fn" in self._hooks:
                self.model = self._run_hook("model_fn", self.load_context, model_dir)
            else:
                self.model = self.model_fn(self.model_dir)
            if "model_warmup_fn" in self._hooks:
                self._run_hook("model_warmup_fn", self.load_context, model_dir, self.model)
        except BaseException:
            self.unload()  # a failed load keeps none of the model's modules
            raise

    def load_code(self) -> None:
        """Import the user's script, if any, once: which hooks it has decides how many predictions
        run at once, which a stack needs to know before its framework starts
        (`prediction_threads`)."""
        if self._code_loaded:
            return
        self._code = load_user_code(
            self.model_dir,
            self.environment.get(PROGRAM_ENV),
            self.environment.get(SUBMIT_DIRECTORY_ENV),
        )
        self._hooks = self._code.hooks if self._code is not None else {}
        # once, not per call
        self._arity = {name: parameter_count(function) for name, function in self._hooks.items()}
        self._code_loaded = True

    def hook(self, name: str) -> Callable[[], Any] | None:
        """The script's `name` hook bound to the loaded model (`autoscaling_metrics`: `hook()` calls
        `autoscaling_metrics(model)`), or None when the script defines none: what callers outside
        this package ask instead of reading the runtime's fields."""
        function = self._hooks.get(name)
        return None if function is None else partial(function, self.model)

    def prediction_threads(self) -> int:
        """Predictions this container runs at once (`concurrency.model_threads`), once its script is
        loaded."""
        from serving.runtimes.concurrency import model_threads

        return model_threads(self.name, self.environment, scripted=self.runs_request_hooks())

    def _check_requirements(self) -> None:
        check_requirements(self._code)

    def _check_hooks(self) -> None:
        """Refuse a hook this stack would not run (the tensorflow stack: by the TFS container's
        rules)."""
        check_hooks(self._hooks, self.supported_hooks, self.name)

    def unload(self) -> None:
        """Drop the model, its hooks and its code's modules (MultiModel eviction)."""
        self.model = None
        self._hooks = {}
        self._code_loaded = False
        if self._code is not None:
            self._code.unload()
            self._code = None

    def invoke(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> tuple[bytes, str]:
        """Decode, predict and encode one request: the whole answer."""
        chunks, response_type = self.invoke_chunks(body, content_type, accept, context)
        return b"".join(chunks), response_type

    def invoke_chunks(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> tuple[Iterator[bytes], str]:
        """Decode, predict and encode one request; the answer in chunks. A `predict_fn`, `output_fn`
        or `transform_fn` that returns a generator streams: each item is a chunk. Otherwise one
        chunk."""
        if "transform_fn" in self._hooks:
            accept = self._request_accept(accept, context)
            data = toolkit.request_data(body, content_type)
            started = time.time_ns()
            result = self._run_hook("transform_fn", context, self.model, data, content_type, accept)
            context.step("transform", started)
            return self._answer(result, accept, context)
        if context.steps is None:
            data, accept = self.decode(body, content_type, accept, context)
            return self.encode_chunks(self.predict(data, context), accept, context)
        started = time.time_ns()  # a traced hop: each step's time, for the gateway's spans
        data, accept = self.decode(body, content_type, accept, context)
        context.step("decode", started)
        started = time.time_ns()
        prediction = self.predict(data, context)
        context.step("predict", started)
        started = time.time_ns()
        answer = self.encode_chunks(prediction, accept, context)
        context.step("encode", started)
        return answer

    # --- the steps one at a time (dynamic batching merges what `decode` gives, then splits the
    # prediction) ---
    def _request_accept(self, accept: str | None, context: InvocationContext) -> str:
        if not accept or codecs.media_type(accept) in ("*/*", ""):
            accept = self.default_accept
        context.system_properties = context.system_properties or self.load_context.system_properties
        context.model_name = context.model_name or self.model_name
        return accept

    def decode(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> tuple[Any, str]:
        """input_fn of one request, and the Accept its answer will be encoded for (not for
        transform_fn)."""
        accept = self._request_accept(accept, context)
        defaults = self.script_defaults() if self.scripted else {}
        if "output_fn" not in self._hooks and "output_fn" not in defaults:
            accept = self.choose_accept(accept)  # refuse a bad Accept before predicting
        if "input_fn" in self._hooks:
            return self._run_hook(
                "input_fn", context, toolkit.request_data(body, content_type), content_type
            ), accept
        return defaults.get("input_fn", self.input_fn)(body, content_type), accept

    def predict(self, data: Any, context: InvocationContext) -> Any:
        """predict_fn on decoded input (one request's, or a batch's rows)."""
        return self._step(
            "predict_fn", self.script_defaults() if self.scripted else {}, context, data, self.model
        )

    def encode_chunks(
        self, prediction: Any, accept: str, context: InvocationContext
    ) -> tuple[Iterator[bytes], str]:
        """output_fn of one request's prediction; a generator prediction streams."""
        defaults = self.script_defaults() if self.scripted else {}
        if is_stream(prediction) and "output_fn" not in self._hooks:
            encode = defaults.get("output_fn", self.output_fn)
            return answer_chunks((encode(item, accept) for item in prediction), accept, context)
        result = self._step("output_fn", defaults, context, prediction, accept)
        return self._answer(result, accept, context)

    def encode(self, prediction: Any, accept: str, context: InvocationContext) -> tuple[bytes, str]:
        """output_fn of one request's prediction: the whole answer."""
        chunks, response_type = self.encode_chunks(prediction, accept, context)
        return b"".join(chunks), response_type

    # --- dynamic batching -------------------------------------------------------------------------
    def accepts_batches(self) -> bool:
        """Whether predict_fn may get several requests' rows at once: the stack's own steps do; a
        user's script that defines input_fn, predict_fn or output_fn must say so (`accepts_batches =
        True`); transform_fn never (it does every step at once)."""
        if "transform_fn" in self._hooks:
            return False
        return self._declares_batches() or not {"input_fn", "predict_fn", "output_fn"} & set(
            self._hooks
        )

    def _declares_batches(self) -> bool:
        module = self._code.module if self._code is not None else None
        return getattr(module, BATCH_OPT_IN, False) is True

    def runs_request_hooks(self) -> bool:
        """Whether a user's script runs per request (any hook but loading and metrics): its code is
        then not assumed thread-safe, and the replica runs one prediction at a time unless
        SERVING_MODEL_THREADS says so."""
        return bool(
            set(self._hooks)
            - {"model_fn", "pre_model_fn", "model_warmup_fn", "autoscaling_metrics"}
        )

    def batchable(self, content_type: str | None) -> bool:
        """Whether a request of this content type goes through decode / predict / encode (a stack
        with another path for some types, as the tensorflow stack's TF Serving one, says no for
        those)."""
        return True

    def batch_rows(self, data: Any) -> Any:
        """Decoded input as rows to merge along the first axis (a NumPy array or a torch tensor with
        at least one axis), or None when it cannot be merged with others (a dict, a list, a DMatrix,
        a scalar)."""
        return data if _rows_of(data) is not None else None

    def _step(
        self,
        hook: str,
        defaults: Mapping[str, Callable[..., Any]],
        context: InvocationContext,
        *args: Any,
    ):
        if hook in self._hooks:
            return self._run_hook(hook, context, *args)
        return defaults.get(hook, getattr(self, hook))(*args)

    def _run_hook(self, hook: str, context: InvocationContext, *args: Any) -> Any:
        return call_hook(hook, self._hooks[hook], self._arity.get(hook), context, *args)

    def _answer(
        self, result: Any, accept: str, context: InvocationContext
    ) -> tuple[Iterator[bytes], str]:
        return answer_chunks(result, accept, context)


def _rows_of(data: Any) -> int | None:
    """Row count of an array or tensor with a batch axis (None for anything else)."""
    shape = getattr(data, "shape", None)
    if shape is None or not len(shape):
        return None
    if isinstance(data, np.ndarray):
        return None if data.dtype == object else int(shape[0])
    return int(shape[0]) if type(data).__module__.startswith("torch") else None


__all__ = [
    "BATCH_OPT_IN",
    "HOOK_NAMES",
    "SCRIPT_HOOKS",
    "InvocationContext",
    "Runtime",
    "ValidationError",
]
