"""TensorFlow stack: a SavedModel (also SageMaker's `model/<version>/` layout) or a Keras `.keras` file.

A SavedModel is called through its serving signature (`serving_default` unless
`SERVING_TF_SIGNATURE` names another), with inputs named, shaped and typed as the
signature declares. Requests may use TensorFlow Serving's JSON shapes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from serving.protocol import TF_SIGNATURE_ENV as SIGNATURE_ENV
from serving.runtimes.tensors import (
    InputSpec,
    ModelInputError,
    TensorRuntime,
    cpu_threads,
    describe_array,
    gpu_share,
)

logger = logging.getLogger("serving.runtimes.tensorflow")

DEFAULT_SIGNATURE = "serving_default"
SAVED_MODEL_FILE = "saved_model.pb"


def find_saved_model(model_dir: Path, nested: bool = True) -> Path | None:
    """The SavedModel folder: the model directory itself, its highest numbered version folder, or, when
    `nested`, that of its only model folder (SageMaker's `<model>/<version>/` and `export/Servo/<version>/`)."""
    if (model_dir / SAVED_MODEL_FILE).is_file():
        return model_dir
    versioned = _highest_version(model_dir)
    if versioned is not None or not nested:
        return versioned
    candidates = []
    for child in sorted(model_dir.iterdir()):
        if child.is_dir() and child.name != "code":
            found = child if (child / SAVED_MODEL_FILE).is_file() else _highest_version(child)
            if found is None and (child / "Servo").is_dir():
                found = _highest_version(child / "Servo")
            if found is not None:
                candidates.append(found)
    if len(candidates) > 1:
        names = ", ".join(str(path.relative_to(model_dir)) for path in candidates)
        raise ValueError(f"several SavedModels in {model_dir} ({names}); a container serves one model")
    return candidates[0] if candidates else None


def _highest_version(folder: Path) -> Path | None:
    versions = [
        child
        for child in folder.iterdir()
        if child.is_dir() and child.name.isdigit() and (child / SAVED_MODEL_FILE).is_file()
    ]
    return max(versions, key=lambda child: int(child.name)) if versions else None


class TensorFlowRuntime(TensorRuntime):
    """Serves one TensorFlow SavedModel signature or Keras model."""

    name = "tensorflow"
    frameworks = ("tensorflow",)

    def load(self) -> None:
        import tensorflow as tf

        threads = cpu_threads(self.environment)
        try:
            if threads is not None:
                tf.config.threading.set_intra_op_parallelism_threads(threads)
                tf.config.threading.set_inter_op_parallelism_threads(1)
            if gpu_share(self.environment) == 0:
                tf.config.set_visible_devices([], "GPU")  # a GPU share of 0 means: leave the node's GPUs alone
        except RuntimeError:  # only settable before TensorFlow initializes in this process
            logger.info("TensorFlow already initialized in this process: thread and device settings unchanged")
        super().load()

    def model_fn(self, model_dir: Path | None) -> Any:
        if model_dir is None:
            raise FileNotFoundError("the tensorflow stack needs ModelDataUrl")
        keras_files = (
            [model_dir / "model.keras"] if (model_dir / "model.keras").is_file() else sorted(model_dir.glob("*.keras"))
        )
        if keras_files:
            import keras

            # safe_mode (the default) refuses Lambda layers that would deserialize Python code.
            return keras.saving.load_model(keras_files[0], compile=False)
        saved_model = find_saved_model(model_dir, nested=self.nested_layouts)
        if saved_model is None:
            raise FileNotFoundError(
                f"no SavedModel ({SAVED_MODEL_FILE}, optionally in a numbered version folder) or .keras file in {model_dir}"
            )
        import tensorflow as tf

        loaded = tf.saved_model.load(str(saved_model))
        self._signature(loaded)  # refuse at load, not per request, a model without the signature
        logger.info("loaded SavedModel %s", saved_model)
        return loaded

    def _signature(self, model: Any) -> Any:
        name = self.environment.get(SIGNATURE_ENV) or DEFAULT_SIGNATURE
        signatures = getattr(model, "signatures", None) or {}
        if name not in signatures:
            raise ValueError(
                f"the SavedModel has no signature {name!r} (it has: {', '.join(signatures) or 'none'}); "
                f"set {SIGNATURE_ENV}"
            )
        return signatures[name]

    # --- inputs and inference ------------------------------------------------------------
    def input_specs(self, model: Any) -> list[InputSpec]:
        if _is_keras(model):
            return [InputSpec(_keras_name(t), tuple(t.shape), _np_dtype(t.dtype)) for t in model.inputs]
        _, named = self._signature(model).structured_input_signature
        return [
            InputSpec(name, tuple(spec.shape.as_list()) if spec.shape.rank is not None else None, _np_dtype(spec.dtype))
            for name, spec in named.items()
        ]

    def run(self, model: Any, inputs: dict[str, np.ndarray]) -> Any:
        import tensorflow as tf

        try:
            if _is_keras(model):
                arrays = list(inputs.values())
                output = model(arrays[0] if len(arrays) == 1 else inputs, training=False)
            else:
                output = self._signature(model)(**{name: tf.constant(array) for name, array in inputs.items()})
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as error:
            given = ", ".join(f"{name} {describe_array(array)}" for name, array in inputs.items())
            message = getattr(error, "message", None) or str(error)
            raise ModelInputError(f"the model failed on input {given}: {_last_line(message)}") from error
        return _to_numpy(output)


def _is_keras(model: Any) -> bool:
    return hasattr(model, "inputs") and hasattr(model, "predict_on_batch")


def _keras_name(tensor: Any) -> str:
    return str(tensor.name).split(":")[0]


def _np_dtype(dtype: Any) -> np.dtype | None:
    try:
        return np.dtype(getattr(dtype, "as_numpy_dtype", dtype))
    except TypeError:
        return None


def _last_line(message: str) -> str:
    lines = [
        line.strip() for line in message.strip().splitlines() if line.strip() and not line.strip().startswith("[[")
    ]
    informative = [
        line for line in lines if not line.startswith(("Detected at node", "<stack traces", "Graph execution"))
    ]
    return (informative or lines or [message])[0]


def _to_numpy(value: Any) -> Any:
    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, dict):
        return {key: _to_numpy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_numpy(item) for item in value]
    return value
