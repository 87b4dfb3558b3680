"""An MLflow model directory loaded as a pyfunc model, and which flavors load without trusting it.

`mlflow.pyfunc.load_model` runs whatever the artifact's `MLmodel` names: its `loader_module`, code
folders put first on `sys.path`, cloudpickled `PythonModel`s, pickled estimators, and for skops a
trusted-types list read from the artifact itself. So only one flavor loads from an untrusted
artifact here: a scikit-learn model saved in the skops format, read through this package's skops
trust (`skops_trust`: its reviewed types and `SERVING_SKOPS_TRUSTED_TYPES`, not the artifact's list)
and wrapped as mlflow wraps it. Every other flavor loads through mlflow only with the opt-in the
other stacks use for pickle formats, `SERVING_ALLOW_PICKLE`. See docs/security.md.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serving.protocol import ALLOW_PICKLE_ENV
from serving.runtimes.skops_trust import load_skops

logger = logging.getLogger("serving.runtimes.mlflow")

MLMODEL = "MLmodel"
PYFUNC = "python_function"
PYTHON_MODEL_LOADER = "mlflow.pyfunc.model"  # a custom PythonModel
# mlflow's own switch for the formats it unpickles; set only while an opted-in model loads
MLFLOW_PICKLE_SWITCH = "MLFLOW_ALLOW_PICKLE_DESERIALIZATION"
_SWITCH_LOCK = threading.Lock()

# A flavor's loader module -> the module its framework imports as (the container must have it).
FRAMEWORKS = {
    "mlflow.sklearn": "sklearn",
    "mlflow.xgboost": "xgboost",
    "mlflow.lightgbm": "lightgbm",
    "mlflow.catboost": "catboost",
    "mlflow.pytorch": "torch",
    "mlflow.tensorflow": "tensorflow",
    "mlflow.keras": "keras",
    "mlflow.onnx": "onnxruntime",
    "mlflow.transformers": "transformers",
    "mlflow.sentence_transformers": "sentence_transformers",
    "mlflow.statsmodels": "statsmodels",
    "mlflow.prophet": "prophet",
    "mlflow.pmdarima": "pmdarima",
    "mlflow.spacy": "spacy",
    "mlflow.h2o": "h2o",
    "mlflow.paddle": "paddle",
    "mlflow.spark": "pyspark",
    "mlflow.johnsnowlabs": "sparknlp",
    "mlflow.langchain": "langchain",
    "mlflow.llama_index": "llama_index",
    "mlflow.dspy": "dspy",
}


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def model_root(model_dir: Path, nested: bool) -> Path:
    """The folder holding `MLmodel`: the model directory, or (SageMaker's `model.tar.gz` of one
    folder) its one subfolder that holds one."""
    if (model_dir / MLMODEL).is_file():
        return model_dir
    below = sorted(path.parent for path in model_dir.glob(f"*/{MLMODEL}") if path.is_file())
    if nested and len(below) == 1:
        return below[0]
    where = f" (found in {len(below)} subfolders: name one)" if len(below) > 1 else ""
    raise FileNotFoundError(f"no {MLMODEL} file in {model_dir}{where}")


def load_pyfunc(model_dir: Path, environment: Mapping[str, str], nested: bool = True) -> Any:
    """The `PyFuncModel` of an MLflow model directory; PermissionError for a flavor that would run
    the artifact's code without `SERVING_ALLOW_PICKLE`, ImportError for one whose framework the
    container lacks."""
    from mlflow.models import Model

    root = model_root(model_dir, nested)
    meta = Model.load(str(root / MLMODEL))  # YAML through safe_load: no code
    conf = meta.flavors.get(PYFUNC)
    if not isinstance(conf, dict):
        raise ValueError(
            f"{root / MLMODEL} has no {PYFUNC} flavor (flavors: {', '.join(meta.flavors) or 'none'}): "
            "mlflow.pyfunc cannot serve it"
        )
    loader = str(conf.get("loader_module") or "")
    flavor = flavor_name(meta, loader)
    # a module name the artifact chose is not looked up (which imports its parents) before the
    # opt-in
    known = loader in FRAMEWORKS or loader == PYTHON_MODEL_LOADER
    if known:
        check_framework(loader, flavor)
    if _is_skops_sklearn(meta, conf, loader):
        return _skops_pyfunc(root, meta, conf, environment)
    if not _truthy(environment.get(ALLOW_PICKLE_ENV)):
        raise PermissionError(
            f"refusing to load the MLflow model in {root.name}: {_risk(meta, conf, loader)}. Save a "
            f"scikit-learn model with serialization_format='skops', or set Environment {ALLOW_PICKLE_ENV}: "
            "'true' if you trust this artifact"
        )
    if not known:
        check_framework(loader, flavor)
    return _load_trusted(root, flavor)


def flavor_name(meta: Any, loader: str) -> str:
    """The flavor a loader module serves (`mlflow.sklearn` -> `sklearn`), as MLmodel names it."""
    short = loader.rpartition(".")[2]
    return short if short in meta.flavors else PYFUNC


def check_framework(loader: str, flavor: str) -> None:
    """Fail at load, naming the flavor, where the container lacks its loader or its framework."""
    if not loader:
        raise ValueError(f"the {PYFUNC} flavor of MLmodel names no loader_module")
    missing = [
        name
        for name in (loader, FRAMEWORKS.get(loader))
        if name is not None and not _importable(name)
    ]
    if missing:
        raise ImportError(
            f"the MLflow model's {flavor} flavor (loader_module {loader}) needs {missing[-1]!r}, "
            "which this container does not have: serve it from a container that installs it",
            name=missing[-1],
        )


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing
        return False


def _is_skops_sklearn(meta: Any, conf: Mapping[str, Any], loader: str) -> bool:
    sklearn = meta.flavors.get("sklearn") or {}
    return (
        loader == "mlflow.sklearn"
        and sklearn.get("serialization_format") == "skops"
        and not conf.get("code")
        and isinstance(conf.get("model_path"), str)
    )


def _risk(meta: Any, conf: Mapping[str, Any], loader: str) -> str:
    """Why loading this flavor from an untrusted artifact could run its code."""
    if conf.get("code"):
        return f"it puts its own code folder ({conf['code']}) first on sys.path"
    if loader == PYTHON_MODEL_LOADER:
        model = conf.get("python_model", "")
        if str(model).endswith(".py"):
            return f"its PythonModel is Python code ({model}) that loading runs"
        return f"its PythonModel ({model or 'python_model.pkl'}) is unpickled with cloudpickle"
    if loader == "mlflow.sklearn":
        fmt = (meta.flavors.get("sklearn") or {}).get("serialization_format", "pickle")
        return f"its sklearn flavor is saved with {fmt}, which runs code when loaded"
    return (
        f"its loader_module {loader} is not one this stack loads from an untrusted artifact "
        "(only scikit-learn in the skops format is)"
    )


def _contained(root: Path, relative: str) -> Path:
    """`relative` inside `root`, refusing a path that leaves it (`..`, absolute, a link out)."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise PermissionError(
            f"{MLMODEL} names a model file outside the model directory: {relative}"
        )
    return path


