"""SageMaker TensorFlow Serving container scripts, as AWS's examples write them, on a real endpoint.

it-tfs (built below) holds two tensorflow containers on TF Serving's half_plus_three (0.5 * x + 3):
`io` with input_handler/output_handler, `posting` with a handler that posts to `context.rest_uri`
with `requests` from inside its sandboxed container process (so loopback TCP to the data port works
under Landlock and seccomp). Invoked with unmodified boto3; the expected bytes are TF Serving's own
answer, which output_handler returns as `response.content`.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from suite.endpoint_server import TINY

pytestmark = pytest.mark.integration

# it-tfs (tests/integration/test_sagemaker_tfs.py): SageMaker TensorFlow Serving container scripts
# in the style of AWS's examples, on TF Serving's half_plus_three: `io` (input_handler turning CSV
# into "instances", output_handler returning response.content) and `posting` (handler posting to
# context.rest_uri with requests).
TFS_PROCESS = """
import json
import requests

def input_handler(data, context):
    if context.request_content_type == 'application/json':
        d = data.read().decode('utf-8')
        return d if len(d) else ''
    if context.request_content_type == 'text/csv':
        return json.dumps({'instances': [float(x) for x in data.read().decode('utf-8').split(',')]})
    raise ValueError('{{"error": "unsupported content type {}"}}'.format(context.request_content_type or 'unknown'))

def output_handler(data, context):
    if data.status_code != 200:
        raise ValueError(data.content.decode('utf-8'))
    return data.content, context.accept_header
"""
TFS_SCRIPTS = {
    "io": TFS_PROCESS,
    "posting": TFS_PROCESS.replace("def input_handler", "def _process_input").replace(
        "def output_handler", "def _process_output"
    )
    + "\ndef handler(data, context):\n"
    "    response = requests.post(context.rest_uri, data=_process_input(data, context))\n"
    "    return _process_output(response, context)\n",
}


@pytest.fixture(scope="session")
def tfs_models(tmp_path_factory) -> dict[str, Path]:
    """Two copies of a half_plus_three SavedModel (SageMaker's <model>/<version>/ layout), one per
    script."""
    from tests.unit.test_tfs_shapes import save_half_plus_three

    root = tmp_path_factory.mktemp("tfs")
    folders = {}
    for name, script in TFS_SCRIPTS.items():
        folders[name] = save_half_plus_three(root / name)
        (folders[name] / "code").mkdir()
        (folders[name] / "code" / "inference.py").write_text(script)
    return folders


def tfs(tfs_models: dict[str, Path]) -> dict:
    return {
        "EndpointName": "it-tfs",
        "Containers": [
            {
                "ContainerHostname": name,
                "Image": "tensorflow",
                "ModelDataUrl": str(folder),
                "Resources": TINY,
            }
            for name, folder in tfs_models.items()
        ],
    }


ENDPOINTS = {"it-tfs": tfs}  # what `server` deploys for this module, by builder

TFS_ANSWER = b'{\n    "predictions": [3.5, 4.0, 5.5\n    ]\n}'


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


@pytest.mark.parametrize("container", ["io", "posting"])
def test_csv_through_the_handlers(runtime, container: str) -> None:
    response = runtime.invoke_endpoint(
        EndpointName="it-tfs",
        TargetContainerHostname=container,
        ContentType="text/csv",
        Accept="application/json",
        Body="1.0,2.0,5.0",
    )
    assert response["Body"].read() == TFS_ANSWER
    assert response["ContentType"] == "application/json"


@pytest.mark.parametrize("container", ["io", "posting"])
def test_json_passes_through_to_tf_serving(runtime, container: str) -> None:
    response = runtime.invoke_endpoint(
        EndpointName="it-tfs",
        TargetContainerHostname=container,
        ContentType="application/json",
        Accept="application/json",
        Body=json.dumps({"inputs": [1.0, 2.0]}),
    )
    assert response["Body"].read() == b'{\n    "outputs": [\n        3.5,\n        4.0\n    ]\n}'


@pytest.mark.parametrize("container", ["io", "posting"])
def test_a_handler_failure_is_a_model_error_with_the_containers_answer(
    runtime, container: str
) -> None:
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(
            EndpointName="it-tfs",
            TargetContainerHostname=container,
            ContentType="application/json",
            Body=json.dumps({"instances": ["a"]}),
        )
    error = raised.value.response
    assert error["OriginalStatusCode"] == 500
    # python_service.py answers {"error": str(e)}; here e carries TF Serving's own 400 answer.
    tf_serving = json.loads(json.loads(error["OriginalMessage"])["error"])
    assert "holds text" in tf_serving["error"]
