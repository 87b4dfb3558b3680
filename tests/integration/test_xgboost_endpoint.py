"""The xgboost stack behind a real endpoint: SageMaker's XGBoost algorithm artifact invoked with
boto3.

it-xgboost (built below) serves a `model.tar.gz` holding `xgboost-model` at its root, as the
built-in algorithm writes it; the answers must be what `Booster.predict` gives in this process, byte
for byte.
"""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
import xgboost
from botocore.config import Config
from suite.endpoint_server import TINY

from tests.unit.test_xgboost_stack import csv_answer, csv_rows, json_answer

pytestmark = pytest.mark.integration


# it-xgboost: a model.tar.gz as SageMaker's XGBoost algorithm writes it.
@pytest.fixture(scope="session")
def xgboost_model(tmp_path_factory) -> tuple[Path, object, object]:
    """(archive, booster, rows): a binary:logistic booster on breast cancer saved as `xgboost-model`
    at the root of `model.tar.gz`, and the rows it was trained on."""
    import tarfile
    import warnings

    from tests.unit.test_xgboost_stack import train_booster

    booster, rows = train_booster("binary")
    root = tmp_path_factory.mktemp("xgboost-algorithm")
    with warnings.catch_warnings():
        # "Saving model in the UBJSON format as default": as the algorithm does
        warnings.simplefilter("ignore")
        booster.save_model(str(root / "xgboost-model"))
    archive = root / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root / "xgboost-model", arcname="xgboost-model")
    return archive, booster, rows


def algorithm(xgboost_model) -> dict:
    archive = xgboost_model[0]
    container = {
        "ContainerHostname": "algorithm",
        "Image": "xgboost",
        "ModelDataUrl": str(archive),
        "Resources": TINY,
    }
    return {"EndpointName": "it-xgboost", "Containers": [container]}


ENDPOINTS = {"it-xgboost": algorithm}  # what `server` deploys for this module, by builder


@pytest.fixture(scope="module")
def runtime(server):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )


def test_algorithm_artifact_answers_csv_libsvm_and_errors(runtime, xgboost_model):
    _, booster, x = xgboost_model
    rows = x[:5]
    expected = booster.predict(xgboost.DMatrix(rows))

    answer = runtime.invoke_endpoint(
        EndpointName="it-xgboost", ContentType="text/csv", Body=csv_rows(rows)
    )
    assert answer["ContentType"].startswith("text/csv")  # the container's default Accept
    assert answer["Body"].read() == csv_answer(expected)

    libsvm = "\n".join(
        "0 " + " ".join(f"{j + 1}:{v!r}" for j, v in enumerate(row.tolist())) for row in rows
    )
    answer = runtime.invoke_endpoint(
        EndpointName="it-xgboost", ContentType="text/libsvm", Accept="application/json", Body=libsvm
    )
    assert answer["ContentType"].startswith("application/json")
    assert answer["Body"].read() == json_answer(expected)

    # one feature too many: the caller's error
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(
            EndpointName="it-xgboost", ContentType="text/csv", Body=csv_rows(x[:1]) + ",1.0"
        )
    error = raised.value.response
    assert error["OriginalStatusCode"] == 400
    assert "CSV rows have 31 features; the model takes 30" in error["OriginalMessage"]

    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(
            EndpointName="it-xgboost", ContentType="application/x-recordio-protobuf", Body=b"\0"
        )
    assert raised.value.response["OriginalStatusCode"] == 415
    assert (
        "application/x-recordio-protobuf input is not supported"
        in raised.value.response["OriginalMessage"]
    )


def test_open_inference_metadata_and_infer_match_the_booster(server, xgboost_model):
    # The xgboost stack reads no NPY: a V2 tensor reaches it as CSV rows, and its CSV answer returns
    # as one tensor.
    import numpy as np
    import tritonclient.http as triton

    _, booster, x = xgboost_model
    rows = np.asarray(x[:5], dtype=np.float32)
    client = triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30.0)
    try:
        metadata = client.get_model_metadata("it-xgboost")
        assert metadata["platform"] == "xgboost"
        assert metadata["inputs"] == [
            {"name": "input-0", "datatype": "FP32", "shape": [-1, booster.num_features()]}
        ]
        tensor = triton.InferInput("input-0", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        got = client.infer("it-xgboost", [tensor]).as_numpy("output-0")
    finally:
        client.close()
    assert np.allclose(got, booster.predict(xgboost.DMatrix(rows)), rtol=1e-6)
