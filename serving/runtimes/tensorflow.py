"""TensorFlow stack: a SavedModel (also SageMaker's `model/<version>/` layout) or a Keras `.keras`
file.

A SavedModel is called through its serving signature (`serving_default` unless
`SERVING_TF_SIGNATURE` names another), with inputs named, shaped and typed as the
signature declares. Requests may use TensorFlow Serving's JSON shapes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from serving.errors import ContainerAnswerError
from serving.protocol import TF_SIGNATURE_ENV as SIGNATURE_ENV
from serving.protocol import TFS_MODEL_NAME_ENV
from serving.runtimes import codecs, tfs, tfs_json
from serving.runtimes.base import InvocationContext
from serving.runtimes.tensor_metadata import TensorMetadata
from serving.runtimes.tensors import (
    InputSpec,
    ModelInputError,
    TensorRuntime,
    bind_inputs,
    cpu_threads,
    describe_array,
    gpu_share,
    v2_tensor,
)
from serving.runtimes.tf_import import import_keras, import_tensorflow

logger = logging.getLogger("serving.runtimes.tensorflow")

DEFAULT_SIGNATURE = "serving_default"
SAVED_MODEL_FILE = "saved_model.pb"


def find_saved_model(model_dir: Path, nested: bool = True) -> Path | None:
    """The SavedModel folder: the model directory itself, its highest numbered version folder, or,
    when `nested`, that of its only model folder (SageMaker's `<model>/<version>/` and
    `export/Servo/<version>/`)."""
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
        raise ValueError(
            f"several SavedModels in {model_dir} ({names}); a container serves one model"
        )
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
    # TF Serving's name for it: its folder's (SageMaker: /opt/ml/model/<n>/ is "model")
    model_name = "model"
    model_version: str | None = None
    _tfs_hooks: tuple[Any, Any, Any] = (None, None, None)
    _tfs_timeout = tfs.DEFAULT_WAIT_TIME_S

    @classmethod
    def import_frameworks(cls) -> None:
        import_tensorflow()

    def load(self) -> None:
        self._tfs_timeout = tfs.wait_time(self.environment)  # refused before anything loads
        tf = import_tensorflow()  # Keras only if the model or the script needs it

        self.load_code()  # its hooks decide the model threads, hence the intra-op threads of each
        threads = cpu_threads(self.environment, self.prediction_threads())
        try:
            if threads is not None:
                tf.config.threading.set_intra_op_parallelism_threads(threads)
                tf.config.threading.set_inter_op_parallelism_threads(1)
            if gpu_share(self.environment) == 0:
                # a GPU share of 0 means: leave the node's GPUs alone
                tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # only settable before TensorFlow initializes in this process
            logger.info(
                "TensorFlow already initialized in this process: thread and device settings unchanged"
            )
        super().load()

    def model_fn(self, model_dir: Path | None) -> Any:
        if model_dir is None:
            raise FileNotFoundError("the tensorflow stack needs ModelDataUrl")
        keras_files = (
            [model_dir / "model.keras"]
            if (model_dir / "model.keras").is_file()
            else sorted(model_dir.glob("*.keras"))
        )
        if keras_files:
            # Without scikit-learn for Keras' wrappers when no script, and no other model, can use
            # them.
            keras = import_keras(without_sklearn=self.only_model_in_process and self._code is None)
            # safe_mode (the default) refuses Lambda layers that would deserialize Python code.
            return keras.saving.load_model(keras_files[0], compile=False)
        saved_model = find_saved_model(model_dir, nested=self.nested_layouts)
        if saved_model is None:
            raise FileNotFoundError(
                f"no SavedModel ({SAVED_MODEL_FILE}, optionally in a numbered version folder) or .keras file in {model_dir}"
            )
        tf = import_tensorflow()

        if saved_model.name.isdigit():
            self.model_version = str(int(saved_model.name))
            if saved_model.parent != model_dir:
                self.model_name = saved_model.parent.name
        self.model_name = self.environment.get(TFS_MODEL_NAME_ENV) or self.model_name
        loaded = tf.saved_model.load(str(saved_model))
        self._signature(loaded)  # refuse at load, not per request, a model without the signature
        logger.info("loaded SavedModel %s", saved_model)
        return loaded

    def _check_hooks(self) -> None:
        # The user's code is loaded and nothing of it has run: the TFS container's rules, not the
        # toolkit's.
        module = self._code.module if self._code is not None else None
        self._tfs_hooks = tfs.resolve_handlers(module) if module is not None else (None, None, None)

    # --- SageMaker's TensorFlow Serving container -------------------------------------------------
    def invoke_chunks(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> tuple[Iterator[bytes], str]:
        if codecs.media_type(content_type) == codecs.NPY and self._tfs_hooks == (None, None, None):
            # our extension: the tensor path
            return super().invoke_chunks(body, content_type, accept, context)
        out, out_type = self._answer_as_tfs(body, content_type, accept, context)
        return iter((out,)), out_type

    def batchable(self, content_type: str | None) -> bool:
        # Only NPY without TFS handlers takes the tensor path; everything else is TF Serving's REST
        # contract.
        return codecs.media_type(content_type) == codecs.NPY and self._tfs_hooks == (
            None,
            None,
            None,
        )

    def _answer_as_tfs(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> tuple[bytes, str]:
        handler, input_handler, output_handler = self._tfs_hooks
        if handler is not None or input_handler is not None:
            ctx = tfs.make_context(
                body,
                content_type,
                accept,
                context.custom_attributes,
                self.model_name,
                context.local_api,
                self._tfs_timeout,
            )
            return tfs.call_handler(
                handler or self._pipeline(input_handler, output_handler), body, ctx
            )
        kind = codecs.media_type(content_type)
        if kind not in (*tfs.JSON_TYPES, codecs.CSV):
            raise tfs.unsupported_media_type(content_type)
        attributes = tfs.tfs_attributes(context.custom_attributes)
        status, out = self.rest_call(
            tfs.rest_path(self.model_name, attributes), tfs.predict_body(body, kind)
        )
        out, out_type = tfs.with_accept(out, accept)
        if status != 200:
            raise ContainerAnswerError(status, out, out_type)
        return out, out_type

    def _pipeline(self, input_handler: Any, output_handler: Any) -> Any:
        # python_service._make_handler, with TF Serving in process
        def handler(data: Any, context: Any) -> Any:
            sent = tfs.posted_body(input_handler(data, context), context.rest_uri)
            path = (
                context.rest_uri[context.rest_uri.index("/v1/models/") :]
                if context.rest_uri
                else None
            )
            status, out = self.rest_call(path or tfs.rest_path(self.model_name, {}), sent)
            return output_handler(tfs.response_object(status, out, context.rest_uri), context)

        return handler

    def rest_call(self, path: str, body: bytes) -> tuple[int, bytes]:
        """TF Serving's REST `POST /v1/models/<name>[/versions/<v>]:predict` on this model: (status,
        body)."""
        match = re.fullmatch(r"/v1/models/([^/:]+)(?:/versions/(\d+))?:(\w+)", path)
        if match is None:
            return 404, tfs_json.error_json(f"Malformed request: POST {path}")
        name, version, method = match.groups()
        if name != self.model_name or (
            version is not None and version.lstrip("0") != (self.model_version or "")
        ):
            wanted = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
            return 404, tfs_json.error_json(f"Servable not found for request: {wanted}")
        if method != "predict":
            return 400, tfs_json.error_json(
                f"the tensorflow stack serves :predict only, not :{method}"
            )
        try:
            form, payload, signature = tfs_json.parse_predict(body)
            inputs = bind_inputs(payload, self.input_specs(self.model, signature))
            outputs = self.run(self.model, inputs, signature)
            if not isinstance(outputs, dict):
                outputs = {"output_0": outputs}
            named = {key: np.asarray(outputs[key]) for key in sorted(outputs)}
            return 200, tfs_json.predictions_json(
                named
            ) if form == tfs_json.ROW else tfs_json.outputs_json(named)
        except (tfs_json.TfsRequestError, ModelInputError) as error:
            return 400, tfs_json.error_json(str(error))
        except Exception as error:  # the model itself failed
            logger.exception("TF Serving predict failed")
            return 500, tfs_json.error_json(f"{type(error).__name__}: {error}")

    def _signature(self, model: Any, requested: str | None = None) -> Any:
        name = requested or self.environment.get(SIGNATURE_ENV) or DEFAULT_SIGNATURE
        signatures = getattr(model, "signatures", None) or {}
        if requested and requested not in signatures:
            raise tfs_json.TfsRequestError(
                f'Serving signature name: "{requested}" not found in signature def'
            )
        if name not in signatures:
            raise ValueError(
                f"the SavedModel has no signature {name!r} (it has: {', '.join(signatures) or 'none'}); "
                f"set {SIGNATURE_ENV}"
            )
        return signatures[name]

    # --- inputs and inference ------------------------------------------------------------
    def input_specs(self, model: Any, signature: str | None = None) -> list[InputSpec]:
        if _is_keras(model):
            return [
                InputSpec(_keras_name(t), tuple(t.shape), _np_dtype(t.dtype)) for t in model.inputs
            ]
        _, named = self._signature(model, signature).structured_input_signature
        return [
            InputSpec(
                name,
                tuple(spec.shape.as_list()) if spec.shape.rank is not None else None,
                _np_dtype(spec.dtype),
            )
            for name, spec in named.items()
        ]

    def output_tensors(self, model: Any) -> list[TensorMetadata]:
        if _is_keras(model):
            return [
                v2_tensor(_keras_name(t), _np_dtype(t.dtype), tuple(t.shape)) for t in model.outputs
            ]
        named = self._signature(model).structured_outputs
        return [
            v2_tensor(
                name,
                _np_dtype(spec.dtype),
                tuple(spec.shape.as_list()) if spec.shape.rank is not None else None,
            )
            for name, spec in named.items()
        ]

    def run(self, model: Any, inputs: dict[str, np.ndarray], signature: str | None = None) -> Any:
        tf = import_tensorflow()

        try:
            if _is_keras(model):
                arrays = list(inputs.values())
                output = model(arrays[0] if len(arrays) == 1 else inputs, training=False)
            else:
                output = self._signature(model, signature)(
                    **{name: tf.constant(array) for name, array in inputs.items()}
                )
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as error:
            given = ", ".join(f"{name} {describe_array(array)}" for name, array in inputs.items())
            message = getattr(error, "message", None) or str(error)
            raise ModelInputError(
                f"the model failed on input {given}: {_last_line(message)}"
            ) from error
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
        line.strip()
        for line in message.strip().splitlines()
        if line.strip() and not line.strip().startswith("[[")
    ]
    informative = [
        line
        for line in lines
        if not line.startswith(("Detected at node", "<stack traces", "Graph execution"))
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
