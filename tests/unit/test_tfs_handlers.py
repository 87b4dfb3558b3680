"""`code/inference.py` on the tensorflow stack: SageMaker TensorFlow Serving container's handler
contract.

Scripts are those of the container's own tests (test/resources/examples/test1, test2): input_handler
/ output_handler, and handler posting to `context.rest_uri` with `requests`, served by a real
ContainerApp on loopback so that the post reaches the model through the data port's token-guarded
REST route.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from serving.http.server import BackgroundServer
from serving.model_server.app import build_container_app
from serving.runtimes import runtime_for
from serving.runtimes.concurrency import BatchSettings
from tests.unit.test_tfs_shapes import save_half_plus_three

# imports torch, TensorFlow, ONNX Runtime or XGBoost: not in `make test-unit`
pytestmark = pytest.mark.frameworks

PROCESS = """
import json
def _process_input(data, context):
    if context.request_content_type == 'application/json':
        d = data.read().decode('utf-8')
        return d if len(d) else ''
    if context.request_content_type == 'text/csv':
        return json.dumps({'instances': [float(x) for x in data.read().decode('utf-8').split(',')]})
    raise ValueError('{{"error": "unsupported content type {}"}}'.format(context.request_content_type or "unknown"))

def _process_output(data, context):
    if data.status_code != 200:
        raise ValueError(data.content.decode('utf-8'))
    return data.content, context.accept_header
"""
INPUT_OUTPUT = PROCESS + "input_handler = _process_input\noutput_handler = _process_output\n"
HANDLER = (
    PROCESS
    + """
import requests
def handler(data, context):
    response = requests.post(context.rest_uri, data=_process_input(data, context))
    return _process_output(response, context)
"""
)
CONTEXT = """
def handler(data, context):
    fields = {k: v for k, v in context._asdict().items() if k not in ("rest_uri", "grpc_port", "channel")}
    fields["data"] = data.read().decode()
    fields["rest_uri_tail"] = context.rest_uri.rsplit("/", 3)[-2:]
    return json.dumps(fields), "application/json"
import json
"""
GRPC = "def handler(data, context):\n    return 'localhost:{}'.format(context.grpc_port), 'text/plain'\n"
# What the TF Serving DLC's python_service.py does now, in its default handler and around
# input_handler / output_handler: post with `timeout=context.timeout` (SAGEMAKER_TFS_WAIT_TIME_SECONDS).
TIMEOUT = """
import requests
def handler(data, context):
    response = requests.post(context.rest_uri, data=data.read().decode('utf-8'), timeout=context.timeout)
    return response.content, context.accept_header + '; timeout=' + str(context.timeout)
