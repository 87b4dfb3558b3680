"""scikit-learn stack: skops files by default, joblib/pickle only when the spec opts in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from serving.errors import ValidationError
from serving.protocol import ALLOW_PICKLE_ENV
from serving.protocol import SKLEARN_METHOD_ENV as METHOD_ENV
from serving.runtimes import toolkit
from serving.runtimes.base import Runtime
from serving.runtimes.skops_trust import load_skops
from serving.runtimes.tensor_metadata import ModelTensors, TensorMetadata
from serving.runtimes.tensors import v2_datatype

SKOPS_NAMES = ("model.skops",)
PICKLE_NAMES = ("model.joblib", "model.pkl", "model.pickle")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def to_matrix(data: Any) -> np.ndarray:
    """Rows for an estimator: TF-Serving style `{"instances": ...}` or a bare list; one row if
    1-D."""
    if isinstance(data, dict):
        for key in ("instances", "inputs"):
            if key in data:
                data = data[key]
                break
        else:
            raise ValidationError('JSON object input needs an "instances" or "inputs" field')
    try:
        array = np.asarray(data)
    except ValueError as error:
        raise ValidationError(f"input is not a rectangular array: {error}") from None
    if array.dtype == object:
        raise ValidationError("input is not a rectangular array of numbers")
    return array.reshape(1, -1) if array.ndim == 1 else array


class SklearnRuntime(Runtime):
    """Serves one scikit-learn estimator or pipeline."""

    name = "sklearn"
    frameworks = ("sklearn.pipeline", "skops.io")

    def model_fn(self, model_dir: Path | None) -> Any:
        if model_dir is None:
            raise FileNotFoundError("the sklearn stack needs ModelDataUrl")
        for name in SKOPS_NAMES:
            if (model_dir / name).is_file():
                return self._load_skops(model_dir / name)
        skops_files = sorted(model_dir.glob("*.skops"))
        if skops_files:
            return self._load_skops(skops_files[0])
        pickles = [model_dir / name for name in PICKLE_NAMES if (model_dir / name).is_file()]
        if pickles:
            if not _truthy(self.environment.get(ALLOW_PICKLE_ENV)):
                raise PermissionError(
                    f"refusing to unpickle {pickles[0].name}: pickle runs arbitrary code. Save the model with skops, "
                    f"or set Environment {ALLOW_PICKLE_ENV}: 'true' if you trust this artifact"
                )
            import joblib

            return joblib.load(pickles[0])
        raise FileNotFoundError(f"no model.skops (or opted-in model.joblib) in {model_dir}")

    def _load_skops(self, path: Path) -> Any:
        # skops' defaults, reviewed data holders, the operator's list
        return load_skops(path, self.environment)

    def input_fn(self, body: bytes, content_type: str | None) -> Any:
        return to_matrix(super().input_fn(body, content_type))

    def script_defaults(self) -> dict[str, Callable[..., Any]]:
        # sagemaker-scikit-learn-container's serving.py: default_input_fn / predict_fn / output_fn.
        # Where the container would fail (a JSON object, one row as a flat list, an Accept list) the
        # stack's own handling answers instead; where it answers, the values and bytes are the
        # container's.
        return {"input_fn": self._container_input, "output_fn": toolkit.default_output}

    def _container_input(self, body: bytes, content_type: str | None) -> Any:
        """The container's default_input_fn: decoded, as float32 for JSON and CSV."""
        array = toolkit.decode(toolkit.request_data(body, content_type), content_type)
        if not isinstance(array, np.ndarray) or array.dtype == object:
            # {"instances": ...} and other shapes the container refuses
            return self.input_fn(body, content_type)
        array = array.astype(np.float32) if content_type in toolkit.UTF8_TYPES else array
        return array.reshape(1, -1) if array.ndim == 1 else array

    def model_tensors(self, model: Any) -> ModelTensors:
        """One input of `n_features_in_` columns; the output by method: a classifier's labels, or
        floats."""
        features = getattr(model, "n_features_in_", None)
        inputs: list[TensorMetadata] = [
            {"name": "input-0", "datatype": "FP64", "shape": [-1, features if features else -1]}
        ]
        method = self._method(model)
        classes = getattr(model, "classes_", None)
        output: TensorMetadata = {"name": "output-0", "datatype": "FP64", "shape": [-1]}
        if method == "predict" and classes is not None:
            output["datatype"] = v2_datatype(np.asarray(classes).dtype)
        elif (
            method in ("predict_proba", "predict_log_proba", "decision_function")
            and classes is not None
        ):
            output["shape"] = (
                [-1, len(classes)] if len(classes) > 2 or method != "decision_function" else [-1]
            )
        elif method == "transform":
            output["shape"] = [-1, -1]
        return {"inputs": inputs, "outputs": [output]}

    def _method(self, model: Any) -> str:
        return self.environment.get(METHOD_ENV) or (
            "predict" if hasattr(model, "predict") else "transform"
        )

    def predict_fn(self, data: Any, model: Any) -> Any:
        method = self._method(model)
        if not hasattr(model, method):
            raise AttributeError(f"{type(model).__name__} has no method {method!r} ({METHOD_ENV})")
        try:
            return getattr(model, method)(data)
        except (ValueError, TypeError) as error:
            if getattr(data, "dtype", None) is not None and data.dtype.kind in "US":
                # Text is the caller's input error for a model that takes numbers (a categorical one
                # takes it).
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise ValidationError(
                    f"input holds text ({data.dtype}) that {type(model).__name__} cannot use: {reason}"
                ) from None
            raise
