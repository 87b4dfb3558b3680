"""scikit-learn, PyTorch, TensorFlow, ONNX and Python containers side by side, Direct and Serial,
over real HTTP and an unmodified boto3 client; input mismatches are 424s naming the container."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
from botocore.config import Config
from suite import endpoints
from suite.endpoint_server import TINY

from serving.client import ModelError

pytestmark = pytest.mark.integration

# it-runtime-env: a handler importing a module that only its RuntimeEnvironment.WorkingDir holds.
WORKING_DIR_HANDLER = """
import json, os
import wd_helper  # lives in the working dir, not in the model directory

def predict_fn(data, model):
    return {"helper": wd_helper.NAME, "cwd": os.getcwd(), "cpus": os.environ.get("SERVING_CPUS")}

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
"""


@pytest.fixture(scope="session")
def working_dir_model(tmp_path_factory) -> tuple[Path, Path]:
    """(model directory, working directory) of it-runtime-env."""
    root = tmp_path_factory.mktemp("runtime-env")
    (root / "model" / "code").mkdir(parents=True)
    (root / "model" / "code" / "inference.py").write_text(WORKING_DIR_HANDLER)
    (root / "lib").mkdir()
    (root / "lib" / "wd_helper.py").write_text("NAME = 'from the working dir'\n")
    return root / "model", root / "lib"


def _container(hetero: Path, host: str, image: str, model: str, **extra) -> dict:
    return {
        "ContainerHostname": host,
        "Image": image,
        "ModelDataUrl": str(hetero / model),
        "Resources": TINY,
        **extra,
    }


def hetero_serial(hetero_models: Path) -> dict:
    """scikit-learn features -> TensorFlow classifier -> Python labels
    (examples/hetero-serial.yaml)."""
    return {
        "EndpointName": "it-hetero-serial",
        "InferenceExecutionConfig": {"Mode": "Serial"},
        "Containers": [
            _container(hetero_models, "features", "sklearn", "hetero-features"),
            _container(hetero_models, "classifier", "tensorflow", "hetero-tf-features"),
            _container(hetero_models, "labels", "python", "hetero-labels"),
        ],
    }


def hetero_serial_onnx(hetero_models: Path) -> dict:
    """The same chain with an ONNX classifier, handed NPY by the first container, batching
    concurrent requests."""
    npy = {"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "application/x-npy"}
    batching = {"MaxBatchSize": 16, "MaxDelayMs": 20}
    return {
        "EndpointName": "it-hetero-serial-onnx",
        "InferenceExecutionConfig": {"Mode": "Serial"},
        "Containers": [
            _container(hetero_models, "features", "sklearn", "hetero-features", Environment=npy),
            _container(
                hetero_models, "classifier", "onnx", "hetero-onnx-features", Batching=batching
            ),
            _container(hetero_models, "labels", "python", "hetero-labels"),
        ],
    }


def runtime_env(working_dir_model: tuple[Path, Path]) -> dict:
    model, working_dir = working_dir_model
    container = {
        "ContainerHostname": "wd",
        "Image": "python",
        "ModelDataUrl": str(model),
        "Resources": TINY,
        "RuntimeEnvironment": {"WorkingDir": str(working_dir)},
    }
    return {"EndpointName": "it-runtime-env", "Containers": [container]}


ENDPOINTS = {
    "it-fifteen": endpoints.fifteen,
    "it-hetero-serial": hetero_serial,
    "it-hetero-serial-onnx": hetero_serial_onnx,
    "it-runtime-env": runtime_env,
}  # what `server` deploys for this module, by builder

IRIS_ROWS = [[5.1, 3.5, 1.4, 0.2], [7.0, 3.2, 4.7, 1.4], [6.3, 3.3, 6.0, 2.5]]
IRIS_NAMES = ["setosa", "versicolor", "virginica"]


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


# --- Direct: the same rows through four frameworks' iris models --------------------------------


@pytest.mark.parametrize(
    "hostname",
    [
        "sklearn-iris",
        "pytorch-script",
        "pytorch-state",
        "tensorflow-keras",
        "onnx-iris",
        "python-rules",
    ],
)
def test_direct_with_boto3_across_frameworks(runtime, hostname: str) -> None:
    response = runtime.invoke_endpoint(
        EndpointName="it-fifteen",
        TargetContainerHostname=hostname,
        ContentType="text/csv",
        Accept="application/json",
        Body="\n".join(",".join(map(str, row)) for row in IRIS_ROWS),
    )
    got = json.loads(response["Body"].read())
    if hostname == "python-rules":
        assert got == IRIS_NAMES
    elif hostname == "sklearn-iris":
        assert got == [0, 1, 2]
    elif hostname == "tensorflow-keras":  # SageMaker's TFS container: CSV rows become "instances"
        assert np.asarray(got["predictions"]).argmax(axis=1).tolist() == [0, 1, 2]
    else:
        assert np.asarray(got).argmax(axis=1).tolist() == [0, 1, 2]


def test_direct_npy_in_and_out(server) -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(IRIS_ROWS, dtype=np.float32))
    response = server.client.invoke(
        "it-fifteen",
        buffer.getvalue(),
        target="onnx-iris",
        content_type="application/x-npy",
        accept="application/x-npy",
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-npy"
    assert np.load(io.BytesIO(response.raw), allow_pickle=False).argmax(axis=1).tolist() == [
        0,
        1,
        2,
    ]


def test_tensorflow_serving_request_over_http(server) -> None:
    response = server.client.invoke(
        "it-fifteen",
        {"instances": [{"features": row} for row in IRIS_ROWS]},
        target="tensorflow-keras",
    )
    assert response.status_code == 200
    assert np.asarray(response.body["predictions"]).argmax(axis=1).tolist() == [0, 1, 2]


# --- Serial: preprocess in scikit-learn, classify in TensorFlow or ONNX, name in Python -----------


@pytest.mark.parametrize("endpoint", ["it-hetero-serial", "it-hetero-serial-onnx"])
@pytest.mark.parametrize("content_type", ["application/json", "text/csv"])
def test_serial_chain_across_frameworks(server, endpoint: str, content_type: str) -> None:
    body = (
        json.dumps(IRIS_ROWS)
        if content_type == "application/json"
        else "".join(",".join(map(str, row)) + "\n" for row in IRIS_ROWS)
    )
    response = server.client.invoke(endpoint, body, content_type=content_type)
    assert response.status_code == 200
    assert response.body == {"labels": IRIS_NAMES}


def test_serial_chain_with_boto3(runtime) -> None:
    response = runtime.invoke_endpoint(
        EndpointName="it-hetero-serial",
        ContentType="application/json",
        Body=json.dumps(IRIS_ROWS[2:]),
    )
    assert json.loads(response["Body"].read()) == {"labels": ["virginica"]}


# --- input mismatches: 424 ModelError naming the container, the replica keeps serving -------------


@pytest.mark.parametrize(
    ("hostname", "body", "fragment"),
    [
        ("onnx-two", {"sepal": [[5.1, 3.5]]}, "missing input 'petal'"),
        ("onnx-iris", [[5.1, 3.5, 1.4]], "has shape [1, 3]; the model takes x (float32 [?, 4])"),
        ("pytorch-export", [[1.0, 2.0]], "the model takes x (float32 [?, 13])"),
        ("pytorch-script", [[1.0, 2.0]], "the model failed on input x float32 [1, 2]"),
        (
            "tensorflow-saved",
            {"instances": [[1.0, 2.0, 3.0, 4.0]]},
            "the model takes features (float32 [?, 3])",
        ),
        ("tensorflow-keras", [["a", "b", "c", "d"]], "holds text"),
    ],
)
def test_input_mismatch_is_a_model_error_naming_the_container(
    server, hostname: str, body, fragment: str
) -> None:
    with pytest.raises(ModelError) as raised:
        server.client.invoke("it-fifteen", body, target=hostname)
    assert raised.value.status_code == 424, raised.value
    assert raised.value.headers["x-amzn-errortype"] == "ModelError"
    error = raised.value.body
    assert error["ContainerHostname"] == hostname
    assert hostname in error["message"]
    assert fragment in error["OriginalMessage"], error["OriginalMessage"]
    # the replica survived: a good request right after is answered
    again = server.client.invoke("it-fifteen", [[5.1, 3.5, 1.4, 0.2]], target="onnx-iris")
    assert again.status_code == 200


def test_input_mismatch_with_boto3(runtime) -> None:
    with pytest.raises(runtime.exceptions.ModelError) as raised:
        runtime.invoke_endpoint(
            EndpointName="it-fifteen",
            TargetContainerHostname="onnx-two",
            ContentType="application/json",
            Body=json.dumps([[5.1, 3.5, 1.4, 0.2]]),
        )
    error = raised.value.response
    assert "onnx-two" in error["Error"]["Message"]
    assert "takes 2 inputs" in error["OriginalMessage"]


def test_serial_mismatch_names_the_container_and_position(server) -> None:
    with pytest.raises(ModelError) as raised:
        server.client.invoke("it-hetero-serial", [[5.1, 3.5, 1.4]])
    assert raised.value.status_code == 424, raised.value
    error = raised.value.body
    assert error["ContainerHostname"] == "features"
    assert "position 1 of 3" in error["message"]


# --- a container's own runtime environment -------------------------------------------------------


def test_working_dir_and_cpu_share_reach_the_replica(server, working_dir_model) -> None:
    response = server.client.invoke("it-runtime-env", b"{}", content_type="application/json")
    assert response.status_code == 200
    assert response.body == {
        "helper": "from the working dir",
        "cwd": str(working_dir_model[1].resolve()),
        "cpus": "0.01",
    }


def _batch_metrics(server) -> tuple[float, float]:
    """(batches, rows) it-hetero-serial-onnx's batching classifier has reported so far."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {"serving_batch_size_count": 0.0, "serving_batch_size_sum": 0.0}
    for family in text_string_to_metric_families(server.http.get("/metrics").text):
        for sample in family.samples:
            if sample.name in values and sample.labels.get("endpoint") == "it-hetero-serial-onnx":
                values[sample.name] += sample.value
    return values["serving_batch_size_count"], values["serving_batch_size_sum"]