def _skops_pyfunc(root: Path, meta: Any, conf: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    """mlflow's pyfunc wrapper of a skops estimator read through the stack's skops trust (mlflow's
    own loader would trust the types the artifact lists, and wants its pickle switch for skops)."""
    from mlflow.pyfunc import PyFuncModel
    from mlflow.sklearn import _SklearnModelWrapper

    estimator = load_skops(_contained(root, conf["model_path"]), env)
    model = PyFuncModel(
        model_meta=meta,
        model_impl=_SklearnModelWrapper(estimator),
        predict_fn=conf.get("predict_fn", "predict"),
        model_id=meta.model_id,
    )
    try:  # as mlflow.pyfunc.load_model does; a JSON file (no code)
        model.input_example = meta.load_input_example(path=str(root))
    except Exception as error:  # an example is optional
        logger.debug("no input example loaded from %s: %s", root, error)
    return model


def _load_trusted(root: Path, flavor: str) -> Any:
    """mlflow's own loader, for an artifact the operator trusts (SERVING_ALLOW_PICKLE)."""
    import mlflow.pyfunc

    with _SWITCH_LOCK:
        before = os.environ.get(MLFLOW_PICKLE_SWITCH)
        os.environ[MLFLOW_PICKLE_SWITCH] = "true"
        try:
            return mlflow.pyfunc.load_model(str(root), suppress_warnings=True)
        except ModuleNotFoundError as error:  # a module the flavor's loader imports
            raise ImportError(
                f"the MLflow model's {flavor} flavor needs {error.name!r}, which this container "
                "does not have: serve it from a container that installs it",
                name=error.name,
            ) from error
        finally:
            if before is None:
                os.environ.pop(MLFLOW_PICKLE_SWITCH, None)
            else:
                os.environ[MLFLOW_PICKLE_SWITCH] = before
