"""SageMaker-style scripts served by real endpoints, invoked with unmodified boto3: the exact bytes
AWS's containers answer (computed here with the same library calls their toolkits make)."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import boto3
import numpy as np
import pytest
from botocore.config import Config
from suite import endpoints
from suite.endpoint_server import TINY

pytestmark = pytest.mark.integration

# Scripts written the way AWS's examples write them, for it-sagemaker
# (tests/integration/test_sagemaker_scripts.py).
SKLEARN_MODEL_FN_ONLY = '''
import os

from skops.io import load


def model_fn(model_dir):
    """Load the model (the scikit-learn container's defaults do the rest)."""
    return load(os.path.join(model_dir, "model.skops"))
'''

PROGRAM_WITH_TRANSFORM_FN = """
import json

from weights import WEIGHTS


def model_fn(model_dir, context):
    return {"weights": WEIGHTS, "model_dir_is_str": isinstance(model_dir, str),
            "gpu_id": context.system_properties.get("gpu_id")}


def transform_fn(model, request_body, request_content_type, response_content_type, context):
    rows = json.loads(request_body)
    scores = [sum(w * x for w, x in zip(model["weights"], row)) for row in rows]
    attributes = context.get_request_header(0, "X-Amzn-SageMaker-Custom-Attributes")
    if attributes == "fail=teapot":
        context.set_response_status(418, "I am a teapot")
        return "refused by the script", "text/plain"
    body = {"scores": scores, "body_type": type(request_body).__name__, "attributes": attributes, **model}
    return json.dumps(body), response_content_type
"""


@pytest.fixture(scope="session")
def sagemaker_script_models(demo_models, tmp_path_factory) -> dict[str, Path]:
    """Model folders with SageMaker-style scripts: a scikit-learn model_fn, a SAGEMAKER_PROGRAM with
    transform_fn."""
    import shutil

    root = tmp_path_factory.mktemp("sagemaker-scripts")
    sklearn = root / "sklearn-script"
    shutil.copytree(demo_models / "iris-classifier", sklearn)
    (sklearn / "code").mkdir(exist_ok=True)
    (sklearn / "code" / "inference.py").write_text(SKLEARN_MODEL_FN_ONLY)
    program = root / "program"
    (program / "code").mkdir(parents=True)
    (program / "code" / "serve.py").write_text(PROGRAM_WITH_TRANSFORM_FN)
    (program / "code" / "weights.py").write_text("WEIGHTS = [1.0, 10.0, 100.0]\n")
    return {"sklearn": sklearn, "program": program}


def scripts(sagemaker_script_models: dict[str, Path]) -> dict:
    return {
        "EndpointName": "it-sagemaker",
        "Containers": [
            {
                "ContainerHostname": "sk-script",
                "Image": "sklearn",
                "ModelDataUrl": str(sagemaker_script_models["sklearn"]),
                "Resources": TINY,
            },
            {
                "ContainerHostname": "program",
                "Image": "python",
                "ModelDataUrl": str(sagemaker_script_models["program"]),
                "Resources": TINY,
                "Environment": {"SAGEMAKER_PROGRAM": "serve.py"},
            },
        ],
    }


ENDPOINTS = {
    "it-sagemaker": scripts,
    "it-fifteen": endpoints.fifteen,
}  # what `server` deploys for this module, by builder

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]


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


@pytest.fixture(scope="module")
def iris_estimator(sagemaker_script_models):
    from skops.io import get_untrusted_types, load

    path = sagemaker_script_models["sklearn"] / "model.skops"
    return load(path, trusted=get_untrusted_types(file=path))


def test_sklearn_script_with_model_fn_only_answers_the_containers_json_bytes(
    runtime, iris_estimator
):
    response = runtime.invoke_endpoint(
        EndpointName="it-sagemaker",
        TargetContainerHostname="sk-script",
        ContentType="application/json",
        Accept="application/json",
        Body=json.dumps(ROWS),
    )
    # sagemaker-scikit-learn-container: np.array(json).astype(float32) -> predict ->
    # json.dumps(default=tolist)
    expected = json.dumps(
        iris_estimator.predict(np.array(ROWS).astype(np.float32)), default=np.ndarray.tolist
    )
    assert response["Body"].read() == expected.encode()
    assert response["ContentType"] == "application/json"


def test_sklearn_script_answers_csv_with_np_savetxt(runtime, iris_estimator):
    body = "\n".join(",".join(map(str, row)) for row in ROWS)
    response = runtime.invoke_endpoint(
        EndpointName="it-sagemaker",
        TargetContainerHostname="sk-script",
        ContentType="text/csv",
        Accept="text/csv",
        Body=body,
    )
    stream = io.StringIO()
    np.savetxt(
        stream, iris_estimator.predict(np.array(ROWS, dtype=np.float32)), delimiter=",", fmt="%s"
    )
    assert response["Body"].read() == stream.getvalue().encode()
    assert response["ContentType"] == "text/csv"


def test_an_unsupported_content_type_is_a_model_error_with_the_containers_415(runtime):
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(
            EndpointName="it-sagemaker",
            TargetContainerHostname="sk-script",
            ContentType="application/x-image",
            Body=b"\x89PNG",
        )
    error = raised.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert error["OriginalStatusCode"] == 415
    assert (
        "Content type application/x-image is not supported by this framework"
        in error["OriginalMessage"]
    )


def test_sagemaker_program_with_transform_fn_and_a_context(runtime):
    response = runtime.invoke_endpoint(
        EndpointName="it-sagemaker",
        TargetContainerHostname="program",
        ContentType="application/json",
        Accept="application/json",
        CustomAttributes="trace=42",
        Body=json.dumps([[1, 2, 3]]),
    )
    assert json.loads(response["Body"].read()) == {
        "scores": [321.0],
        "body_type": "str",
        "attributes": "trace=42",
        "weights": [1.0, 10.0, 100.0],
        "model_dir_is_str": True,
        "gpu_id": None,
    }
    assert response["ContentType"] == "application/json"


def test_a_status_the_script_sets_reaches_the_caller_as_a_model_error(runtime):
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(
            EndpointName="it-sagemaker",
            TargetContainerHostname="program",
            ContentType="application/json",
            CustomAttributes="fail=teapot",
            Body="[[1]]",
        )
    error = raised.value.response
    assert error["OriginalStatusCode"] == 418
    assert error["OriginalMessage"] == "refused by the script"


def test_pytorch_state_dict_with_model_fn_answers_the_toolkits_bytes(runtime, hetero_models):
    import torch

    code = hetero_models / "hetero-iris-state" / "code"
    spec = importlib.util.spec_from_file_location("tabular_net_reference", code / "tabular_net.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tabular_net_reference"] = module
    spec.loader.exec_module(module)
    model = module.TabularNet(features=4, classes=3)
    model.load_state_dict(
        torch.load(hetero_models / "hetero-iris-state" / "model.pth", weights_only=True)
    )
    model.eval()
    with torch.no_grad():  # the PyTorch toolkit: FloatTensor(json) -> model -> tolist -> json.dumps
        expected = json.dumps(model(torch.FloatTensor(ROWS)).detach().cpu().numpy().tolist())
    response = runtime.invoke_endpoint(
        EndpointName="it-fifteen",
        TargetContainerHostname="pytorch-state",
        ContentType="application/json",
        Accept="application/json",
        Body=json.dumps(ROWS),
    )
    assert response["Body"].read() == expected.encode()
