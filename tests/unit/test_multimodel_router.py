"""MultiModel containers end to end without Ray: router -> transport -> two replicas' data ports;
and the Open Inference model repository extension (index, load, unload) over the same replicas'
caches.

Each replica is a real ContainerApp around a MultiModelHandler (model store + LRU cache + the
python stack) on its own loopback port; the router reaches them through a ContainerTransport
whose replica table the test sets, as the gateway does with what the registry reports.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from serving import protocol
from serving.gateway.router import EndpointRoute, Router
from serving.gateway.transport import ContainerTransport
from serving.http.responses import serving_app
from serving.http.server import BackgroundServer
from serving.model_server.app import build_container_app
from serving.models.multimodel import MultiModelHandler
from serving.open_inference.dataplane import OpenInference
from serving.open_inference.rest import OpenInferenceRoutes
from serving.runtimes import runtime_for
from serving.settings import ServerSettings

MODELS = 30

HANDLER = """
import json, os

LOG = {log!r}

def model_fn(model_dir):
    with open(os.path.join(model_dir, "name.txt")) as f:
        name = f.read()
    if name == "broken":
        raise RuntimeError("this model cannot load")
    with open(LOG, "a") as log:
        log.write(name + "\\n")
    return name

def predict_fn(data, model):
    return {{"model": model, "doubled": [2 * x for x in data]}}
"""


def _model_files(name: str, log: Path) -> dict[str, bytes]:
    return {"name.txt": name.encode(), "code/inference.py": HANDLER.format(log=str(log)).encode()}


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A model-store prefix with MODELS models (archives and folders) and one that fails to load;
    and the load log."""
    root = tmp_path_factory.mktemp("prefix")
    log = root.parent / f"{root.name}-loads.log"
    for index in range(MODELS):
        name = f"model-{index}"
        files = _model_files(name, log)
        if index % 2:  # SageMaker's usual layout: one model.tar.gz per model
            with tarfile.open(root / f"{name}.tar.gz", "w:gz") as archive:
                for member, data in files.items():
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        else:
            for member, data in files.items():
                (root / name / member).parent.mkdir(parents=True, exist_ok=True)
                (root / name / member).write_bytes(data)
    for member, data in _model_files("broken", log).items():
        (root / "broken" / member).parent.mkdir(parents=True, exist_ok=True)
        (root / "broken" / member).write_bytes(data)
    return root, log


def target(index: int) -> str:
    return f"model-{index}.tar.gz" if index % 2 else f"model-{index}"


class Endpoint:
    """Router + two MultiModel replicas + one SingleModel container, on loopback ports."""

    def __init__(self, prefix: Path, **cache) -> None:
        self.servers: list[BackgroundServer] = []
        self.handlers = [
            MultiModelHandler("python", str(prefix), {}, hostname="mm", **cache) for _ in range(2)
        ]
        urls = [
            self._serve(build_container_app(None, "mm", models=handler))
            for handler in self.handlers
        ]
        single = runtime_for("python", prefix / "model-0", {})
        single.load()
        self.transport = ContainerTransport(default_limit=64)
        self.transport.update(
            {
                ("ep", "mm"): urls,
                ("ep", "single"): [self._serve(build_container_app(single, "single"))],
            }
        )
        self.urls = urls
        router = Router(ServerSettings(), self.transport)
        router.endpoints = {
            "ep": EndpointRoute("ep", "Direct", ("mm", "single"), multi_model=frozenset({"mm"}))
        }

        class _Lifespan:
            async def __aenter__(inner):
                await self.transport.start()

            async def __aexit__(inner, *exc):
                await self.transport.close()

        # the V2 repository extension too
        v2 = OpenInferenceRoutes(OpenInference(router.invocations, lambda: []))
        self.url = self._serve(
            serving_app(
                router.routes() + v2.routes(),
                lifespan=lambda app: _Lifespan(),
                hot=router.hot_route(),
            )
        )
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def _serve(self, app) -> str:
        server = BackgroundServer(app, "127.0.0.1", 0)
        self.servers.append(server)
        assert server.wait_started()
        return server.url

    def invoke(self, model: str | None, data=(1, 2), container: str = "mm") -> httpx.Response:
        headers = {"content-type": "application/json", protocol.TARGET_CONTAINER: container}
        if model is not None:
            headers[protocol.TARGET_MODEL] = model
        return self.http.post(
            "/endpoints/ep/invocations", content=json.dumps(list(data)), headers=headers
        )

    def holders(self, name: str) -> list[int]:
        """Which replicas hold model `name` loaded."""
        return [
            index
            for index, handler in enumerate(self.handlers)
            if name in handler.cache.loaded_models()
        ]

    def close(self) -> None:
        self.http.close()
        for server in reversed(self.servers):
            server.stop()
        for handler in self.handlers:
            handler.close()


