"""What the tensor stacks (pytorch, tensorflow, onnx) share: request shapes, input checks, CPU/GPU
share.

A request is a plain array, an object keyed by input name, or a TensorFlow Serving
document (`{"instances": ...}` row format, `{"inputs": ...}` columnar format). Each
input is checked against what the model declares (name, rank, fixed dimensions,
dtype) before the framework runs, so a mismatch is reported as such instead of as a
framework stack trace. Frameworks are never imported here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.protocol import CPUS_ENV, GPUS_ENV, THREADS_ENV, V2_DATATYPES
from serving.runtimes import codecs
from serving.runtimes.base import Runtime
from serving.runtimes.tensor_metadata import ModelTensors, TensorMetadata

logger = logging.getLogger("serving.runtimes")


# TensorFlow Serving's request keys and the response key each one gets.
TF_SERVING_KEYS = {"instances": "predictions", "inputs": "outputs"}


class ModelInputError(ValueError):
    """The input does not fit the model (name, shape or dtype); the caller gets 424 ModelError with
    this text."""


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, shape (None for a dynamic dimension or unknown rank) and dtype."""

    name: str
    shape: tuple[int | None, ...] | None = None
    dtype: np.dtype | None = None

    def describe(self) -> str:
        dims = (
            "?"
            if self.shape is None
            else "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"
        )
        return f"{self.name} ({self.dtype.name if self.dtype is not None else 'any dtype'} {dims})"


# --- CPU and GPU share -------------------------------------------------------------------
def cpu_threads(environment: Mapping[str, str], predictions: int = 1) -> int | None:
    """Intra-op threads per prediction (at least 1): the container's CPU share divided among the
    `predictions` its replica runs at once (its model threads), so that all of them together use the
    cores it reserved and no more; None when the share is unknown. Oversubscribed, the framework's
    threads spin and wait for each other: on 2 cores, two model threads of 2 intra-op threads each
    cost a 32-row MLP batch 1.4-2× the CPU of 1 each."""
    override = environment.get(THREADS_ENV)
    if override:
        if not override.isdigit() or int(override) < 1:
            raise ValueError(
                f"{THREADS_ENV} must be a whole number of at least 1, got {override!r}"
            )
        return int(override)
    cpus = environment.get(CPUS_ENV)
    if not cpus:
        return None
    # A fractional reservation still runs on at least one core; never use more cores than reserved.
    return max(1, math.floor(float(cpus) / max(1, predictions)))


def gpu_share(environment: Mapping[str, str]) -> float:
    """GPUs reserved for the container (0 when none or unknown)."""
    return float(environment.get(GPUS_ENV) or 0)


# --- request shapes ----------------------------------------------------------------------
def split_request(data: Any) -> tuple[Any, str | None]:
    """The inputs of a decoded request, and the TF Serving response key to wrap the answer in (or
    None)."""
    if not isinstance(data, dict):
        return data, None
    for key, response_key in TF_SERVING_KEYS.items():
        if key in data:
            payload = data[key]
            if (
                key == "instances"
                and isinstance(payload, list)
                and payload
                and all(isinstance(r, dict) for r in payload)
            ):
                names = list(payload[0])
                if any(list(row) != names for row in payload):
                    raise ModelInputError('every row of "instances" must name the same inputs')
                payload = {name: [row[name] for row in payload] for name in names}
            return payload, response_key
    return data, None  # an object keyed by input name


