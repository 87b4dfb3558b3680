"""LightGBM stack: a `Booster` saved as LightGBM's text model (`Booster.save_model`), as this
project's trainer writes it (`model.txt` at the root of `model.tar.gz`).

SageMaker has no LightGBM framework container (its LightGBM is a JumpStart built-in algorithm), so
the stack's own steps are the contract, the sklearn stack's: JSON rows (`[[...]]`, one flat row,
`{"instances": rows}` or `{"inputs": rows}`; null is a missing value), CSV or NPY in; JSON or NPY out,
one prediction per row: `Booster.predict` on the rows, so probabilities for a classifier, or the
raw scores with `SERVING_LIGHTGBM_OUTPUT: raw`. A pickled booster or scikit-learn-API model
(`LGBMClassifier`, ...) loads only with `SERVING_ALLOW_PICKLE`. See containers/lightgbm/README.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from serving.errors import ValidationError
from serving.protocol import ALLOW_PICKLE_ENV, LIGHTGBM_OUTPUT_ENV
from serving.runtimes import codecs
from serving.runtimes.base import Runtime
from serving.runtimes.tensor_metadata import ModelTensors
from serving.runtimes.tensors import cpu_threads

logger = logging.getLogger("serving.runtimes.lightgbm")

MODEL_FILE = "model.txt"  # the trainer's name
TEXT_NAMES = (MODEL_FILE, "model.lgb", "lightgbm-model")
TEXT_SUFFIXES = ("*.txt", "*.lgb")
PICKLE_NAMES = ("model.pkl", "model.pickle", "model.joblib")
# every text model LightGBM writes starts with this line (the C++ GBDT::SaveModelToString)
TEXT_HEADER = b"tree\n"
OUTPUTS = ("probability", "raw")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def output_mode(environment: Mapping[str, str]) -> str:
    """`probability` (the default: what `Booster.predict` answers) or `raw` (its raw scores)."""
    value = environment.get(LIGHTGBM_OUTPUT_ENV, OUTPUTS[0]).strip().lower()
    if value not in OUTPUTS:
        raise ValueError(
            f"{LIGHTGBM_OUTPUT_ENV} must be one of {', '.join(OUTPUTS)}, "
            f"got {environment[LIGHTGBM_OUTPUT_ENV]!r}"
        )
    return value


def _is_text_model(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(len(TEXT_HEADER) + 1).replace(b"\r\n", b"\n").startswith(TEXT_HEADER)


def model_file(model_dir: Path) -> Path:
    """The model file to load, in the order this stack looks for it (containers/lightgbm/README.md:
    Artifact layout): a fixed name, else the one `*.txt` / `*.lgb` file that is a LightGBM text
    model, else a pickle."""
    for name in TEXT_NAMES:
        if (model_dir / name).is_file():
            return model_dir / name
    found = sorted(
        p
        for pattern in TEXT_SUFFIXES
        for p in model_dir.glob(pattern)
        if p.is_file() and _is_text_model(p)
    )
    if len(found) > 1:
        raise FileNotFoundError(
            f"several LightGBM text models in {model_dir} ({', '.join(p.name for p in found)}): "
            f"name the one to serve {MODEL_FILE}"
        )
    if found:
        return found[0]
    for name in PICKLE_NAMES:
        if (model_dir / name).is_file():
            return model_dir / name
    raise FileNotFoundError(
        f"no {MODEL_FILE} (or model.lgb, lightgbm-model, one *.txt / *.lgb LightGBM text model, "
        f"or an opted-in {' / '.join(PICKLE_NAMES)}) in {model_dir}"
    )


def to_rows(data: Any) -> np.ndarray:
    """Rows of numbers for a booster: a list of rows (a flat list is one row), `{"instances": rows}`
    or `{"inputs": rows}`, or an array; null is a missing value (NaN), as LightGBM reads it."""
    if isinstance(data, dict):
        key = next((k for k in ("instances", "inputs") if k in data), None)
        if key is None:
            raise ValidationError('JSON object input needs an "instances" or "inputs" field')
        data = data[key]
    if isinstance(data, np.ndarray) and data.dtype in (np.float32, np.float64):
        array = data  # as LightGBM reads it: no copy
    else:
        try:
            array = np.array(data, dtype=np.float64)
        except (ValueError, TypeError) as error:
            raise ValidationError(f"input is not a rectangular array of numbers: {error}") from None
    if array.ndim == 1:
        array = array.reshape(1, -1)
    if array.ndim != 2 or 0 in array.shape:
        raise ValidationError(f"input must be rows of features; got shape {list(array.shape)}")
    return array


class LightGBMRuntime(Runtime):
    """Serves one LightGBM booster."""

    name = "lightgbm"
    frameworks = ("lightgbm",)

    def __init__(self, model_dir: Path | None, environment: Mapping[str, str]) -> None:
        super().__init__(model_dir, environment)
        self.output = OUTPUTS[0]
        self.predict_params: dict[str, Any] = {}

    def load(self) -> None:
        # before any model: a bad setting is the container's error whichever hook loads the model
        self.output = output_mode(self.environment)
        super().load()

    # --- model_fn ---------------------------------------------------------------------------------
    def model_fn(self, model_dir: Path | None) -> Any:
        if model_dir is None:
            raise FileNotFoundError("the lightgbm stack needs ModelDataUrl")
        path = model_file(model_dir)
        booster = self._unpickle(path) if path.name in PICKLE_NAMES else self._load_text(path)
        threads = cpu_threads(self.environment, self.prediction_threads())
        self.predict_params = {"num_threads": threads} if threads is not None else {}
        logger.info(
            "loaded LightGBM booster %s (%d features, objective %s)",
            path,
            booster.num_feature(),
            booster.params.get("objective", "?"),
        )
        return booster

    def _load_text(self, path: Path) -> Any:
        import lightgbm

        try:
            return lightgbm.Booster(model_file=str(path))
        except lightgbm.basic.LightGBMError as error:
            reason = str(error).splitlines()[0] if str(error) else "unreadable"
            raise ValueError(
                f"{path.name} is not a LightGBM text model (Booster.save_model): {reason}"
            ) from None

    def _unpickle(self, path: Path) -> Any:
        """A pickled (or joblib) Booster or scikit-learn-API model, only when the spec opts in."""
        import lightgbm

        if not _truthy(self.environment.get(ALLOW_PICKLE_ENV)):
            raise PermissionError(
                f"refusing to unpickle {path.name}: pickle runs arbitrary code. Save the booster with "
                f"Booster.save_model (a text model, {MODEL_FILE}), or set Environment "
                f"{ALLOW_PICKLE_ENV}: 'true' if you trust this artifact"
            )
        import joblib

        loaded = joblib.load(
            path
        )  # opted in: the operator trusts this artifact (reads pickles too)
        if isinstance(loaded, lightgbm.LGBMModel):
            loaded = loaded.booster_
        if not isinstance(loaded, lightgbm.Booster):
            raise TypeError(
                f"{path.name} unpickles to {type(loaded).__name__}, not a LightGBM Booster or model"
            )
        return loaded

    def model_tensors(self, model: Any) -> ModelTensors:
        """One FP64 input of the booster's features; one FP64 output, a row of scores per class for
        a multiclass objective."""
        classes = model.num_model_per_iteration()
        return {
            "inputs": [{"name": "input-0", "datatype": "FP64", "shape": [-1, model.num_feature()]}],
            "outputs": [
                {
                    "name": "output-0",
                    "datatype": "FP64",
                    "shape": [-1, classes] if classes > 1 else [-1],
                }
            ],
        }

    # --- input_fn ---------------------------------------------------------------------------------
    def input_fn(self, body: bytes, content_type: str | None) -> Any:
        """The request's rows as a float array, checked against the booster's feature count."""
        rows = to_rows(codecs.decode(body, content_type))
        expected = self.model.num_feature() if hasattr(self.model, "num_feature") else None
        if expected is not None and rows.shape[1] != expected:
            raise ValidationError(f"rows have {rows.shape[1]} features; the model takes {expected}")
        return rows

    # --- predict_fn -------------------------------------------------------------------------------
    def predict_fn(self, data: Any, model: Any) -> Any:
        import lightgbm

        if isinstance(model, lightgbm.Booster):
            return model.predict(data, raw_score=self.output == "raw", **self.predict_params)
        return model.predict(data)  # a user's model_fn returned something else