@pytest.fixture
def endpoint(prefix) -> Iterator[Endpoint]:
    running = Endpoint(prefix[0], max_models=5)
    yield running
    running.close()


def test_each_target_model_answers(endpoint: Endpoint) -> None:
    for index in (0, 1, 7, 12):
        response = endpoint.invoke(target(index), data=[index])
        assert response.status_code == 200, response.text
        assert response.json() == {"model": f"model-{index}", "doubled": [2 * index]}


@pytest.mark.parametrize(
    ("model", "container", "status", "words"),
    [
        (None, "mm", 400, ["Target-Model is required", "container mm", "MultiModel"]),
        ("model-0", "single", 400, ["only valid for MultiModel containers", "container single"]),
        ("../model-0", "mm", 400, ["TargetModel '../model-0' is invalid"]),
        ("/etc/passwd", "mm", 400, ["absolute path"]),
        ("nosuch.tar.gz", "mm", 400, ["nosuch.tar.gz", "not found"]),
        ("broken", "mm", 424, ["this model cannot load"]),
    ],
)
def test_bad_target_models(endpoint: Endpoint, model, container, status, words) -> None:
    response = endpoint.invoke(model, container=container)
    assert response.status_code == status, response.text
    for word in words:
        assert word in response.json()["message"] + response.json().get("OriginalMessage", "")
    assert endpoint.invoke(target(3)).status_code == 200  # still serving


def test_requests_for_a_model_stay_on_the_replica_that_holds_it(endpoint: Endpoint, prefix) -> None:
    for index in range(4):
        for _ in range(5):
            assert endpoint.invoke(target(index)).status_code == 200
    for index in range(4):
        assert len(endpoint.holders(target(index))) == 1, (
            f"model {index} loaded on {endpoint.holders(target(index))}"
        )
        home = endpoint.transport.home_of("ep", "mm", target(index))
        assert home == endpoint.urls[endpoint.holders(target(index))[0]]


def test_models_cycle_through_a_small_cache(endpoint: Endpoint) -> None:
    for round_ in range(2):
        for index in range(MODELS):
            response = endpoint.invoke(target(index), data=[round_])
            assert response.json() == {"model": f"model-{index}", "doubled": [2 * round_]}
    for handler in endpoint.handlers:
        assert handler.cache.loaded_count <= 5


def test_concurrent_first_requests_load_a_model_once(prefix) -> None:
    root, log = prefix
    running = Endpoint(root, max_models=5)
    try:
        before = log.read_text().splitlines().count("model-29") if log.exists() else 0
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda _: running.invoke(target(29)), range(20)))
        assert all(a.status_code == 200 for a in answers)
        loads = log.read_text().splitlines().count("model-29") - before
        assert 1 <= loads <= 2, loads  # once per replica that the 20 requests reached, at most both
        assert loads == len(running.holders(target(29)))
    finally:
        running.close()


