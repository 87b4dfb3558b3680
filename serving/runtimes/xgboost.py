"""XGBoost stack: a `Booster` saved by `save_model` (JSON or UBJSON), as SageMaker's built-in
XGBoost algorithm and this project's trainer write it (`xgboost-model` at the root of
`model.tar.gz`).

Without a script it answers as the algorithm's container (`sagemaker-xgboost-container`, algorithm
mode) does: CSV, LIBSVM (and JSON rows, our extension) in; CSV or `{"predictions": [{"score":
...}]}` out, or the fields `SAGEMAKER_INFERENCE_OUTPUT` selects; k-fold `xgboost-model-N` files
served as one ensemble. A pickled booster (the container's older versions) loads only with
`SERVING_ALLOW_PICKLE`. With a `code/inference.py`, the steps it leaves out are the container's
script-mode defaults (`serving.py`). See containers/xgboost/README.md.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from serving.errors import ValidationError
from serving.protocol import (
    ALLOW_PICKLE_ENV,
    CSV,
    DEFAULT_ACCEPT_ENV,
    INFERENCE_ENSEMBLE_ENV,
    INFERENCE_OUTPUT_ENV,
)
from serving.runtimes import toolkit
from serving.runtimes import xgboost_codecs as xc
from serving.runtimes.base import Runtime
from serving.runtimes.tensor_metadata import ModelTensors
from serving.runtimes.tensors import cpu_threads

logger = logging.getLogger("serving.runtimes.xgboost")

MODEL_FILE = "xgboost-model"  # the algorithm's (and the trainer's) name
BOOSTER_NAMES = (MODEL_FILE, "model.ubj", "model.json")
# an ensemble of these votes; of any other objective, averages
VOTED = ("multi:softmax", "binary:hinge")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def booster_files(model_dir: Path, ensemble: bool) -> list[Path]:
    """The booster file(s) to load, in the order this stack looks for them (README: Artifact
    layout)."""
    for name in BOOSTER_NAMES:
        if (model_dir / name).is_file():
            return [model_dir / name]
    folds = sorted(p for p in model_dir.glob(f"{MODEL_FILE}-*") if p.is_file())
    if folds:
        return folds if ensemble else folds[:1]
    found = sorted(
        p for pattern in ("*.ubj", "*.json") for p in model_dir.glob(pattern) if p.is_file()
    )
    if found:
        return found[:1]
    raise FileNotFoundError(
        f"no {MODEL_FILE} (or model.ubj, model.json, *.ubj, *.json booster) in {model_dir}"
    )


def _is_pickle(raw: bytes) -> bool:
    return raw[:1] == b"\x80"  # protocol 2 and later, which every Python 3 pickle of a booster uses


class XGBoostRuntime(Runtime):
    """Serves one XGBoost booster (or a k-fold ensemble of them)."""

    name = "xgboost"
    frameworks = ("xgboost", "scipy.sparse")
    tensor_types = (CSV, CSV)  # the container reads no NPY

    def __init__(self, model_dir: Path | None, environment: Mapping[str, str]) -> None:
        super().__init__(model_dir, environment)
        # The container's default when a request has no Accept (or */*): CSV, not JSON.
        self.default_accept = self.environment.get(DEFAULT_ACCEPT_ENV, CSV)
        self.objective = ""
        self.num_class = ""
        self.selected = (
            xc.selected_keys(self.environment[INFERENCE_OUTPUT_ENV]) if self._selectable else []
        )

    @property
    def _selectable(self) -> bool:
        return INFERENCE_OUTPUT_ENV in self.environment

    # --- model_fn ---------------------------------------------------------------------------------
    def model_fn(self, model_dir: Path | None) -> Any:
        if model_dir is None:
            raise FileNotFoundError("the xgboost stack needs ModelDataUrl")
        ensemble = self.environment.get(INFERENCE_ENSEMBLE_ENV, "true") == "true"
        boosters = [self._load_booster(path) for path in booster_files(model_dir, ensemble)]
        config = json.loads(boosters[0].save_config())["learner"]
        self.objective = config["objective"]["name"]
        self.num_class = config["learner_model_param"].get("num_class", "")
        if self._selectable and self.objective not in xc.SELECTABLE:
            raise ValueError(
                f"{INFERENCE_OUTPUT_ENV} is set, but objective {self.objective!r} has no selectable fields "
                f"(objectives that have: {', '.join(xc.SELECTABLE)})"
            )
        return boosters if len(boosters) > 1 else boosters[0]

    def _load_booster(self, path: Path) -> Any:
        import xgboost

        raw = path.read_bytes()
        booster = xgboost.Booster()
        try:
            # JSON or UBJSON, told apart by content (file names need no extension)
            booster.load_model(bytearray(raw))
        except xgboost.core.XGBoostError as error:
            if not _is_pickle(raw):
                reason = str(error).splitlines()[0] if str(error) else "unreadable"
                raise ValueError(
                    f"{path.name} is not an XGBoost model saved with Booster.save_model (JSON or UBJSON): {reason}. "
                    "XGBoost's old binary format (SageMaker XGBoost 1.3-1 to 1.7-1) does not load in XGBoost 3: convert it with "
                    "XGBoost 2 (Booster.load_model, then save_model to a .ubj name)"
                ) from None
            booster = self._unpickle(path, raw)
        threads = cpu_threads(self.environment, self.prediction_threads())
        if threads is not None:
            booster.set_param("nthread", str(threads))
        logger.info("loaded XGBoost booster %s (%d features)", path, booster.num_features())
        return booster

    def _unpickle(self, path: Path, raw: bytes) -> Any:
        """A pickled booster (the algorithm's versions before 1.3 wrote one), only when the spec
        opts in."""
        import xgboost

        if not _truthy(self.environment.get(ALLOW_PICKLE_ENV)):
            raise PermissionError(
                f"refusing to unpickle {path.name}: it is a pickled booster, and pickle runs arbitrary code. Save it "
                f"with Booster.save_model, or set Environment {ALLOW_PICKLE_ENV}: 'true' if you trust this artifact"
            )
        loaded = pickle.loads(raw)  # opted in: the operator trusts this artifact
        if isinstance(loaded, xgboost.XGBModel):
            loaded = loaded.get_booster()
        if not isinstance(loaded, xgboost.Booster):
            raise TypeError(
                f"{path.name} unpickles to {type(loaded).__name__}, not an XGBoost Booster"
            )
        return loaded

    def model_tensors(self, model: Any) -> ModelTensors:
        booster = model[0] if isinstance(model, list) else model
        features = booster.num_features() if hasattr(booster, "num_features") else -1
        classes = int(self.num_class or 0)
        scores = [-1, classes] if classes > 1 and self.objective == "multi:softprob" else [-1]
        return {
            "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [-1, features]}],
            "outputs": [{"name": "output-0", "datatype": "FP32", "shape": scores}],
        }

    # --- input_fn ---------------------------------------------------------------------------------
    def input_fn(self, body: bytes, content_type: str | None) -> Any:
        """A DMatrix of the request's rows, checked against the model's feature count."""
        import xgboost

        kind = xc.input_kind(content_type)
        if kind == "csv":
            matrix = xgboost.DMatrix(xc.parse_csv(body))
        elif kind == "libsvm":
            matrix = xgboost.DMatrix(xc.parse_libsvm(body))
        else:
            matrix = xgboost.DMatrix(xc.parse_json(body))
        self._check_features(matrix, kind)
        return matrix

    def _check_features(self, matrix: Any, kind: str) -> None:
        """The container's rule: dense rows carry the model's features or one fewer; LIBSVM indices
        stay below it."""
        boosters = self.model if isinstance(self.model, list) else [self.model]
        if not all(hasattr(booster, "num_features") for booster in boosters):
            return  # a user's model_fn returned something else: its predict_fn decides
        expected, got = boosters[0].num_features(), matrix.num_col()
        if kind == "libsvm":
            if got > expected:
                raise ValidationError(
                    f"LIBSVM feature index {got - 1} (0-based) is beyond the model's {expected} features"
                )
        elif got not in (expected, expected - 1):
            raise ValidationError(
                f"{kind.upper()} rows have {got} features; the model takes {expected}"
            )

    # --- predict_fn -------------------------------------------------------------------------------
    def predict_fn(self, data: Any, model: Any) -> Any:
        import xgboost

        if not isinstance(data, xgboost.DMatrix):
            data = xgboost.DMatrix(data)  # a user's input_fn may return an array or a SciPy matrix
        if isinstance(model, list):
            outputs = np.stack(
                [booster.predict(data, validate_features=False) for booster in model]
            )
            return _vote(outputs) if self.objective in VOTED else outputs.mean(axis=0)
        if isinstance(model, xgboost.Booster):
            return model.predict(data, validate_features=False)
        # a user's model_fn: an XGBModel (sklearn API) or anything with predict
        return model.predict(data)

    # --- output_fn --------------------------------------------------------------------------------
    def choose_accept(self, accept: str) -> str:
        return xc.choose_output(accept, self.default_accept)

    def output_fn(self, prediction: Any, accept: str | None) -> tuple[bytes, str]:
        kind = xc.choose_output(accept or self.default_accept, self.default_accept)
        predictions = np.asarray(prediction)
        if self.selected and self.objective:
            rows = xc.select(predictions, self.selected, self.objective, self.num_class)
            return xc.encode_selected(rows, self.selected, kind)
        return xc.encode_scores(predictions, kind)

    # --- the container's script mode (serving.py) -------------------------------------------------
    def script_defaults(self) -> dict[str, Callable[..., Any]]:
        # sagemaker-xgboost-container's serving.py: default_input_fn (encoder.decode),
        # default_predict_fn (model.predict(..., validate_features=False)) and default_output_fn
        # (sagemaker_containers' encoders: JSON, CSV, NPY). Where it would fail (JSON input, no
        # model_fn) the stack's own handling answers instead.
        return {"input_fn": self._container_input, "output_fn": toolkit.default_output}

    def _container_input(self, body: bytes, content_type: str | None) -> Any:
        """The container's script-mode decoding: CSV and JSON as above, LIBSVM dense with 0 where
        absent."""
        import xgboost

        if xc.input_kind(content_type) == "libsvm":
            return xgboost.DMatrix(xc.parse_libsvm(body, dense=True))
        return self.input_fn(body, content_type)


def _vote(outputs: np.ndarray) -> np.ndarray:
    """Per row, the most frequent prediction of the ensemble (the smallest on a tie, as
    scipy.stats.mode)."""
    voted = np.empty(outputs.shape[1:], dtype=outputs.dtype)
    for index in np.ndindex(*outputs.shape[1:]):
        values, counts = np.unique(outputs[(slice(None), *index)], return_counts=True)
        voted[index] = values[np.argmax(counts)]
    return voted
