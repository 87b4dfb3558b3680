"""The xgboost stack behind a real endpoint: SageMaker's XGBoost algorithm artifact invoked with boto3.

it-xgboost (tests/server_fixtures.py) serves a `model.tar.gz` holding `xgboost-model` at its root, as the built-in
algorithm writes it; the answers must be what `Booster.predict` gives in this process, byte for byte.
"""

from __future__ import annotations

import boto3
import pytest
import xgboost
from botocore.config import Config

from tests.unit.test_xgboost_stack import csv_answer, csv_rows, json_answer

pytestmark = pytest.mark.integration

ENDPOINTS = ("it-xgboost",)  # what `server` deploys for this module


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

    answer = runtime.invoke_endpoint(EndpointName="it-xgboost", ContentType="text/csv", Body=csv_rows(rows))
    assert answer["ContentType"].startswith("text/csv")  # the container's default Accept
    assert answer["Body"].read() == csv_answer(expected)

    libsvm = "\n".join("0 " + " ".join(f"{j + 1}:{v!r}" for j, v in enumerate(row.tolist())) for row in rows)
    answer = runtime.invoke_endpoint(
        EndpointName="it-xgboost", ContentType="text/libsvm", Accept="application/json", Body=libsvm
    )
    assert answer["ContentType"].startswith("application/json")
    assert answer["Body"].read() == json_answer(expected)

    with pytest.raises(runtime.exceptions.ModelError) as raised:  # one feature too many: the caller's error
        runtime.invoke_endpoint(EndpointName="it-xgboost", ContentType="text/csv", Body=csv_rows(x[:1]) + ",1.0")
    error = raised.value.response
    assert error["OriginalStatusCode"] == 400
    assert "CSV rows have 31 features; the model takes 30" in error["OriginalMessage"]

    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(EndpointName="it-xgboost", ContentType="application/x-recordio-protobuf", Body=b"\0")
    assert raised.value.response["OriginalStatusCode"] == 415
    assert "application/x-recordio-protobuf input is not supported" in raised.value.response["OriginalMessage"]


def test_open_inference_metadata_and_infer_match_the_booster(server, xgboost_model):
    # The xgboost stack reads no NPY: a V2 tensor reaches it as CSV rows, and its CSV answer returns as one tensor.
    import numpy as np
    import tritonclient.http as triton

    _, booster, x = xgboost_model
    rows = np.asarray(x[:5], dtype=np.float32)
    client = triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30.0)
    try:
        metadata = client.get_model_metadata("it-xgboost")
        assert metadata["platform"] == "xgboost"
        assert metadata["inputs"] == [{"name": "input-0", "datatype": "FP32", "shape": [-1, booster.num_features()]}]
        tensor = triton.InferInput("input-0", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        got = client.infer("it-xgboost", [tensor]).as_numpy("output-0")
    finally:
        client.close()
    assert np.allclose(got, booster.predict(xgboost.DMatrix(rows)), rtol=1e-6)
