"""`examples/side-by-side.yaml` on real Ray Serve: an MLflow model, a LightGBM ranker and a
transformers classifier and LM, each saved by its own tool, beside a scikit-learn container on one
endpoint; each answers what its tool answers in this process (`pyfunc.predict`, `Booster.predict`,
the pipeline's call), through boto3, this project's SDK and Triton's V2 client.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import numpy as np
import pytest
import tritonclient.http as triton
import yaml
from botocore.config import Config
from suite.endpoint_server import TINY

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = "side-by-side"
MODEL_FOLDERS = {  # the example's ModelDataUrl -> the session's model
    "models/churn-mlflow": "churn-mlflow",
    "models/ranker-lightgbm": "ranker-lightgbm",
    "models/tiny-classifier": "tiny-classifier",
    "models/tiny-lm": "tiny-lm",
    "models/iris-sklearn": "iris-sklearn",
}


def side_by_side(side_by_side_models: dict[str, Path]) -> dict:
    """The example as it is, its models the session's, each replica TINY."""
    document = yaml.safe_load((ROOT / "examples" / "side-by-side.yaml").read_text())
    for container in document["Containers"]:
        container["ModelDataUrl"] = str(
            side_by_side_models[MODEL_FOLDERS[container["ModelDataUrl"]]]
        )
        container["Resources"] = TINY
    return document


ENDPOINTS = {ENDPOINT: side_by_side}  # what `server` deploys for this module, by builder


@pytest.fixture(scope="module")
def runtime(server):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}, read_timeout=60),
    )


@pytest.fixture(scope="module")
def v2(server):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60.0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def cancer():
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer(as_frame=True).data.iloc[:5]


def test_the_mlflow_model_answers_as_pyfunc_predict(runtime, v2, side_by_side_models, cancer):
    import mlflow.pyfunc

    want = mlflow.pyfunc.load_model(str(side_by_side_models["churn-mlflow"])).predict(cancer)
    body = {"dataframe_split": json.loads(cancer.to_json(orient="split", index=False))}
    response = runtime.invoke_endpoint(
        EndpointName=ENDPOINT,
        TargetContainerHostname="churn",
        ContentType="application/json",
        Body=json.dumps(body),
    )
    assert json.loads(response["Body"].read()) == {"predictions": np.asarray(want).tolist()}
    inputs = []  # Open Inference: one tensor per column of the signature
    for column in cancer.columns:
        tensor = triton.InferInput(column, [len(cancer)], "FP64")
        tensor.set_data_from_numpy(cancer[column].to_numpy(dtype=np.float64))
        inputs.append(tensor)
    result = v2.infer(f"{ENDPOINT}.churn", inputs)
    (output,) = result.get_response()["outputs"]
    assert result.as_numpy(output["name"]).reshape(-1).tolist() == np.asarray(want).tolist()


def test_the_lightgbm_ranker_answers_as_booster_predict(server, v2, side_by_side_models):
    import lightgbm as lgb
    from sklearn.datasets import load_diabetes

    rows = load_diabetes().data[:10]
    booster = lgb.Booster(model_file=str(side_by_side_models["ranker-lightgbm"] / "model.txt"))
    want = booster.predict(rows)
    invoked = server.client.invoke(ENDPOINT, rows.tolist(), target="ranker")  # the SDK
    assert np.allclose(invoked.body, want, rtol=1e-12, atol=1e-12)
    tensor = triton.InferInput("input-0", list(rows.shape), "FP64")
    tensor.set_data_from_numpy(rows)
    result = v2.infer(f"{ENDPOINT}.ranker", [tensor])
    assert np.allclose(result.as_numpy("output-0").reshape(-1), want, rtol=1e-12, atol=1e-12)


def test_the_transformers_classifier_answers_as_its_pipeline(runtime, side_by_side_models):
    from transformers import pipeline

    texts = ["good movie", "awful day", "fine and good"]
    folder = str(side_by_side_models["tiny-classifier"])
    want = pipeline("text-classification", model=folder)(texts)
    response = runtime.invoke_endpoint(
        EndpointName=ENDPOINT,
        TargetContainerHostname="sentiment",
        ContentType="application/json",
        Body=json.dumps({"inputs": texts}),
    )
    assert json.loads(response["Body"].read()) == json.loads(json.dumps(want))


def test_the_classic_stack_beside_them(server, side_by_side_models):
    import skops.io
    from sklearn.datasets import load_iris

    path = side_by_side_models["iris-sklearn"] / "model.skops"
    estimator = skops.io.load(path, trusted=skops.io.get_untrusted_types(file=path))
    rows = load_iris().data[::30]
    invoked = server.client.invoke(ENDPOINT, rows.tolist(), target="iris")
    assert invoked.body == estimator.predict(rows).tolist()
