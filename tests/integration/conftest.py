"""One embedded Ray + endpoint server per test session, with the endpoints the tests use.

Every wait is bounded; everything is torn down at the end of the session.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest

from serving.settings import ServerSettings
from serving.spec import parse_spec

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 240

HANDLERS = {
    # predict_fn fails for every input: the model's own error must reach the caller as ModelError.
    "faulty": '''
def predict_fn(data, model):
    raise RuntimeError("faulty model: cannot score this input")
''',
    # Sleeps for the seconds given in custom attributes ("sleep=2.5"): timeouts and backpressure.
    "sleepy": '''
import json, time

def input_fn(body, content_type):
    return body

def predict_fn(data, model, context):
    seconds = float((context.custom_attributes or "sleep=0").split("=", 1)[1])
    time.sleep(seconds)
    return {"slept": seconds}
''',
    # Echoes what it received, with its content type: proves the serial hand-off.
    "echo": '''
import json

def input_fn(body, content_type):
    return {"content_type": content_type, "body": body.decode()}

def predict_fn(data, model):
    return data

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
''',
    # Emits CSV whatever it gets: the next container must receive text/csv.
    "to-csv": '''
def input_fn(body, content_type):
    return body

def predict_fn(data, model):
    return "1.0,2.0\\n3.0,4.0\\n"

def output_fn(prediction, accept):
    return prediction, "text/csv"
''',
    # Fails to load: the endpoint must become Failed with this reason, not hang.
    "broken": '''
def model_fn(model_dir):
    raise ValueError("weights file is corrupt (test)")

def predict_fn(data, model):
    return data
''',
}


def _handler_dir(root: Path, name: str) -> Path:
    folder = root / name
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(HANDLERS[name])
    return folder


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def handler_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("handlers")
    return {name: _handler_dir(root, name) for name in HANDLERS}


def endpoint_specs(demo: Path, handlers: dict[str, Path]) -> list[dict]:
    py = lambda host, name, **extra: {"ContainerHostname": host, "Image": "python", "ModelDataUrl": str(handlers[name]), **extra}
    sk = lambda host, model, **extra: {"ContainerHostname": host, "Image": "sklearn", "ModelDataUrl": str(demo / model), **extra}
    fifteen = [
        sk(f"iris-{i}", "iris-classifier") if i % 3 == 0 else
        sk(f"wine-{i}", "wine-classifier") if i % 3 == 1 else
        py(f"echo-{i}", "echo")
        for i in range(15)
    ]
    return [
        {"EndpointName": "it-direct", "Containers": [
            sk("iris", "iris-classifier"),
            sk("wine", "wine-classifier", Environment={"SERVING_SKLEARN_METHOD": "predict_proba"}),
            {"ContainerHostname": "labels", "Image": "python", "ModelDataUrl": str(demo / "iris-labels.tar.gz")},
            py("faulty", "faulty"),
            py("sleepy", "sleepy"),
            py("narrow", "sleepy", Environment={"SERVING_MAX_CONCURRENCY": "1"}),
        ]},
        {"EndpointName": "it-single", "Containers": [sk("only", "iris-classifier")]},
        {"EndpointName": "it-serial", "InferenceExecutionConfig": {"Mode": "Serial"}, "Containers": [
            sk("preprocess", "iris-preprocess"),
            sk("classifier", "iris-on-features"),
            {"ContainerHostname": "labels", "Image": "python", "ModelDataUrl": str(demo / "iris-labels.tar.gz")},
        ]},
        {"EndpointName": "it-handoff", "InferenceExecutionConfig": {"Mode": "Serial"}, "Containers": [
            py("first", "to-csv"), py("second", "echo"),
        ]},
        {"EndpointName": "it-serial-fail", "InferenceExecutionConfig": {"Mode": "Serial"}, "Containers": [
            sk("preprocess", "iris-preprocess"), py("faulty", "faulty"), py("never", "echo"),
        ]},
        {"EndpointName": "it-broken", "Containers": [py("fine", "echo"), py("broken", "broken")]},
        {"EndpointName": "it-fifteen", "Containers": fifteen},
    ]


def _small(specs: list[dict]) -> list[dict]:
    # ~35 replicas share the session's 2 logical CPUs: reserve a small share each.
    for spec in specs:
        for container in spec["Containers"]:
            container.setdefault("Resources", {"Cpus": 0.05})
    return specs


class Server:
    """The running endpoint server: its URL and an HTTP client."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30)

    def invoke(self, endpoint: str, body, *, target: str | None = None, content_type: str = "application/json",
               headers: dict | None = None) -> httpx.Response:
        all_headers = {"Content-Type": content_type, **(headers or {})}
        if target is not None:
            all_headers["X-Amzn-SageMaker-Target-Container-Hostname"] = target
        data = body if isinstance(body, (bytes, str)) else __import__("json").dumps(body)
        return self.http.post(f"/endpoints/{endpoint}/invocations", content=data, headers=all_headers)

    def describe(self, name: str) -> dict:
        return self.http.get(f"/endpoints/{name}").json()


@pytest.fixture(scope="session")
def server(demo_models, handler_models):
    """Embedded Ray, the endpoint server and every test endpoint; torn down after the session."""
    from serving import app

    settings = ServerSettings(port=_free_port(), max_payload_mb=1.0, invocation_timeout_s=3.0)
    app.start_local_ray(num_cpus=2)
    try:
        url = app.start_gateway(settings)
        specs = [parse_spec(doc) for doc in _small(endpoint_specs(demo_models, handler_models))]
        for spec in specs:
            app.deploy_endpoint(spec, settings)
        running = Server(url)
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = {spec.EndpointName for spec in specs}
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                response = running.http.get(f"/endpoints/{name}")
                if response.status_code == 200 and response.json()["EndpointStatus"] in ("InService", "Failed"):
                    pending.discard(name)
            time.sleep(0.5)
        assert not pending, f"endpoints not ready after {READY_TIMEOUT_S} s: {sorted(pending)}"
        yield running
        running.http.close()
    finally:
        app.shutdown()
