"""The mlflow stack (`runtimes.mlflow_pyfunc`, `mlflow_scoring`, `mlflow_artifacts`): MLflow models
saved here by mlflow itself, answered over the container's data port (httpx's ASGI transport) and
compared with what `mlflow.pyfunc` predicts in this process for the same rows.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from serving.model_server.app import build_container_app
from serving.open_inference import codec
from serving.protocol import ALLOW_PICKLE_ENV
from serving.runtimes import Runtime, runtime_for

pytestmark = pytest.mark.frameworks

mlflow_pyfunc = pytest.importorskip("mlflow.pyfunc")
pd = pytest.importorskip("pandas")

JSON = "application/json"
CSV = "text/csv"
OPT_IN = {ALLOW_PICKLE_ENV: "true"}


class Scaled(mlflow_pyfunc.PythonModel):
    """`a * scale + b`, `scale` a param (cloudpickled with the model: loading it runs code)."""

    # no annotations: mlflow would read them as a type-hint signature
    def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
        return model_input["a"] * (params or {}).get("scale", 1.0) + model_input["b"]


@dataclass(frozen=True)
class Saved:
    path: Path
    frame: Any  # rows to ask for
    reference: Any  # the model as mlflow.pyfunc.load_model loads it in this process


def _mlflow_loaded(path: Path) -> Any:
    """mlflow's own load (its pickle switch on: these artifacts are made by this test)."""
    os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = "true"
    try:
        return mlflow_pyfunc.load_model(str(path), suppress_warnings=True)
    finally:
        os.environ.pop("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", None)


