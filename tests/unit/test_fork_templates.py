"""Container processes forked from their stack's template (`fork_template`, `forked`) keep every
isolation property a fresh one has.

Real container processes behind real supervisors (`ContainerProcess`), real templates, the real
sandbox: a hostile tenant script (its marker in its source, its archive and its Environment) pollutes the
framework it shares pages with, and probes its sibling and its template. The template must hold
nothing of it, a sibling forked afterwards must see none of it, and each child must have its own
environment and its own random state.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.model_server import forked, sandbox
from serving.model_server.container_config import ContainerConfig
from serving.model_server.supervisor import ContainerProcess
from serving.trust import hops

KEY = b"t" * 32

PROBE = """
import json, os, random
import numpy

MARK = "MARKER_VALUE"


def _try(call):
    try:
        call()
        return "ALLOWED"
    except Exception as error:
        return "REFUSED: " + type(error).__name__


def model_fn(model_dir):
    polluted = hasattr(numpy, "polluted_by_a_sibling")
    numpy.polluted_by_a_sibling = MARK  # what a hostile tenant does to the framework it shares
    return {
        "polluted_at_load": polluted,
        "random": [random.random(), float(numpy.random.random())],
    }


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(data, model):
    answer = {
        **model,
        "environment": sorted(name for name in os.environ if name.startswith("SERVING_")),
        "pid": os.getpid(),
        "ppid": os.getppid(),
    }
    for pid in data.get("pids", []):
        answer["memory %d" % pid] = _try(lambda: open("/proc/%d/mem" % pid, "rb").read(1))
        answer["signal %d" % pid] = _try(lambda: os.kill(pid, 0))
    return answer


