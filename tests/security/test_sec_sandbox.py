"""The container process's sandbox on its own (no Ray): what a tenant's code can and cannot touch.

Each test starts a real container process (`container_process.ContainerProcess`) serving a hostile
`code/inference.py` and asks it, through signed hops, to try something. Where the kernel has no
Landlock the filesystem checks cannot hold, and the test says so instead of passing.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serving.http import local_socket
from serving.model_server import sandbox
from serving.model_server.container_config import ContainerConfig, ContainerStartError
from serving.model_server.supervisor import ContainerProcess
from serving.trust import hops

KEY = b"k" * 32
ATTEMPTS = """
import json, os, socket

def _try(attempt):
    try:
        return "ALLOWED: " + str(attempt())[:100]
    except Exception as error:
        return "REFUSED: " + type(error).__name__

def input_fn(body, content_type):
    return json.loads(body)

def predict_fn(request, model):
    what, target = request["what"], request.get("target")
    attempts = {
        "read": lambda: open(target, "rb").read(16),
        "list": lambda: os.listdir(target),
        "write": lambda: open(target, "w").write("x"),
        "unix": lambda: socket.socket(socket.AF_UNIX),
        "bind": lambda: socket.socket().bind(("127.0.0.1", 0)),
        "connect": lambda: socket.create_connection(("127.0.0.1", int(target)), timeout=5).close(),
        "signal": lambda: os.kill(int(target), 0),
        "environ": lambda: open("/proc/%s/environ" % target, "rb").read(16),
        "scratch": lambda: open(os.path.join(os.environ["TMPDIR"], "ok"), "w").write("fine"),
        "model": lambda: sorted(os.listdir(os.path.dirname(os.path.dirname(__file__)))),
    }
    return {"result": _try(attempts[what]), "environment": sorted(os.environ)}

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
"""

needs_landlock = pytest.mark.skipif(
    sandbox.landlock_abi() == 0, reason="this kernel has no Landlock: no filesystem sandbox"
)


@pytest.fixture(scope="module")
def gateway_port() -> Iterator[int]:
    """A listening port standing for the endpoint server's, which container processes may not
    connect to."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


@pytest.fixture(scope="module")
def container(tmp_path_factory, gateway_port: int) -> Iterator[ContainerProcess]:
    model = tmp_path_factory.mktemp("tenant-model")
    (model / "code").mkdir()
    (model / "code" / "inference.py").write_text(ATTEMPTS)
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="tenant",
            image="python",
            model_data=str(model),
            environment={"SERVING_CPUS": "1"},
            hop_key=KEY,
        ),
        "127.0.0.1",
    )
    process.start(timeout=120)
    yield process
    process.stop()