def bind_inputs(payload: Any, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    """One checked array per model input, in the model's input order."""
    expected = ", ".join(spec.describe() for spec in specs)
    if isinstance(payload, dict):
        missing = [spec.name for spec in specs if spec.name not in payload]
        unknown = [name for name in payload if name not in {spec.name for spec in specs}]
        if missing:
            raise ModelInputError(
                f"missing input {', '.join(map(repr, missing))}; the model takes: {expected}"
            )
        if unknown:
            raise ModelInputError(
                f"unknown input {', '.join(map(repr, unknown))}; the model takes: {expected}"
            )
        return {spec.name: conform(payload[spec.name], spec) for spec in specs}
    if len(specs) != 1:
        raise ModelInputError(
            f"the model takes {len(specs)} inputs: send a JSON object keyed by input name ({expected})"
        )
    return {specs[0].name: conform(payload, specs[0])}


def conform(value: Any, spec: InputSpec) -> np.ndarray:
    """`value` as an array of the input's dtype and shape; a single instance gets a batch axis."""
    try:
        array = np.asarray(value)
    except ValueError as error:
        raise ModelInputError(f"input {spec.name!r} is not a rectangular array: {error}") from None
    if array.dtype == object:
        raise ModelInputError(f"input {spec.name!r} is not a rectangular array of numbers")
    array = _cast(array, spec)
    if spec.shape is None:
        return array
    rank = len(spec.shape)
    if array.ndim == rank - 1:
        array = array[np.newaxis, ...]  # one instance, as a batch of one
    if array.ndim != rank or any(
        want is not None and want != got for want, got in zip(spec.shape, array.shape)
    ):
        raise ModelInputError(
            f"input {spec.name!r} has shape {list(array.shape)}; the model takes {spec.describe()}"
        )
    return array


def _cast(array: np.ndarray, spec: InputSpec) -> np.ndarray:
    target = spec.dtype
    if target is None:
        # JSON and CSV numbers decode as float64/int64; models are float32 unless they say
        # otherwise.
        return array.astype(np.float32) if array.dtype == np.float64 else array
    if array.dtype == target:
        return array
    # TensorFlow strings map to object
    text_in, text_wanted = array.dtype.kind in "US", target.kind in "USO"
    if text_in and text_wanted:
        return array
    if text_in:
        raise ModelInputError(f"input {spec.name!r} holds text; the model takes {spec.describe()}")
    if text_wanted:
        raise ModelInputError(
            f"input {spec.name!r} holds numbers; the model takes {spec.describe()}"
        )
    if target.kind in "iub" and array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise ModelInputError(
                f"input {spec.name!r} holds non-integer values; the model takes {spec.describe()}"
            )
    if (
        target.kind in "iu"
        and array.size
        and (array.min() < np.iinfo(target).min or array.max() > np.iinfo(target).max)
    ):
        raise ModelInputError(f"input {spec.name!r} has values out of range for {target.name}")
    return array.astype(target)


def wrap_outputs(outputs: Any, response_key: str | None) -> Any:
    """The answer: one output as is, several by name; wrapped as TF Serving would when it was asked
    that way."""
    if isinstance(outputs, dict) and len(outputs) == 1:
        outputs = next(iter(outputs.values()))
    if response_key is None:
        return outputs
    if response_key == "predictions" and isinstance(outputs, dict):
        # Row format: one object per instance, keyed by output name (an output without a batch axis
        # repeats).
        rows = max((len(value) for value in outputs.values() if np.ndim(value) > 0), default=1)
        outputs = [
            {
                name: value[i] if np.ndim(value) > 0 and len(value) == rows else value
                for name, value in outputs.items()
            }
            for i in range(rows)
        ]
    return {response_key: outputs}


def describe_array(array: np.ndarray) -> str:
    return f"{array.dtype.name} {list(array.shape)}"


def v2_datatype(dtype: np.dtype) -> str:
    """The Open Inference datatype of a NumPy dtype (text, bytes and objects: BYTES)."""
    kinds = {np.dtype(value): key for key, value in V2_DATATYPES.items() if value != "object"}
    return kinds.get(dtype, "BYTES")


def v2_tensor(name: str, dtype: np.dtype | None, shape: tuple | None) -> TensorMetadata:
    """One tensor of Open Inference metadata; an unknown dtype is FP32 (what numbers become for
    these stacks), an unknown rank one dimension of any size."""
    datatype = "FP32" if dtype is None else v2_datatype(np.dtype(dtype))
    dims = [-1] if shape is None else [-1 if d is None else int(d) for d in shape]
    return {"name": name, "datatype": datatype, "shape": dims}


class TensorRuntime(Runtime):
    """Defaults shared by the tensor stacks; subclasses load the model and run it on checked
    arrays."""

    def input_specs(self, model: Any) -> list[InputSpec]:
        """What `model` takes, in call order."""
        raise NotImplementedError

    def run(self, model: Any, inputs: dict[str, np.ndarray]) -> Any:
        """Call the model; returns an array, or arrays by output name."""
        raise NotImplementedError

    def output_tensors(self, model: Any) -> list[TensorMetadata]:
        """The model's outputs as Open Inference metadata, where the framework declares them."""
        return []

    def model_tensors(self, model: Any) -> ModelTensors:
        inputs = [v2_tensor(spec.name, spec.dtype, spec.shape) for spec in self.input_specs(model)]
        return {"inputs": inputs, "outputs": self.output_tensors(model)}

    def predict_fn(self, data: Any, model: Any) -> Any:
        payload, response_key = split_request(data)
        inputs = bind_inputs(payload, self.input_specs(model))
        return wrap_outputs(self.run(model, inputs), response_key)

    def batch_rows(self, data: Any) -> Any:
        """A plain array request for a one-input model, checked and given its batch axis as
        predict_fn would; TF Serving documents and inputs by name keep their own shape (they run
        alone). With a user's script the decoded input is merged as it is."""
        if self.scripted:
            return super().batch_rows(data)
        payload, response_key = split_request(data)
        if response_key is not None or isinstance(payload, dict):
            return None
        try:
            inputs = bind_inputs(payload, self.input_specs(self.model))
        except ValueError:  # the request alone gets the error it gets today
            return None
        return super().batch_rows(next(iter(inputs.values())))

    def output_fn(self, prediction: Any, accept: str | None) -> tuple[bytes, str]:
        # CSV and NPY cannot carry TF Serving's wrapper object: send what it wraps.
        if (
            codecs.choose_accept(accept) != codecs.JSON
            and isinstance(prediction, dict)
            and len(prediction) == 1
        ):
            key = next(iter(prediction))
            if key in TF_SERVING_KEYS.values():
                prediction = prediction[key]
        return codecs.encode(prediction, accept)


__all__ = [
    "InputSpec",
    "ModelInputError",
    "TensorRuntime",
    "bind_inputs",
    "conform",
    "cpu_threads",
    "gpu_share",
    "split_request",
    "wrap_outputs",
]