def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
"""


def _container(
    folder: Path,
    hostname: str,
    environment: dict[str, str],
    marker: str,
    image: str = "python",
    archive: bool = False,
) -> ContainerProcess:
    """A container serving the probe; `archive`: as a model.tar.gz (its member names carry the
    marker too), which the container process unpacks."""
    model = folder / hostname
    (model / "code").mkdir(parents=True)
    (model / "code" / "inference.py").write_text(PROBE.replace("MARKER_VALUE", marker))
    if archive:
        (model / f"{marker}.txt").write_text(marker)
        packed = folder / f"{hostname}.tar.gz"
        with tarfile.open(packed, "w:gz") as tar:
            for path in sorted(model.rglob("*")):
                tar.add(path, arcname=str(path.relative_to(model)), recursive=False)
        model = packed
    return ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname=hostname,
            image=image,
            model_data=str(model),
            environment=environment,
            hop_key=KEY,
        ),
        "127.0.0.1",
    )


def _invoke(process: ContainerProcess, document: dict) -> dict:
    host, port = process.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(document).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    headers |= hops.sign(KEY, "POST", "/invocations", body, headers)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/invocations", body=body, headers=headers)
        response = connection.getresponse()
        answer = response.read()
        assert response.status == 200, answer
        return json.loads(answer)
    finally:
        connection.close()


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable page of process `pid` holds `needle` (this test's process may read the
    memory of its own user's processes)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as memory:
        for line in maps:
            span, permissions = line.split()[:2]
            if not permissions.startswith("r") or line.rstrip().endswith(("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                memory.seek(start)
                if needle in memory.read(end - start):
                    return True
            except OSError:
                continue
    return False


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ContainerProcess, ContainerProcess, str]]:
    """Two containers of one stack, forked from one template; the first one's tenant is hostile (its
    Environment and its archive carry a marker)."""
    marker = f"hostile-{uuid.uuid4().hex}"
    first = _container(tmp_path, "first", {"SERVING_HOSTILE": marker}, marker, archive=True)
    second = _container(tmp_path, "second", {"SERVING_OTHER": "1"}, "benign")
    try:
        first.start(timeout=60)
        second.start(timeout=60)
        yield first, second, marker
    finally:
        first.stop()
        second.stop()


def test_both_are_forked_from_one_template(pair) -> None:
    first, second, _ = pair
    assert isinstance(first.process, forked.ForkedProcess)
    assert isinstance(second.process, forked.ForkedProcess)
    a, b = _invoke(first, {}), _invoke(second, {})
    assert a["ppid"] == b["ppid"] != os.getpid()
    assert "fork_template" in Path(f"/proc/{a['ppid']}/cmdline").read_text()
    # what `ps` shows of it: its container and its supervisor (its parent is the template)
    title = Path(f"/proc/{a['pid']}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert title.startswith("serving.model_server.main e/first "), title
    assert f"for supervisor {os.getpid()})" in title, title


def test_the_template_holds_nothing_a_tenant_chose(pair) -> None:
    first, _, marker = pair
    template = _invoke(first, {})["ppid"]
    assert marker.encode() not in Path(f"/proc/{template}/environ").read_bytes()
    # its Environment and its script reached the child only, not even in the template's heap
    assert _memory_holds(first.pid, marker.encode())  # the probe can find it where it is
    assert not _memory_holds(template, marker.encode())


def test_a_sibling_sees_nothing_of_the_other(pair) -> None:
    first, second, _ = pair
    a, b = _invoke(first, {}), _invoke(second, {})
    assert not a["polluted_at_load"] and not b["polluted_at_load"]  # forked after the pollution
    assert "SERVING_HOSTILE" in a["environment"] and "SERVING_OTHER" not in a["environment"]
    assert "SERVING_OTHER" in b["environment"] and "SERVING_HOSTILE" not in b["environment"]


def test_siblings_draw_their_own_random_numbers(tmp_path: Path) -> None:
    # scikit-learn's template has imported NumPy's generator: it must not be every child's
    containers = [_container(tmp_path, name, {}, "benign", "sklearn") for name in ("a", "b")]
    try:
        for container in containers:
            container.start(timeout=120)
        a, b = (_invoke(container, {}) for container in containers)
    finally:
        for container in containers:
            container.stop()
    assert isinstance(containers[0].process, forked.ForkedProcess)
    assert a["random"][0] != b["random"][0] and a["random"][1] != b["random"][1]


@pytest.mark.skipif(sandbox.landlock_abi() == 0, reason="this kernel has no Landlock")
def test_a_tenant_cannot_reach_its_sibling_or_its_template(pair) -> None:
    first, second, _ = pair
    template = _invoke(first, {})["ppid"]
    answer = _invoke(first, {"pids": [second.pid, template]})
    probes = {key: value for key, value in answer.items() if key.startswith(("memory", "signal"))}
    assert len(probes) == 4 and all(v.startswith("REFUSED") for v in probes.values()), probes


def test_a_killed_child_dies_alone(pair) -> None:
    first, second, _ = pair
    template = _invoke(first, {})["ppid"]
    os.kill(first.pid, signal.SIGKILL)
    assert first.process is not None
    assert first.process.wait(timeout=30) == -signal.SIGKILL
    assert _invoke(second, {})["ppid"] == template  # the sibling and the template serve on


def test_an_environment_a_framework_could_read_starts_fresh(tmp_path: Path) -> None:
    process = _container(tmp_path, "fresh", {"OMP_NUM_THREADS": "1"}, "benign")
    try:
        process.start(timeout=60)
        assert isinstance(process.process, subprocess.Popen)
        assert _invoke(process, {})["ppid"] == os.getpid()
    finally:
        process.stop()


def test_templates_can_be_switched_off(tmp_path: Path) -> None:
    process = _container(tmp_path, "off", {}, "benign")
    process.config.fork_template = False  # the fork_templates setting, through the replica's plan
    try:
        process.start(timeout=60)
        assert isinstance(process.process, subprocess.Popen)
    finally:
        process.stop()


def test_a_malformed_request_is_refused_and_the_template_serves_on(pair) -> None:
    first, second, _ = pair
    template = _invoke(first, {})["ppid"]
    connection = forked._connect(forked._socket_path("python"))  # noqa: SLF001
    assert connection is not None
    with connection:
        connection.send(json.dumps({"fds": [0, 0, 5]}).encode())
        assert "error" in json.loads(connection.recv(4096))
    assert Path(f"/proc/{template}").exists()
    assert _invoke(second, {})["ppid"] == template


def test_an_idle_template_exits_after_its_linger(tmp_path: Path) -> None:
    from serving.model_server import fork_template

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(tmp_path / "t.sock"))
    listener.listen(1)
    done = threading.Event()
    wake_r, _ = os.pipe()

    def serve() -> None:
        fork_template.serve(listener, wake_r, linger_s=0.5)
        done.set()

    # a client that comes and goes within the linger keeps it; then it leaves
    threading.Thread(target=serve, daemon=True).start()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    client.connect(str(tmp_path / "t.sock"))
    assert not done.wait(1.0)  # a client holds it
    client.close()
    assert done.wait(10.0)
    listener.close()


def test_a_killed_template_takes_no_container_with_it(tmp_path: Path) -> None:
    first = _container(tmp_path, "first", {}, "benign")
    second = _container(tmp_path, "second", {}, "benign")
    try:
        first.start(timeout=60)
        template = _invoke(first, {})["ppid"]
        os.kill(template, signal.SIGKILL)  # started by this test's supervisor
        deadline = time.monotonic() + 10
        while Path(f"/proc/{template}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _invoke(first, {})["pid"] == first.pid  # its child serves on
        second.start(timeout=60)  # from a new template
        assert isinstance(second.process, forked.ForkedProcess)
        assert _invoke(second, {})["ppid"] not in (template, os.getpid())
    finally:
        first.stop()
        second.stop()
    assert first.process is not None and first.process.returncode == -1  # its status died with it


def test_a_template_started_ahead_is_the_one_its_first_container_forks_from(
    tmp_path: Path,
) -> None:
    # `serving up` has its node's container host start its specs' stacks' templates while the rest
    # of the server starts (`ContainerHost.warm`)
    assert forked.warm("python")
    connection = forked._connect(forked._socket_path("python"))  # noqa: SLF001
    assert connection is not None
    with connection:
        template = struct.unpack(
            "3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        )[0]
    process = _container(tmp_path, "warmed", {}, "benign")
    try:
        process.start(timeout=60)
        assert isinstance(process.process, forked.ForkedProcess)
        assert _invoke(process, {})["ppid"] == template
    finally:
        process.stop()


def test_only_a_stack_a_container_would_fork_from_is_started_ahead() -> None:
    # a stack's name is all that crosses, and only the names STACK_IMPORTS knows start anything
    assert not forked.warm("../python")
    assert not forked.warm("custom")
    containers = [
        ("sklearn", {}, 0.0),
        ("python", {"SERVING_MODEL_THREADS": "2", "AWS_REGION": "eu-west-1"}, 0.0),
        ("pytorch", {}, 1.0),  # a GPU container starts fresh
        ("onnx", {"OMP_NUM_THREADS": "1"}, 0.0),  # a variable a framework reads as it is imported
        ("custom", {}, 0.0),  # no template for it
        ("sklearn", {"SAGEMAKER_PROGRAM": "inference.py"}, 0.0),
    ]
    assert forked.stacks_to_warm(containers) == ["python", "sklearn"]