def test_disabled_cache_loads_per_request(prefix) -> None:
    root, log = prefix
    running = Endpoint(root, max_models=5, cache_enabled=False)
    try:
        before = log.read_text().splitlines().count("model-5") if log.exists() else 0
        for _ in range(3):
            assert running.invoke(target(5)).json()["model"] == "model-5"
        assert log.read_text().splitlines().count("model-5") - before == 3
        assert all(handler.cache.loaded_count == 0 for handler in running.handlers)
    finally:
        running.close()


def test_an_unknown_model_evicts_nothing(prefix) -> None:
    import asyncio

    from serving.errors import ValidationError
    from serving.runtimes import InvocationContext

    root, _ = prefix
    handler = MultiModelHandler("python", str(root), {}, hostname="mm", max_models=1)

    async def scenario() -> None:
        await handler.ainvoke(
            b"[1]", "application/json", None, InvocationContext(target_model=target(7))
        )
        with pytest.raises(ValidationError, match="not found"):
            await handler.ainvoke(
                b"[1]", "application/json", None, InvocationContext(target_model="no-such-model")
            )
        # refused before the cache made room for it: the loaded model is still there
        assert handler.cache.loaded_models() == [target(7)]

    try:
        asyncio.run(scenario())
    finally:
        handler.close()


def test_the_v2_repository_loads_and_unloads_in_every_replica(endpoint: Endpoint) -> None:
    index = {entry["name"]: entry for entry in endpoint.http.post("/v2/repository/index").json()}
    assert len(index) == MODELS + 1 and index["ep.mm.model-3.tar.gz"] == {
        "name": "ep.mm.model-3.tar.gz",
        "state": "UNAVAILABLE",
        "reason": "not loaded",
    }
    assert endpoint.http.post("/v2/repository/models/ep.mm.model-3.tar.gz/load").status_code == 200
    assert endpoint.holders("model-3.tar.gz") == [0, 1]  # both replicas' caches
    ready = endpoint.http.post("/v2/repository/index", json={"ready": True}).json()
    assert [entry["name"] for entry in ready] == ["ep.mm.model-3.tar.gz"]
    endpoint.invoke(target(4))  # loaded in one replica only
    assert {"state": "UNAVAILABLE", "reason": "loaded in 1 of 2 replicas"}.items() <= {
        entry["name"]: entry for entry in endpoint.http.post("/v2/repository/index").json()
    }["ep.mm.model-4"].items()
    assert (
        endpoint.http.post("/v2/repository/models/ep.mm.model-3.tar.gz/unload").status_code == 200
    )
    assert endpoint.holders("model-3.tar.gz") == []


@pytest.mark.parametrize(
    ("model", "status", "words"),
    [
        ("ep.mm.nosuch.tar.gz", 400, "not found"),
        ("ep.mm.broken", 424, "this model cannot load"),
        ("ep.single", 400, "not a MultiModel container's model"),
        ("ep.nope.model-1", 400, "names no container of endpoint ep"),
        ("nope.mm.model-1", 400, "Endpoint nope not found"),
    ],
)
def test_the_v2_repository_refuses_what_it_cannot_load(
    endpoint: Endpoint, model: str, status: int, words: str
) -> None:
    response = endpoint.http.post(f"/v2/repository/models/{model}/load")
    assert response.status_code == status and words in response.json()["error"], response.text
    assert endpoint.http.post("/v2/repository/models/ep.mm.model-1/reload").status_code == 404


def test_an_oversized_index_request_is_refused_before_it_is_read_whole(endpoint: Endpoint) -> None:
    # Read before any credentials are checked: refused once past its limit, not buffered to the end
    # first.
    import socket
    from urllib.parse import urlsplit

    address = urlsplit(endpoint.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as client:
        client.sendall(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"x" * 32768
        for _ in range(4):  # 128 kB of a body that never ends
            client.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = client.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400") and b"over 65536 bytes" in answer
