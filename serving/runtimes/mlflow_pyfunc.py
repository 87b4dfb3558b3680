"""MLflow stack: an MLflow model directory (`MLmodel` at its root) served through `mlflow.pyfunc`,
speaking MLflow's scoring protocol as `mlflow models serve` does (`mlflow_scoring`).

The model's signature is enforced by mlflow's pyfunc wrapper (column names, types, required inputs,
params): a violation is a 400 naming the column. The signature is the Open Inference metadata. Only
a scikit-learn model saved with skops loads from an untrusted artifact; every other flavor needs
`SERVING_ALLOW_PICKLE` (`mlflow_artifacts`, docs/security.md). A flavor whose framework the
container lacks fails at load, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.protocol import JSON
from serving.runtimes import mlflow_scoring as scoring
from serving.runtimes.base import Runtime
from serving.runtimes.mlflow_artifacts import load_pyfunc
from serving.runtimes.tensor_metadata import ModelTensors


class MLflowRuntime(Runtime):
    """Serves one MLflow model (any pyfunc flavor the container has the framework of)."""

    name = "mlflow"
    frameworks = ("mlflow.pyfunc.scoring_server", "pandas")
    # an Open Inference request's tensors come as JSON: several named ones as `{"inputs": {name:
    # column}}`, which mlflow reads as DataFrame columns
    tensor_types = (JSON, JSON)

    def model_fn(self, model_dir: Path | None) -> Any:
        if model_dir is None:
            raise FileNotFoundError("the mlflow stack needs ModelDataUrl")
        return load_pyfunc(model_dir, self.environment, nested=self.nested_layouts)

    def input_fn(self, body: bytes, content_type: str | None) -> Any:
        return scoring.decode(body, content_type, self.model)

    def predict_fn(self, data: Any, model: Any) -> Any:
        if isinstance(data, scoring.ScoringInput):
            return scoring.predict(model, data)
        return model.predict(data)  # a script's input_fn decided the input

    def choose_accept(self, accept: str) -> str:
        # mlflow's server answers JSON whatever the Accept
        return JSON

    def output_fn(self, prediction: Any, accept: str | None) -> tuple[bytes, str]:
        return scoring.encode(prediction), JSON

    def model_tensors(self, model: Any) -> ModelTensors:
        return scoring.signature_tensors(getattr(model, "metadata", None))