def attempt(container: ContainerProcess, what: str, target: object = None) -> dict:
    body = json.dumps({"what": what, "target": target}).encode()
    # every header httpx sends is signed
    headers = {"content-type": "application/json", "accept": "*/*"}
    headers.update(hops.sign(KEY, "POST", "/invocations", body, headers))
    response = httpx.post(container.url + "/invocations", content=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@needs_landlock
@pytest.mark.parametrize("what", ["read", "list"])
def test_secrets_and_other_models_are_out_of_reach(container, tmp_path: Path, what: str) -> None:
    secret = tmp_path / "identities.yaml"
    secret.write_text("SecretAccessKey: not-for-tenants")
    for target in (
        str(secret),
        str(Path.home() / ".ray" / "auth_token"),
        os.environ.get("RAY_AUTH_TOKEN_PATH"),
        "/dev/shm",
        "/etc/shadow",
        str(tmp_path),
        "/tmp",
    ):
        if target and (what == "list") == os.path.isdir(target):
            assert attempt(container, what, target)["result"].startswith("REFUSED"), target


@needs_landlock
def test_writes_only_to_its_scratch(container, tmp_path: Path) -> None:
    assert attempt(container, "write", str(tmp_path / "marker"))["result"].startswith("REFUSED")
    assert not (tmp_path / "marker").exists()
    assert attempt(container, "scratch")["result"].startswith("ALLOWED")
    # its own model stays readable
    assert attempt(container, "model")["result"].startswith("ALLOWED")


def test_no_unix_sockets_and_no_listening(container) -> None:
    assert attempt(container, "unix")["result"].startswith("REFUSED")
    if sandbox.landlock_abi() >= 4:
        assert attempt(container, "bind")["result"].startswith("REFUSED")


def test_it_reaches_its_own_port_and_nothing_else(container, gateway_port: int) -> None:
    refused = attempt(container, "connect", gateway_port)["result"]
    # its own network namespace (and Landlock: EACCES)
    assert refused.startswith("REFUSED"), refused
    # where a tensorflow handler's context.rest_uri points
    own_port = int(container.url.rsplit(":", 1)[1])
    # its namespace's loopback
    assert attempt(container, "connect", own_port)["result"].startswith("ALLOWED")


@needs_landlock
def test_other_processes_are_out_of_reach(container) -> None:
    # the process that started it: its environment holds what the tenant must not see
    supervisor = os.getpid()
    assert attempt(container, "environ", supervisor)["result"].startswith("REFUSED")
    if sandbox.landlock_abi() >= 6:
        assert attempt(container, "signal", supervisor)["result"].startswith("REFUSED")


def test_the_environment_is_the_containers_own(container, monkeypatch) -> None:
    names = attempt(container, "scratch")["environment"]
    assert "SERVING_CPUS" in names
    assert not [name for name in names if name.startswith(("RAY_", "AWS_")) or "TOKEN" in name], (
        names
    )
    # OpenMP pools sleep instead of spinning (docs/benchmarks/bench_batching.md)
    assert "OMP_WAIT_POLICY" in names


def test_a_model_that_fails_to_load_reports_why(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        "def model_fn(model_dir):\n    raise ValueError('corrupt weights')\n"
    )
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="broken",
            image="python",
            model_data=str(tmp_path),
            environment={},
            hop_key=KEY,
        ),
        "127.0.0.1",
    )
    with pytest.raises(ContainerStartError, match="ValueError: corrupt weights"):
        process.start(timeout=60)
    process.stop()


@needs_landlock
def test_an_archive_unpacks_inside_the_sandbox(tmp_path: Path) -> None:
    # The archive is extracted by the confined process into its own scratch folder: a shared cache
    # that one tenant could write would let it replace another container's model.
    source = tmp_path / "src"
    (source / "code").mkdir(parents=True)
    (source / "code" / "inference.py").write_text(
        "import os\n\ndef model_fn(model_dir):\n    return str(model_dir)\n\n"
        "def predict_fn(data, model):\n    return {'model_dir': model, 'tmp': os.environ['TMPDIR']}\n"
    )
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname=".")
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="archived",
            image="python",
            model_data=str(archive),
            environment={},
            hop_key=KEY,
        ),
        "127.0.0.1",
    )
    try:
        process.start(timeout=60)
        body, headers = b"{}", {"content-type": "application/json", "accept": "*/*"}
        headers.update(hops.sign(KEY, "POST", "/invocations", body, headers))
        answer = httpx.post(
            process.url + "/invocations", content=body, headers=headers, timeout=30
        ).json()
        assert answer["model_dir"].startswith(answer["tmp"])
    finally:
        process.stop()
    assert not Path(process.scratch).exists()  # its files go with it


def test_the_data_port_was_bound_by_the_supervisor(container) -> None:
    host, port = container.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):
        pass  # listening, although the process itself may bind nothing


def _signed_post(client: httpx.Client, body: bytes) -> httpx.Response:
    headers = {"content-type": "application/json", "accept": "*/*"}
    headers.update(hops.sign(KEY, "POST", "/invocations", body, headers))
    return client.post("http://data-port/invocations", content=body, headers=headers)


