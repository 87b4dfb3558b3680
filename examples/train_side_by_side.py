"""The models of `side-by-side.yaml`, each saved by its own tool from data a package ships:

- `churn-mlflow`: a scikit-learn pipeline on the breast-cancer table, logged by `mlflow.sklearn.save_model`
  (an `MLmodel` folder in the skops format, its signature inferred from the DataFrame);
- `ranker-lightgbm`: a LightGBM LambdaRank booster on the diabetes table, queries of ten rows with
  relevance the target's quartile, saved as LightGBM's text model (`model.txt`);
- `tiny-classifier` (and `tiny-lm`): `examples/train_transformers.py`'s `save_pretrained` folders;
- `iris-sklearn`: a skops scikit-learn classifier, the existing stacks' kind.

    python examples/train_side_by_side.py [OUT_DIR]   (default examples/models)
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _train_transformers(out: Path) -> dict[str, Path]:
    spec = importlib.util.spec_from_file_location(
        "train_transformers", HERE / "train_transformers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.train(out)


def churn(out: Path) -> Path:
    import mlflow.sklearn
    from mlflow.models import infer_signature
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    frame = load_breast_cancer(as_frame=True)
    x, y = frame.data, frame.target
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x, y)
    folder = out / "churn-mlflow"
    mlflow.sklearn.save_model(
        model,
        str(folder),
        signature=infer_signature(x, model.predict(x)),
        pip_requirements=["scikit-learn", "skops"],  # written out: inferring them runs the model
    )
    return folder


def ranker(out: Path) -> Path:
    import lightgbm as lgb
    import numpy as np
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    rows = len(x) - len(x) % 10
    x, y = x[:rows], y[:rows]
    relevance = np.digitize(y, np.quantile(y, [0.25, 0.5, 0.75]))
    data = lgb.Dataset(x, label=relevance, group=[10] * (rows // 10))
    parameters = {"objective": "lambdarank", "num_leaves": 15, "verbose": -1, "seed": 0}
    booster = lgb.train(parameters, data, num_boost_round=30)
    folder = out / "ranker-lightgbm"
    folder.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(folder / "model.txt"))
    return folder


def iris(out: Path) -> Path:
    import skops.io
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    folder = out / "iris-sklearn"
    folder.mkdir(parents=True, exist_ok=True)
    skops.io.dump(LogisticRegression(max_iter=1000).fit(x, y), folder / "model.skops")
    return folder


def train(out: Path) -> dict[str, Any]:
    """Every model under `out`, by folder name."""
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mlflow's and transformers' notices about themselves
        return {
            "churn-mlflow": churn(out),
            "ranker-lightgbm": ranker(out),
            "iris-sklearn": iris(out),
            **_train_transformers(out),
        }


if __name__ == "__main__":
    for name, folder in train(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "models").items():
        print(f"{name}: {folder}")
