"""serving.gateway.router + serving.model_server.app over loopback HTTP, without Ray.

Each container is a ContainerApp around a real runtime on its own data port; the
router reaches them through a ContainerTransport whose replica table the test sets,
exactly as the gateway does with what the registry reports.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from serving import protocol
from serving.config.spec import DEFAULT_MAX_CONCURRENCY
from serving.gateway.router import EndpointRoute, Router
from serving.gateway.transport import ContainerTransport
from serving.http.responses import serving_app
from serving.http.server import BackgroundServer
from serving.model_server.app import build_container_app
from serving.runtimes import Runtime, runtime_for
from serving.settings import ServerSettings

if TYPE_CHECKING:
    from conftest import Iris, SavedModel

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.2, 3.4, 5.4, 2.3], [5.9, 3.0, 4.2, 1.5]]
JSON = {"content-type": "application/json"}
SAFETY_WAIT_S = 10  # how long a gated predict_fn waits for its release before giving up

LABELS_HANDLER = """
import json, os

def model_fn(model_dir):
    with open(os.path.join(model_dir, "labels.json")) as f:
        return json.load(f)

def input_fn(body, content_type, context):
    return {"ids": json.loads(body), "received": content_type, "inference_id": context.inference_id}

def predict_fn(data, labels):
    return {"labels": [labels[int(i)] for i in data.pop("ids")], **data}

def output_fn(prediction, accept, context):
    if context.custom_attributes:
        context.response_custom_attributes = context.custom_attributes + ";labelled=" + str(len(prediction["labels"]))
    return json.dumps(prediction), "application/json"
"""

FAILING_HANDLER = """
def predict_fn(data, model):
    raise RuntimeError("boom: the model exploded")
"""

# predict_fn signals that it started, then blocks until the test releases it.
GATED_HANDLER = (
    """
import threading

def model_fn(model_dir):
    return {"entered": threading.Event(), "release": threading.Event()}

def predict_fn(data, gate):
    gate["entered"].set()
    gate["release"].wait(%d)
    return data