@pytest.fixture(scope="module")
def iris_model(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """LogisticRegression on iris as a DataFrame, saved by mlflow.sklearn (skops) with an inferred
    signature."""
    import mlflow.sklearn
    from mlflow.models import infer_signature
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    frame, target = load_iris(return_X_y=True, as_frame=True)
    model = LogisticRegression(max_iter=1000).fit(frame, target)
    path = tmp_path_factory.mktemp("mlflow") / "iris"
    mlflow.sklearn.save_model(
        model,
        str(path),
        signature=infer_signature(frame, model.predict(frame)),
        pip_requirements=[],
    )
    return Saved(path, frame.iloc[::15].reset_index(drop=True), _mlflow_loaded(path))


@pytest.fixture(scope="module")
def scaled_model(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """A custom PythonModel with a `scale` param, saved by mlflow.pyfunc (cloudpickle)."""
    from mlflow.models import infer_signature

    frame = pd.DataFrame({"a": [1.0, 2.5, -3.0], "b": [3, 4, 5]})
    path = tmp_path_factory.mktemp("mlflow") / "scaled"
    signature = infer_signature(frame, frame["a"], params={"scale": 1.0})
    mlflow_pyfunc.save_model(
        str(path), python_model=Scaled(), signature=signature, pip_requirements=[]
    )
    return Saved(path, frame, _mlflow_loaded(path))


def loaded(path: Path, environment: dict[str, str] | None = None) -> Runtime:
    runtime = runtime_for("mlflow", path, environment or {})
    runtime.load()
    return runtime


async def _post(runtime: Runtime, body: bytes, content_type: str) -> httpx.Response:
    app = build_container_app(runtime, "mlflow")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://container") as client:
        return await client.post(
            "/invocations", content=body, headers={"content-type": content_type, "accept": JSON}
        )


def post(runtime: Runtime, body: bytes | dict, content_type: str = JSON) -> httpx.Response:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    return asyncio.run(_post(runtime, raw, content_type))


def expected(predictions: Any) -> Any:
    """mlflow's server's answer for these predictions, as JSON."""
    from mlflow.pyfunc.scoring_server import predictions_to_json

    out = io.StringIO()
    predictions_to_json(predictions, out)
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def iris_runtime(iris_model: Saved) -> Iterator[Runtime]:
    runtime = loaded(iris_model.path)
    yield runtime
    runtime.unload()


def shapes(frame: Any) -> dict[str, tuple[bytes | dict, str]]:
    split = frame.to_dict(orient="split")
    return {
        "dataframe_split": (
            {"dataframe_split": {"columns": split["columns"], "data": split["data"]}},
            JSON,
        ),
        "dataframe_records": ({"dataframe_records": frame.to_dict(orient="records")}, JSON),
        "instances": ({"instances": frame.to_dict(orient="records")}, JSON),
        "inputs": ({"inputs": frame.to_dict(orient="list")}, JSON),
        "csv": (frame.to_csv(index=False).encode(), CSV),
    }


@pytest.mark.parametrize(
    "shape", ["dataframe_split", "dataframe_records", "instances", "inputs", "csv"]
)
def test_each_scoring_shape_answers_what_pyfunc_predicts(
    iris_runtime: Runtime, iris_model: Saved, shape: str
) -> None:
    body, content_type = shapes(iris_model.frame)[shape]
    response = post(iris_runtime, body, content_type)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(JSON)
    assert response.json() == expected(iris_model.reference.predict(iris_model.frame))


def test_a_missing_column_is_a_400_naming_it(iris_runtime: Runtime, iris_model: Saved) -> None:
    missing = iris_model.frame.columns[2]
    rows = iris_model.frame.drop(columns=[missing]).to_dict(orient="records")
    response = post(iris_runtime, {"dataframe_records": rows})
    assert response.status_code == 400, response.text
    assert missing in response.json()["message"]
    assert "5.1" not in response.json()["message"]  # the rows are not echoed back


def test_a_column_of_the_wrong_type_is_a_400_naming_it(
    iris_runtime: Runtime, iris_model: Saved
) -> None:
    column = iris_model.frame.columns[1]
    rows = iris_model.frame.astype({column: object}).to_dict(orient="records")
    rows[0][column] = "wide"
    for body in ({"dataframe_records": rows}, {"inputs": pd.DataFrame(rows).to_dict("list")}):
        response = post(iris_runtime, body)
        assert response.status_code == 400, response.text
        assert column in response.json()["message"]


def test_what_mlflow_refuses_is_refused(iris_runtime: Runtime, iris_model: Saved) -> None:
    records = iris_model.frame.to_dict(orient="records")
    assert post(iris_runtime, b"7").status_code == 400  # not a JSON object
    assert post(iris_runtime, {"records": records}).status_code == 400  # no known field
    both = {"dataframe_records": records, "instances": records}
    assert post(iris_runtime, both).status_code == 400
    assert post(iris_runtime, b"{", JSON).status_code == 400
    assert post(iris_runtime, b"a,b\n1,2\n", "application/x-npy").status_code == 415
    assert (
        post(iris_runtime, {"dataframe_records": records}, f"{JSON}; charset=latin-1").status_code
        == 415
    )


def test_params_reach_the_model(scaled_model: Saved) -> None:
    runtime = loaded(scaled_model.path, OPT_IN)
    records = scaled_model.frame.to_dict(orient="records")
    for params in ({"scale": 2.5}, None):
        body = {"dataframe_records": records, **({"params": params} if params else {})}
        response = post(runtime, body)
        assert response.status_code == 200, response.text
        assert response.json() == expected(
            scaled_model.reference.predict(scaled_model.frame, params=params)
        )
    assert (
        post(runtime, {"dataframe_records": records, "params": {"scale": "big"}}).status_code == 400
    )


def test_a_cloudpickled_python_model_needs_the_pickle_opt_in(scaled_model: Saved) -> None:
    with pytest.raises(PermissionError, match=f"cloudpickle.*{ALLOW_PICKLE_ENV}"):
        loaded(scaled_model.path)
    assert loaded(scaled_model.path, OPT_IN).model is not None


def test_a_pickled_sklearn_flavor_needs_the_pickle_opt_in(
    iris_model: Saved, tmp_path: Path
) -> None:
    import mlflow.sklearn

    estimator = _mlflow_loaded(iris_model.path).get_raw_model()
    path = tmp_path / "pickled"
    mlflow.sklearn.save_model(
        estimator,
        str(path),
        serialization_format="cloudpickle",
        pip_requirements=[],
        signature=iris_model.reference.metadata.signature,
    )
    with pytest.raises(PermissionError, match="cloudpickle"):
        loaded(path)
    runtime = loaded(path, OPT_IN)
    response = post(runtime, {"dataframe_records": iris_model.frame.to_dict(orient="records")})
    assert response.json() == expected(iris_model.reference.predict(iris_model.frame))


def _edited(source: Path, target: Path, edit: Any) -> Path:
    shutil.copytree(source, target)
    document = yaml.safe_load((target / "MLmodel").read_text())
    edit(document)
    (target / "MLmodel").write_text(yaml.safe_dump(document))
    return target


def test_a_flavor_whose_framework_is_missing_fails_at_load_naming_it(
    iris_model: Saved, tmp_path: Path
) -> None:
    if importlib.util.find_spec("catboost") is not None:
        pytest.skip("catboost is installed here: no flavor framework is missing")

    def catboost(document: dict) -> None:
        document["flavors"]["python_function"]["loader_module"] = "mlflow.catboost"
        document["flavors"]["catboost"] = document["flavors"].pop("sklearn")

    path = _edited(iris_model.path, tmp_path / "catboost", catboost)
    for environment in ({}, OPT_IN):
        with pytest.raises(ImportError, match="catboost flavor.*'catboost'"):
            loaded(path, environment)


def test_a_loader_module_of_the_artifacts_choosing_is_not_imported_without_the_opt_in(
    iris_model: Saved, tmp_path: Path
) -> None:
    def foreign(document: dict) -> None:
        document["flavors"]["python_function"]["loader_module"] = "mlflow_test_absent.loader"

    path = _edited(iris_model.path, tmp_path / "foreign", foreign)
    with pytest.raises(PermissionError, match="mlflow_test_absent.loader"):
        loaded(path)
    with pytest.raises(ImportError, match="mlflow_test_absent.loader"):
        loaded(path, OPT_IN)


def test_a_model_file_outside_the_model_directory_is_refused(
    iris_model: Saved, tmp_path: Path
) -> None:
    def outside(document: dict) -> None:
        document["flavors"]["python_function"]["model_path"] = "../iris/model.skops"

    with pytest.raises(PermissionError, match="outside"):
        loaded(_edited(iris_model.path, tmp_path / "outside", outside))


def test_the_signature_is_the_open_inference_metadata(
    iris_runtime: Runtime, iris_model: Saved
) -> None:
    signature = iris_runtime.tensor_signature()
    schema = iris_model.reference.metadata.get_input_schema()
    assert [tensor["name"] for tensor in signature["inputs"]] == schema.input_names()
    assert {tensor["datatype"] for tensor in signature["inputs"]} == {"FP64"}  # double columns
    assert all(tensor["shape"] == [-1] for tensor in signature["inputs"])
    predictions = np.asarray(iris_model.reference.predict(iris_model.frame))
    assert signature["outputs"] == [{"name": "predictions", "datatype": "INT64", "shape": [-1]}]
    assert predictions.dtype == np.int64


def test_open_inference_named_tensors_become_dataframe_columns(
    iris_runtime: Runtime, iris_model: Saved
) -> None:
    """A V2 request of one tensor per column, turned into a container body as the gateway does."""
    signature = iris_runtime.tensor_signature()
    request = codec.InferRequest(
        [(column, iris_model.frame[column].to_numpy()) for column in iris_model.frame.columns]
    )
    body, content_type = codec.container_body(request, signature["content_type"])
    response = post(iris_runtime, body, content_type)
    assert response.status_code == 200, response.text
    outputs = codec.answer_tensors(
        response.content, response.headers["content-type"], [signature["outputs"][0]["name"]]
    )
    assert [name for name, _ in outputs] == ["predictions"]
    want = np.asarray(iris_model.reference.predict(iris_model.frame))
    np.testing.assert_array_equal(outputs[0][1], want)


def test_one_open_inference_tensor_reaches_a_tensor_signature(
    iris_model: Saved, tmp_path: Path
) -> None:
    """A model whose signature is one unnamed tensor: a V2 request of one tensor, as the gateway
    sends it (a bare JSON array, which the stack reads as `inputs`)."""
    import mlflow.sklearn
    from mlflow.models import infer_signature

    rows = iris_model.frame.to_numpy()
    estimator = iris_model.reference.get_raw_model()
    path = tmp_path / "tensor"
    signature = infer_signature(rows, estimator.predict(iris_model.frame))
    mlflow.sklearn.save_model(estimator, str(path), signature=signature, pip_requirements=[])
    runtime = loaded(path)
    tensors = runtime.tensor_signature()
    assert tensors["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": [-1, 4]}]
    request = codec.InferRequest([("input-0", rows)])
    body, content_type = codec.container_body(request, tensors["content_type"])
    response = post(runtime, body, content_type)
    assert response.status_code == 200, response.text
    reference = _mlflow_loaded(path)
    assert response.json() == expected(reference.predict(rows))