def test_the_unix_socket_beside_the_data_port_is_private_and_still_signed(container) -> None:
    # A gateway on this machine reaches the container through it (docs/security.md, "Listeners").
    assert container.unix_listener is not None
    path = container.unix_path
    host, port = container.url.removeprefix("http://").rsplit(":", 1)
    assert path == local_socket.path_for(host, int(port))
    folder = os.lstat(os.path.dirname(path))
    assert folder.st_uid == os.getuid() and stat.S_IMODE(folder.st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    with httpx.Client(transport=httpx.HTTPTransport(uds=path), timeout=30) as client:
        answer = _signed_post(client, json.dumps({"what": "scratch"}).encode())
        assert answer.status_code == 200 and answer.json()["result"].startswith("ALLOWED")
        unsigned = client.post(
            "http://data-port/invocations",
            content=b"{}",
            headers={"content-type": "application/json"},
        )
        assert unsigned.status_code == 403  # the socket is no way around the hop's signature
        other_key = {"content-type": "application/json", "accept": "*/*"}
        other_key.update(hops.sign(b"x" * 32, "POST", "/invocations", b"{}", other_key))
        assert (
            client.post(
                "http://data-port/invocations", content=b"{}", headers=other_key
            ).status_code
            == 403
        )


@needs_landlock
def test_tenant_code_cannot_reach_the_socket_folder(container) -> None:
    folder = local_socket.folder()
    assert folder is not None
    assert attempt(container, "list", folder)["result"].startswith("REFUSED")
    # nor open a Unix socket to connect with
    assert attempt(container, "unix")["result"].startswith("REFUSED")


def test_stopping_a_container_removes_its_unix_socket(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        "def predict_fn(data, model):\n    return data\n"
    )
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="short-lived",
            image="python",
            model_data=str(tmp_path),
            environment={},
            hop_key=KEY,
        ),
        "127.0.0.1",
    )
    assert process.unix_listener is not None
    path = process.unix_path
    try:
        process.start(timeout=60)
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), timeout=30) as client:
            assert _signed_post(client, b"[1, 2]").json() == [1, 2]
    finally:
        process.stop()
    assert not os.path.exists(path)


KILLED_SUPERVISOR = """
import json, sys, time
from serving.model_server.container_config import ContainerConfig
from serving.model_server.supervisor import ContainerProcess
process = ContainerProcess(ContainerConfig(endpoint="e", hostname="killed", image="python", model_data=sys.argv[1],
                                           environment={}, hop_key=b"k" * 32), "127.0.0.1")
process.start(timeout=120)
print(json.dumps({"scratch": process.scratch, "pid": process.pid}), flush=True)
time.sleep(600)
"""


def test_a_killed_supervisors_scratch_folder_is_reclaimed(tmp_path: Path) -> None:
    """A SIGKILLed supervisor cannot remove its container's scratch folder, and the container
    process may empty it but not remove it: the next supervisor to start (and the server's clean
    stop) does."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        "def predict_fn(data, model):\n    return data\n"
    )
    supervisor = subprocess.Popen(
        [sys.executable, "-c", KILLED_SUPERVISOR, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        started = json.loads(supervisor.stdout.readline())
    finally:
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(timeout=30)
    deadline = time.monotonic() + 30  # the container process sees its lifeline close and exits
    while psutil.pid_exists(started["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.path.isdir(started["scratch"])  # what the old code left behind, for good
    successor = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="next",
            image="python",
            model_data=str(tmp_path),
            environment={},
            hop_key=KEY,
        ),
        "127.0.0.1",
    )
    try:
        assert not os.path.exists(started["scratch"])
        assert os.path.isdir(successor.scratch)  # its own, alive: kept
    finally:
        successor.stop()
    assert not os.path.exists(successor.scratch)


@needs_landlock
def test_hf_model_id_cannot_load_a_folder_outside_the_sandbox(
    tmp_path: Path, transformers_models: dict[str, Path]
) -> None:
    """`HF_MODEL_ID` names a local folder (there is no hub here): a spec could point it at another
    tenant's model. The confined process cannot read it; the container fails to start saying so,
    and the model next door is never loaded."""
    import shutil

    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    shutil.copytree(transformers_models["tiny-classifier"], mine)
    shutil.copytree(transformers_models["tiny-classifier"], theirs)
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="next-door",
            image="huggingface",
            model_data=str(mine),
            environment={"HF_MODEL_ID": str(theirs)},
            hop_key=KEY,
        ),
        "127.0.0.1",
    )
    with pytest.raises(ContainerStartError, match="Permission denied|PermissionError"):
        process.start(timeout=120)
    process.stop()