"""
    % SAFETY_WAIT_S
)


def write_handler(folder: Path, source: str, files: dict[str, str] | None = None) -> Path:
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(source)
    for name, content in (files or {}).items():
        (folder / name).write_text(content)
    return folder


def load(image: str, model_dir: Path, environment: dict[str, str] | None = None) -> Runtime:
    runtime = runtime_for(image, model_dir, environment or {})
    runtime.load()
    return runtime


class Servers:
    """Starts ASGI apps on loopback ports and stops every one of them at the end."""

    def __init__(self) -> None:
        self._servers: list[BackgroundServer] = []

    def serve(self, app: Any) -> str:
        server = BackgroundServer(app, "127.0.0.1", 0)
        self._servers.append(server)
        assert server.wait_started(), "server did not start"
        return server.url

    def stop(self) -> None:
        for server in reversed(self._servers):
            server.stop()
        self._servers.clear()


@pytest.fixture(scope="module")
def module_servers() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop()


@pytest.fixture
def servers() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop()


@pytest.fixture(scope="module")
def containers(
    module_servers: Servers,
    iris: Iris,
    iris_classifier: SavedModel,
    iris_scaler: SavedModel,
    iris_on_scaled: SavedModel,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, str]:
    """Hostname -> data-port URL of the shared containers."""
    labels_dir = write_handler(
        tmp_path_factory.mktemp("labels"),
        LABELS_HANDLER,
        {"labels.json": json.dumps(iris.target_names)},
    )
    runtimes = {
        "iris": load("sklearn", iris_classifier.path),
        # The pipeline's first step emits CSV (SageMaker's variable), which the next step reads.
        "scaler": load(
            "sklearn", iris_scaler.path, {"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv"}
        ),
        "classifier": load("sklearn", iris_on_scaled.path),
        "labels": load("python", labels_dir),
        "boom": load("python", write_handler(tmp_path_factory.mktemp("boom"), FAILING_HANDLER)),
    }
    return {
        name: module_servers.serve(build_container_app(runtime, name))
        for name, runtime in runtimes.items()
    }


def dead_url() -> str:
    """A loopback URL nothing listens on (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def endpoints() -> list[EndpointRoute]:
    return [
        EndpointRoute("direct", "Direct", ("iris", "labels", "boom")),
        EndpointRoute("single", "Direct", ("iris",)),
        EndpointRoute("pipeline", "Serial", ("scaler", "classifier", "labels")),
        EndpointRoute("pipeline-boom", "Serial", ("scaler", "boom", "labels")),
        EndpointRoute("named", "Serial", ("iris", "labels")),
        EndpointRoute("no-replicas", "Direct", ("iris",)),
        EndpointRoute(
            "failed",
            "Direct",
            ("iris",),
            failure="container iris: FileNotFoundError: no model.skops",
        ),
    ]


def table(containers: dict[str, str]) -> dict[tuple[str, str], list[str]]:
    return {
        (endpoint.name, hostname): [containers[hostname]]
        for endpoint in endpoints()
        if endpoint.name != "no-replicas"
        for hostname in endpoint.containers
    }


def start_router(
    servers: Servers,
    routes: list[EndpointRoute],
    replicas: dict[tuple[str, str], list[str]],
    limits: dict[tuple[str, str], int] | None = None,
    default_limit: int = DEFAULT_MAX_CONCURRENCY,
    **settings: Any,
) -> tuple[str, ContainerTransport]:
    """Serve a Router (its routes mounted in Starlette, as the gateway does); returns its URL and
    transport."""
    transport = ContainerTransport(default_limit=default_limit)
    router = Router(ServerSettings(**settings), transport)
    router.endpoints = {route.name: route for route in routes}
    transport.update(replicas, limits)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await transport.start()  # the aiohttp session lives on the server's own loop
        try:
            yield
        finally:
            await transport.close()

    return servers.serve(
        serving_app(router.routes(), lifespan=lifespan, hot=router.hot_route())
    ), transport


@pytest.fixture(scope="module")
def client(module_servers: Servers, containers: dict[str, str]) -> Iterator[httpx.Client]:
    """A client of the router shared by the tests that leave its state alone."""
    url, _ = start_router(module_servers, endpoints(), table(containers))
    with httpx.Client(base_url=url, timeout=60) as client:
        yield client


RouterFactory = Callable[..., tuple[httpx.Client, ContainerTransport]]


@pytest.fixture
def make_router(servers: Servers) -> Iterator[RouterFactory]:
    """A router of the test's own (settings, limits, replicas): a client for it and its
    transport."""
    clients: list[httpx.Client] = []

    def make(*args: Any, **kwargs: Any) -> tuple[httpx.Client, ContainerTransport]:
        url, transport = start_router(servers, *args, **kwargs)
        clients.append(httpx.Client(base_url=url, timeout=60))
        return clients[-1], transport

    yield make
    for client in clients:
        client.close()


def invoke(
    client: httpx.Client, endpoint: str, body: Any = ROWS, headers: dict[str, str] | None = None
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(
        f"/endpoints/{endpoint}/invocations", content=content, headers={**JSON, **(headers or {})}
    )


def assert_error(
    response: httpx.Response, status: int, code: str, *fragments: str
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["x-amzn-ErrorType"] == code
    body = response.json()
    assert body["__type"] == code
    for fragment in fragments:
        assert fragment in body["message"], body["message"]
    return body


# --- success paths ---------------------------------------------------------------------


def test_direct_routes_by_hostname_header(
    client: httpx.Client, iris_classifier: SavedModel
) -> None:
    response = invoke(client, "direct", headers={protocol.TARGET_CONTAINER: "iris"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == iris_classifier.estimator.predict(np.array(ROWS)).tolist()
    assert response.headers["x-Amzn-Invoked-Production-Variant"] == "AllTraffic"

    response = invoke(client, "direct", [2, 0, 1], headers={protocol.TARGET_CONTAINER: "labels"})
    assert response.status_code == 200, response.text
    assert response.json()["labels"] == ["virginica", "setosa", "versicolor"]


def test_single_container_needs_no_header(
    client: httpx.Client, iris_classifier: SavedModel
) -> None:
    response = invoke(client, "single")
    assert response.status_code == 200, response.text
    assert response.json() == iris_classifier.estimator.predict(np.array(ROWS)).tolist()


def test_accept_reaches_the_container(client: httpx.Client, iris_classifier: SavedModel) -> None:
    response = invoke(client, "single", headers={"accept": "text/csv"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    expected = iris_classifier.estimator.predict(np.array(ROWS))
    assert response.text.split() == [str(value) for value in expected]


def test_serial_chain_hands_off_body_and_content_type(
    client: httpx.Client, iris: Iris, iris_scaler: SavedModel, iris_on_scaled: SavedModel
) -> None:
    # The client sends JSON; the scaler answers CSV, which the classifier can only read
    # if the router hands the scaler's content type on; the classifier answers JSON.
    response = invoke(client, "pipeline")
    assert response.status_code == 200, response.text
    ids = iris_on_scaled.estimator.predict(iris_scaler.estimator.transform(np.array(ROWS)))
    assert response.json() == {
        "labels": [iris.target_names[i] for i in ids],
        "received": "application/json",
        "inference_id": None,
    }
    assert response.headers["x-Amzn-Invoked-Production-Variant"] == "AllTraffic"


def test_serial_accept_is_for_the_last_container(
    client: httpx.Client, iris: Iris, iris_classifier: SavedModel
) -> None:
    # labels reads JSON only: had iris been asked for CSV, the chain would fail at labels.
    response = invoke(client, "named", headers={"accept": "text/csv"})
    assert response.status_code == 200, response.text
    ids = iris_classifier.estimator.predict(np.array(ROWS))
    assert response.json()["labels"] == [iris.target_names[i] for i in ids]


def test_inference_id_reaches_the_container(client: httpx.Client) -> None:
    response = invoke(
        client,
        "direct",
        [1],
        headers={protocol.TARGET_CONTAINER: "labels", protocol.INFERENCE_ID: "req-123"},
    )
    assert response.status_code == 200, response.text
    assert response.json() == {
        "labels": ["versicolor"],
        "received": "application/json",
        "inference_id": "req-123",
    }


def test_custom_attributes_round_trip(client: httpx.Client) -> None:
    response = invoke(
        client,
        "direct",
        [0, 1],
        headers={protocol.TARGET_CONTAINER: "labels", protocol.CUSTOM_ATTRIBUTES: "trace=42"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["X-Amzn-SageMaker-Custom-Attributes"] == "trace=42;labelled=2"

    response = invoke(client, "pipeline", headers={protocol.CUSTOM_ATTRIBUTES: "batch=7"})
    assert response.status_code == 200, response.text
    assert response.headers["X-Amzn-SageMaker-Custom-Attributes"] == "batch=7;labelled=3"


def test_no_custom_attributes_header_unless_the_container_sets_one(client: httpx.Client) -> None:
    response = invoke(client, "direct", [0], headers={protocol.TARGET_CONTAINER: "labels"})
    assert response.status_code == 200, response.text
    assert "X-Amzn-SageMaker-Custom-Attributes" not in response.headers
    # The sklearn stack never sets attributes: the caller's are not echoed blindly.
    response = invoke(client, "single", headers={protocol.CUSTOM_ATTRIBUTES: "trace=1"})
    assert response.status_code == 200, response.text
    assert "X-Amzn-SageMaker-Custom-Attributes" not in response.headers


def test_all_traffic_variant_is_accepted(client: httpx.Client) -> None:
    response = invoke(client, "single", headers={protocol.TARGET_VARIANT: "AllTraffic"})
    assert response.status_code == 200, response.text


def test_refused_replica_is_dropped_and_another_answers(
    make_router: RouterFactory, containers: dict[str, str]
) -> None:
    route = EndpointRoute("single", "Direct", ("iris",))
    client, _ = make_router([route], {("single", "iris"): [dead_url(), containers["iris"]]})
    for _ in range(3):  # whichever replica comes first, every request is answered
        response = invoke(client, "single")
        assert response.status_code == 200, response.text


def test_payload_at_the_limit_is_accepted(
    make_router: RouterFactory, containers: dict[str, str]
) -> None:
    client, _ = make_router(endpoints(), table(containers), max_payload_mb=0.001)  # 1000 bytes
    body = json.dumps(ROWS).encode().ljust(1000)
    response = invoke(client, "single", body)
    assert response.status_code == 200, response.text


# --- errors from the router ----------------------------------------------------------------

ROUTER_ERRORS = [
    ("unknown endpoint", "nope", {}, 400, "ValidationError", ["Endpoint nope not found"]),
    (
        "missing hostname with three containers",
        "direct",
        {},
        400,
        "ValidationError",
        [protocol.TARGET_CONTAINER, "is required", "iris, labels, boom"],
    ),
    (
        "unknown hostname",
        "direct",
        {protocol.TARGET_CONTAINER: "french"},
        400,
        "ValidationError",
        ["'french'", "names no container"],
    ),
    (
        "malformed hostname",
        "direct",
        {protocol.TARGET_CONTAINER: "no such host"},
        400,
        "ValidationError",
        ["names no container"],
    ),
    (
        "hostname of another endpoint",
        "single",
        {protocol.TARGET_CONTAINER: "labels"},
        400,
        "ValidationError",
        ["'labels'"],
    ),
    (
        "hostname on a Serial endpoint",
        "pipeline",
        {protocol.TARGET_CONTAINER: "scaler"},
        400,
        "ValidationError",
        ["Serial"],
    ),
    (
        "other variant",
        "single",
        {protocol.TARGET_VARIANT: "Blue"},
        400,
        "ValidationError",
        ["'Blue'", "AllTraffic"],
    ),
    (
        "target model",
        "single",
        {protocol.TARGET_MODEL: "m.tar.gz"},
        400,
        "ValidationError",
        ["MultiModel"],
    ),
    (
        "inference id too long",
        "single",
        {protocol.INFERENCE_ID: "i" * 65},
        400,
        "ValidationError",
        ["1-64"],
    ),
    ("empty inference id", "single", {protocol.INFERENCE_ID: ""}, 400, "ValidationError", ["1-64"]),
    (
        "custom attributes too long",
        "single",
        {protocol.CUSTOM_ATTRIBUTES: "a" * 1025},
        400,
        "ValidationError",
        ["1024"],
    ),
    ("no replicas", "no-replicas", {}, 429, "ModelNotReadyException", ["iris", "no ready replica"]),
    (
        "failed endpoint",
        "failed",
        {},
        503,
        "ServiceUnavailable",
        ["is Failed", "FileNotFoundError"],
    ),
]


@pytest.mark.parametrize(
    ("endpoint", "headers", "status", "code", "fragments"),
    [case[1:] for case in ROUTER_ERRORS],
    ids=[case[0] for case in ROUTER_ERRORS],
)
def test_router_errors(
    client: httpx.Client,
    endpoint: str,
    headers: dict[str, str],
    status: int,
    code: str,
    fragments: list[str],
) -> None:
    assert_error(invoke(client, endpoint, headers=headers), status, code, *fragments)


def test_refused_only_replica_is_not_ready_and_reported_dropped(make_router: RouterFactory) -> None:
    dead = dead_url()
    client, transport = make_router(
        [EndpointRoute("single", "Direct", ("iris",))], {("single", "iris"): [dead]}
    )
    assert_error(invoke(client, "single"), 429, "ModelNotReadyException", "no ready replica")
    assert transport.replica_count("single", "iris") == 0
    assert transport.take_dropped() == [dead]  # for the gateway to tell the registry
    assert transport.take_dropped() == []


def test_payload_over_the_limit(make_router: RouterFactory, containers: dict[str, str]) -> None:
    client, _ = make_router(endpoints(), table(containers), max_payload_mb=0.001)  # 1000 bytes
    body = json.dumps(ROWS).encode().ljust(1001)
    assert_error(
        invoke(client, "single", body), 400, "ValidationError", "exceeds the limit of 1000 bytes"
    )


def test_streamed_payload_over_the_limit(
    make_router: RouterFactory, containers: dict[str, str]
) -> None:
    client, _ = make_router(endpoints(), table(containers), max_payload_mb=0.001)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the router must count as it reads
        for _ in range(20):
            yield b" " * 100

    response = client.post("/endpoints/single/invocations", content=chunks(), headers=JSON)
    assert "content-length" not in response.request.headers
    assert_error(response, 400, "ValidationError", "exceeds the limit of 1000 bytes")


# --- errors from containers ----------------------------------------------------------------


def test_container_failure_is_a_model_error(client: httpx.Client) -> None:
    body = assert_error(
        invoke(client, "direct", headers={protocol.TARGET_CONTAINER: "boom"}),
        424,
        "ModelError",
        "container boom",
    )
    assert body["OriginalStatusCode"] == 500
    assert "boom: the model exploded" in body["OriginalMessage"]
    assert body["ContainerHostname"] == "boom"


def test_serial_failure_names_container_and_position(client: httpx.Client) -> None:
    body = assert_error(
        invoke(client, "pipeline-boom"), 424, "ModelError", "container boom (position 2 of 3)"
    )
    assert body["OriginalStatusCode"] == 500
    assert "RuntimeError: boom: the model exploded" == body["OriginalMessage"]


def test_wrong_feature_count_is_a_model_error(client: httpx.Client) -> None:
    body = assert_error(
        invoke(client, "single", [[1.0, 2.0, 3.0]]), 424, "ModelError", "container iris"
    )
    assert body["OriginalStatusCode"] == 500
    assert "features" in body["OriginalMessage"]


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ({"content-type": "text/plain"}, "unsupported content type 'text/plain'"),
        ({"accept": "image/png"}, "unsupported Accept 'image/png'"),
    ],
    ids=["content type", "accept"],
)
def test_unsupported_format_is_a_model_error_with_the_containers_415(
    client: httpx.Client, headers: dict[str, str], fragment: str
) -> None:
    # SageMaker reports every non-2xx answer of a model container as ModelError; the toolkits answer
    # 415 here.
    body = assert_error(
        invoke(client, "single", headers=headers),
        424,
        "ModelError",
        "Received client error (415) from container iris",
        fragment,
    )
    assert body["OriginalStatusCode"] == 415
    assert fragment in body["OriginalMessage"]


def test_serial_bad_payload_is_a_model_error_naming_the_position(client: httpx.Client) -> None:
    body = assert_error(
        invoke(client, "pipeline", {"rows": ROWS}),
        424,
        "ModelError",
        "(400) from container scaler (position 1 of 3)",
        '"instances" or "inputs"',
    )
    assert body["OriginalStatusCode"] == 400


# --- a container that holds requests: timeouts and the per-replica concurrency bound ------------


@pytest.fixture
def gated(
    servers: Servers, tmp_path: Path
) -> Iterator[Callable[[], tuple[str, dict[str, threading.Event]]]]:
    """Start a container whose predict_fn blocks until released; released at teardown."""
    gates: list[dict[str, threading.Event]] = []

    def start() -> tuple[str, dict[str, threading.Event]]:
        runtime = load("python", write_handler(tmp_path / f"gated-{len(gates)}", GATED_HANDLER))
        gates.append(runtime.model)
        return servers.serve(build_container_app(runtime, "gated")), runtime.model

    yield start
    for gate in gates:
        gate["release"].set()


def test_invocation_timeout_is_a_model_error(make_router: RouterFactory, gated) -> None:
    url, gate = gated()
    client, _ = make_router(
        [EndpointRoute("slow", "Direct", ("gated",))],
        {("slow", "gated"): [url]},
        invocation_timeout_s=0.5,
    )
    try:
        response = invoke(client, "slow")
    finally:
        gate["release"].set()
    body = assert_error(response, 424, "ModelError", "timed out", "container gated")
    assert body["OriginalStatusCode"] == 408
    assert body["ContainerHostname"] == "gated"
    assert gate["entered"].is_set()  # it did reach the model


@pytest.mark.parametrize(
    "limits",
    [{"limits": {("busy", "gated"): 1}}, {"limits": {("busy", "other"): 5}, "default_limit": 1}],
    ids=["container limit", "default limit"],
)
def test_concurrency_limit_sheds_the_request_over_it(
    make_router: RouterFactory, gated, limits: dict[str, Any]
) -> None:
    # One request holds the only slot of a replica limited to one; the next gets 429 at
    # once instead of queueing behind it, and the slot is free again afterwards.
    url, gate = gated()
    route = EndpointRoute("busy", "Direct", ("gated",))
    client, _ = make_router(
        [route], {("busy", "gated"): [url]}, invocation_timeout_s=3 * SAFETY_WAIT_S, **limits
    )
    with (
        httpx.Client(base_url=client.base_url, timeout=60) as other,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        first = pool.submit(invoke, client, "busy", [1])
        try:
            assert gate["entered"].wait(SAFETY_WAIT_S), "the first request never reached the model"
            second = invoke(other, "busy", [2])
        finally:
            gate["release"].set()
        assert first.result().status_code == 200
        assert_error(
            second, 429, "ModelNotReadyException", "container gated", "limit of 1 concurrent"
        )
        third = invoke(other, "busy", [3])
    assert third.status_code == 200, third.text
    assert third.json() == [3]


class HangUp:
    """A TCP peer that reads a request and closes the connection without answering (or after
    `answer`)."""

    def __init__(self, answer: bytes = b"") -> None:
        self.answer = answer
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(8)
        self.socket.settimeout(0.05)  # lets the accept loop notice close()
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.accepted = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self.socket.accept()
            except OSError:  # timeout: look at the flag again
                continue
            self.accepted += 1
            with connection:
                connection.settimeout(5)
                connection.recv(65536)
                if self.answer:
                    connection.sendall(self.answer)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self.socket.close()


@pytest.fixture
def hang_up() -> Iterator[HangUp]:
    peer = HangUp()
    yield peer
    peer.close()


def test_a_connection_closed_before_any_answer_is_retried_on_another_replica(
    make_router: RouterFactory, hang_up: HangUp, containers: dict[str, str]
) -> None:
    # A replica that dies (or drops the connection) before answering never answered: inference is
    # idempotent, so the request goes once more, to another replica, and the caller sees no failure.
    route = EndpointRoute("flaky", "Direct", ("iris",))
    client, _ = make_router([route], {("flaky", "iris"): [hang_up.url, containers["iris"]]})
    statuses = [invoke(client, "flaky").status_code for _ in range(10)]
    assert statuses == [200] * 10
    assert hang_up.accepted >= 1, "no request reached the peer that hangs up"


def test_a_container_that_is_not_idempotent_is_never_sent_a_request_twice(
    make_router: RouterFactory, hang_up: HangUp, containers: dict[str, str]
) -> None:
    route = EndpointRoute("flaky", "Direct", ("iris",))
    client, transport = make_router([route], {("flaky", "iris"): [hang_up.url, containers["iris"]]})
    transport.update(
        {("flaky", "iris"): [hang_up.url, containers["iris"]]}, not_idempotent={("flaky", "iris")}
    )
    lost = None
    for _ in range(10):  # until a request lands on the peer that hangs up
        response = invoke(client, "flaky")
        if response.status_code != 200:
            lost = response
            break
    assert lost is not None, "no request reached the peer that hangs up"
    body = assert_error(lost, 424, "ModelError", "container iris", "lost")
    assert body["OriginalStatusCode"] == 502
    assert hang_up.accepted == 1


def test_a_connection_lost_after_the_answer_began_is_not_retried(
    make_router: RouterFactory, containers: dict[str, str]
) -> None:
    # The container was answering: whatever it did, it must not run again on another replica.
    peer = HangUp(
        answer=b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[0"
    )
    try:
        route = EndpointRoute("flaky", "Direct", ("iris",))
        client, _ = make_router([route], {("flaky", "iris"): [peer.url, containers["iris"]]})
        lost = None
        for _ in range(10):
            response = invoke(client, "flaky")
            if response.status_code != 200:
                lost = response
                break
        assert lost is not None, "no request reached the peer that answers half"
        assert_error(lost, 424, "ModelError", "container iris", "lost")
        assert peer.accepted == 1
    finally:
        peer.close()


def test_container_data_port_answers_ping(containers: dict[str, str]) -> None:
    assert httpx.get(containers["iris"] + "/ping").status_code == 200