def test_batching_container_answers_each_concurrent_caller_with_its_own_rows(server) -> None:
    # it-hetero-serial-onnx's classifier batches (MaxBatchSize 16, MaxDelayMs 20): 24 callers at
    # once, each with its own row mix, get exactly their own labels, and the replica reports fewer
    # batches than requests.
    import random
    from concurrent.futures import ThreadPoolExecutor

    picks = random.Random(7)
    mixes = [[picks.randrange(3) for _ in range(picks.randint(1, 3))] for _ in range(24)]
    rows = sum(map(len, mixes))
    batches_before, rows_before = _batch_metrics(server)

    def call(mix: list[int]):
        return server.client.invoke(
            "it-hetero-serial-onnx",
            json.dumps([IRIS_ROWS[i] for i in mix]),
            content_type="application/json",
        )

    with ThreadPoolExecutor(max_workers=24) as pool:
        responses = list(pool.map(call, mixes))
    for mix, response in zip(mixes, responses, strict=True):
        assert response.status_code == 200
        assert response.body == {"labels": [IRIS_NAMES[i] for i in mix]}
    deadline = time.monotonic() + 60
    # the supervisor relays the events, Ray pushes them to the node's agent
    while time.monotonic() < deadline:
        batches, seen_rows = _batch_metrics(server)
        if seen_rows - rows_before >= rows:
            break
        time.sleep(1)
    time.sleep(8)  # one more relay and push: every batch of this test counted
    batches, seen_rows = _batch_metrics(server)
    assert seen_rows - rows_before >= rows, (seen_rows, rows_before, rows)
    # some requests shared a batch
    assert batches - batches_before < len(mixes), (batches, batches_before)