"""


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_half_plus_three(tmp_path_factory.mktemp("tfs-handlers"))


@pytest.fixture
def serve(model_folder: Path, tmp_path: Path):
    servers: list[BackgroundServer] = []

    def start(script: str, environment: dict[str, str] | None = None, **app_settings: Any) -> str:
        folder = tmp_path / f"m{len(servers)}"
        (folder / "code").mkdir(parents=True)
        (folder / "half_plus_three").symlink_to(model_folder / "half_plus_three")
        (folder / "code" / "inference.py").write_text(script)
        runtime = runtime_for("tensorflow", folder, environment or {})
        runtime.load()
        server = BackgroundServer(build_container_app(runtime, "tfs", **app_settings))
        assert server.wait_started()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


def post(
    url: str, body: str, content_type: str, accept: str | None = "application/json"
) -> requests.Response:
    headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
    return requests.post(url + "/invocations", data=body, headers=headers, timeout=30)


@pytest.mark.parametrize(
    "script", [INPUT_OUTPUT, HANDLER], ids=["input_handler+output_handler", "handler"]
)
def test_container_examples_answer_as_documented(serve, script: str) -> None:
    url = serve(script)
    csv = post(url, "1.0,2.0,5.0", "text/csv")
    assert (csv.status_code, csv.content) == (
        200,
        b'{\n    "predictions": [3.5, 4.0, 5.5\n    ]\n}',
    )
    assert csv.headers["content-type"] == "application/json"
    assert post(url, '{"instances": [1.0]}', "application/json").json() == {"predictions": [3.5]}
    # TF Serving's 400 reaches output_handler, whose ValueError is the container's 500 {"error":
    # str(e)}.
    failed = post(url, '{"instances": ["a"]}', "application/json")
    assert failed.status_code == 500 and json.loads(failed.json()["error"])["error"]
    refused = post(url, "x", "text/plain")
    assert refused.status_code == 500
    assert refused.json() == {"error": '{"error": "unsupported content type text/plain"}'}


def test_handlers_calling_back_work_with_model_threads_and_batching(serve) -> None:
    # The model never runs on the event loop, so a handler's context.rest_uri call is answered while
    # every model thread is busy with handlers waiting on it.
    from concurrent.futures import ThreadPoolExecutor

    url = serve(INPUT_OUTPUT, threads=2, batching=BatchSettings(8, max_delay_s=0.05))
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda x: post(url, f"{x}.0", "text/csv"), range(6)))
    assert [a.json() for a in answers] == [{"predictions": [x / 2 + 3]} for x in range(6)]


def test_context_carries_the_containers_fields(serve) -> None:
    url = serve(CONTEXT)
    headers = {
        "Content-Type": "text/csv",
        "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-version=123,x=1",
    }
    # Accept: */*
    got = requests.post(url + "/invocations", data="1,2", headers=headers, timeout=30).json()
    assert got == {
        "model_name": None,
        "model_version": "123",
        "method": None,
        "custom_attributes": "tfs-model-version=123,x=1",
        "request_content_type": "text/csv",
        "accept_header": "*/*",
        "content_length": 3,
        "timeout": 55,  # SAGEMAKER_TFS_WAIT_TIME_SECONDS' default, for one TF Serving instance
        "data": "1,2",
        "rest_uri_tail": ["versions", "123:predict"],
    }


def test_context_timeout_is_the_containers_wait_time(serve) -> None:
    # The DLC's tfs_utils.Context gained `timeout`, and its handlers post with it; a script written
    # for it failed here with AttributeError.
    for environment, seconds in (({}, 55), ({"SAGEMAKER_TFS_WAIT_TIME_SECONDS": "7"}, 7)):
        answer = post(serve(TIMEOUT, environment), '{"instances": [1.0]}', "application/json")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"predictions": [3.5]}
        assert answer.headers["content-type"] == f"application/json; timeout={seconds}"


def test_a_wait_time_that_is_not_a_number_of_seconds_is_refused_at_load(serve) -> None:
    with pytest.raises(ValueError, match="SAGEMAKER_TFS_WAIT_TIME_SECONDS"):
        serve(TIMEOUT, {"SAGEMAKER_TFS_WAIT_TIME_SECONDS": "soon"})


def test_grpc_is_refused_with_a_clear_message(serve) -> None:
    failed = post(serve(GRPC), "1", "text/csv")
    assert failed.status_code == 500 and "offers no TF Serving gRPC port" in failed.json()["error"]


def test_rest_route_needs_the_token(serve) -> None:
    url = serve(CONTEXT)
    for path in (
        "/_serving/tfs/" + "0" * 32 + "/v1/models/half_plus_three:predict",
        "/v1/models/half_plus_three:predict",
    ):
        assert requests.post(url + path, data='{"instances": [1.0]}', timeout=10).status_code == 404


@pytest.mark.parametrize(
    ("script", "named"),
    [
        ("def input_fn(body, content_type):\n    return body\n", "input_fn"),
        (
            "def model_fn(model_dir):\n    return None\ndef handler(d, c):\n    return b'', 'x'\n",
            "model_fn",
        ),
        ("def input_handler(data, context):\n    return data.read()\n", "output_handler"),
        ("import os\n", "defines no handler"),
    ],
)
def test_unsupported_hooks_are_refused_at_load(
    model_folder: Path, tmp_path: Path, script: str, named: str
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "half_plus_three").symlink_to(model_folder / "half_plus_three")
    (tmp_path / "code" / "inference.py").write_text(script)
    with pytest.raises(ValueError, match=named):
        runtime_for("tensorflow", tmp_path, {}).load()


def test_handler_wins_over_input_and_output_handlers(
    serve, caplog: pytest.LogCaptureFixture
) -> None:
    script = (
        HANDLER
        + "def input_handler(d, c):\n    raise AssertionError\n"
        + "def output_handler(r, c):\n    raise AssertionError\n"
    )
    assert post(serve(script), "1.0", "text/csv").status_code == 200
    assert "defines handler and input_handler and output_handler: handler is used" in caplog.text
