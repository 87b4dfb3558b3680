"""A tensorflow container's TF Serving route (`context.rest_uri`) is no standing capability (issue
41, finding 5).

Before the fix the route took one token per process, and a handler's failure was answered and logged
as `{"error": str(e)}`: `requests`' HTTPError names the URL, token included, Ray writes its logs
world-readable, and a local user who read the token called the protected container's model with no
credentials. Now the URL carries a nonce valid only while its invocation runs, and answers and log
lines leave the URL out.

A real container process serves a real SavedModel with a SageMaker TFS-style handler.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import httpx
import pytest

from serving.model_server.container_config import ContainerConfig
from serving.model_server.supervisor import ContainerProcess
from serving.protocol import LOCAL_TFS_PATH
from serving.trust import hops

KEY = b"t" * 32
HANDLER = """
import json, requests

def handler(data, context):
    request = json.loads(data.read().decode())
    if request.get("leak"):  # a failing call: requests' error names the URL it posted to
        response = requests.post(context.rest_uri, data="not json")
        response.raise_for_status()
    if request.get("show"):  # the model's own choice to hand its URL out (a stand-in for any leak)
        return json.dumps({"rest_uri": context.rest_uri}), "application/json"
    response = requests.post(context.rest_uri, data=json.dumps({"instances": request["instances"]}))
    return response.content, "application/json"
"""


@pytest.fixture(scope="module")
def container(tmp_path_factory) -> Iterator[ContainerProcess]:
    from tests.unit.test_tfs_shapes import save_half_plus_three

    model = save_half_plus_three(tmp_path_factory.mktemp("tfs-capability") / "model")
    (model / "code").mkdir()
    (model / "code" / "inference.py").write_text(HANDLER)
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="tfs",
            image="tensorflow",
            model_data=str(model),
            environment={},
            hop_key=KEY,
        ),
        "127.0.0.1",
    )
    # the process's stderr, as a replica's is its Ray worker's log file
    log = model.parent / "container.log"
    saved = os.dup(2)
    with open(log, "wb") as out:
        os.dup2(out.fileno(), 2)
        try:
            process.start(timeout=180)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    process.log = log  # type: ignore[attr-defined]
    yield process
    process.stop()


def invoke(container: ContainerProcess, document: dict) -> httpx.Response:
    body = json.dumps(document).encode()
    headers = {"content-type": "application/json", "accept": "application/json"}
    headers.update(hops.sign(KEY, "POST", "/invocations", body, headers))
    return httpx.post(container.url + "/invocations", content=body, headers=headers, timeout=60)


def test_the_handler_reaches_its_own_model(container) -> None:
    answer = invoke(container, {"instances": [1.0, 2.0]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"predictions": [3.5, 4.0]}


def test_a_failing_handler_leaks_no_url_in_its_answer_or_log(container) -> None:
    answer = invoke(container, {"leak": True})
    assert answer.status_code == 500
    assert "HTTPError" in answer.text or "Error" in answer.text, answer.text
    assert LOCAL_TFS_PATH not in answer.text and container.url not in answer.text, answer.text
    assert "<rest_uri>" in answer.text  # what took the URL's place
    log = container.log.read_text()
    assert "handler failed" in log
    assert LOCAL_TFS_PATH not in log, log[-2000:]


def test_a_url_that_got_out_is_dead_once_its_invocation_ends(container) -> None:
    leaked = invoke(container, {"show": True}).json()["rest_uri"]
    assert LOCAL_TFS_PATH in leaked
    # a local user, no credentials
    late = httpx.post(leaked, content=json.dumps({"instances": [1.0]}), timeout=30)
    # before: 200, the model ran for anyone holding the token
    assert late.status_code == 404, late.text
