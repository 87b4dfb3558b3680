"""The wall between tenant code and the node's network, tried with every socket the kernel offers
(no Ray).

An audit found that a container process, walled off by Landlock's TCP rules, opened an MPTCP socket
(which Landlock does not cover), joined the gateway's SO_REUSEPORT group and was handed other
callers' connections. Here a real container process (`ContainerProcess`) runs `tenant_probe.py` as
its model code: it creates every socket it can (families 1-45, every type, TCP, MPTCP, SCTP, UDP,
UDP-Lite, ICMP, raw, packet ...), binds the ports of stand-in gateway listeners (bound with
SO_REUSEPORT, as the gateways bind theirs), and connects to them and to another container's data
port and Unix socket. Meanwhile the test makes calls to the gateway's ports and counts who answers.
Nothing may connect, nothing stream-like may bind, and every call must be the gateway's.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serving.model_server import netns, sandbox
from serving.model_server.container_config import ContainerConfig
from serving.model_server.supervisor import ContainerProcess
from serving.trust import hops

KEY = b"w" * 32
PROBE = Path(__file__).with_name("tenant_probe.py")
ROOT = Path(__file__).resolve().parents[2]
# What the seccomp filter lets a container create: Internet TCP and UDP, by number or by 0
# (family/type/protocol).
ALLOWED = {
    f"{family}/{kind}/{protocol}"
    for family in (2, 10)
    for kind, protocols in ((1, (0, 6)), (2, (0, 17)))
    for protocol in protocols
}


class StandInGateway:
    """Listeners on loopback bound as the gateways bind theirs (SO_REUSEPORT), answering every
    connection."""

    def __init__(self, count: int = 2) -> None:
        self.listeners = []
        for _ in range(count):
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            self.listeners.append(listener)
            threading.Thread(target=self._serve, args=(listener,), daemon=True).start()
        self.ports = [listener.getsockname()[1] for listener in self.listeners]

    @staticmethod
    def _serve(listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\ngateway"
                )

    def calls(self, per_port: int = 20, datagrams: bool = True) -> Counter:
        """Fresh connections to every port (the kernel spreads them over the port's group): who
        answered each."""
        origins: Counter = Counter()
        for port in self.ports:
            for _ in range(per_port):
                try:
                    origins[httpx.get(f"http://127.0.0.1:{port}/", timeout=5).text] += 1
                except httpx.HTTPError as error:
                    origins[type(error).__name__] += 1
            if datagrams:  # to a UDP socket the tenant may have bound on the same number
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
                    for _ in range(per_port):
                        sender.sendto(b"meant for the gateway", ("127.0.0.1", port))
        return origins

    def close(self) -> None:
        for listener in self.listeners:
            listener.close()


@pytest.fixture(scope="module")
def gateway() -> Iterator[StandInGateway]:
    stand_in = StandInGateway()
    yield stand_in
    stand_in.close()


def _start(tmp_path_factory, name: str, **config) -> ContainerProcess:
    model = tmp_path_factory.mktemp(name)
    (model / "code").mkdir()
    shutil.copy(PROBE, model / "code" / "inference.py")
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname=name,
            image="python",
            model_data=str(model),
            environment={},
            hop_key=KEY,
            **config,
        ),
        "127.0.0.1",
    )
    process.start(timeout=120)
    return process


@pytest.fixture(scope="module")
def neighbour(tmp_path_factory) -> Iterator[ContainerProcess]:
    """Another container: its data port and Unix socket are targets too."""
    process = _start(tmp_path_factory, "neighbour")
    yield process
    process.stop()


def _ask(container: ContainerProcess, request: dict) -> dict:
    body = json.dumps(request).encode()
    headers = {"content-type": "application/json", "accept": "*/*"}
    headers.update(hops.sign(KEY, "POST", "/invocations", body, headers))
    response = httpx.post(
        container.url + "/invocations", content=body, headers=headers, timeout=120
    )
    assert response.status_code == 200, response.text
    return response.json()


def _targets(gateway: StandInGateway, neighbour: ContainerProcess, window_s: float) -> dict:
    neighbour_port = int(neighbour.url.rsplit(":", 1)[1])
    return {
        "listen": [["127.0.0.1", port] for port in gateway.ports],
        "connect": [["127.0.0.1", port] for port in [*gateway.ports, neighbour_port]],
        "unix": [neighbour.unix_path] if neighbour.unix_path else [],
        "window_s": window_s,
    }


def _check(
    found: dict, received: int, origins: Counter, gateway: StandInGateway, udp: bool
) -> None:
    assert set(found["created"]) <= ALLOWED, sorted(set(found["created"]) - ALLOWED)
    stream_like = [entry for entry in found["bound"] if entry.split("/")[1] in ("1", "5")]
    assert not stream_like, stream_like
    assert not found["connected"], found["connected"]
    assert origins == Counter({"gateway": 20 * len(gateway.ports)}), origins
    assert received == 0 or not udp, received


@pytest.mark.parametrize("network", ["isolated", "egress"])
def test_no_socket_of_any_protocol_reaches_or_joins_the_gateway(
    tmp_path_factory, gateway, neighbour, network
) -> None:
    # the operator's egress port: a listener that is not the gateway's
    with socket.socket() as elsewhere:
        elsewhere.bind(("127.0.0.1", 0))
        config = {"egress_ports": (elsewhere.getsockname()[1],)} if network == "egress" else {}
        tenant = _start(tmp_path_factory, f"tenant-{network}", **config)
    try:
        found = _ask(tenant, {"sockets": _targets(gateway, neighbour, window_s=6)})
        # In the node's network (egress) a tenant may bind a UDP port: no gateway listens on UDP, so
        # send none there.
        origins = gateway.calls(datagrams=network == "isolated")
        received = _wait_collect(tenant)
        assert tenant.report["network"] == ("host" if network == "egress" else "network")
        _check(found, received, origins, gateway, udp=network == "isolated")
    finally:
        tenant.stop()


def _wait_collect(tenant: ContainerProcess) -> int:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = _ask(tenant, {"collect": True})
        if got["done"]:
            return got["received"]
        time.sleep(0.5)
    raise AssertionError("the tenant's listeners did not finish")


def test_an_egress_container_reaches_its_egress_port_only(tmp_path_factory, gateway) -> None:
    with socket.socket() as allowed:
        allowed.bind(("127.0.0.1", 0))
        allowed.listen(8)
        port = allowed.getsockname()[1]
        tenant = _start(tmp_path_factory, "egress-reach", egress_ports=(port,))
        try:
            found = _ask(
                tenant,
                {
                    "sockets": {
                        "connect": [["127.0.0.1", port], ["127.0.0.1", gateway.ports[0]]],
                        "window_s": 0,
                    }
                },
            )
        finally:
            tenant.stop()
    reached = {entry.rsplit(":", 1)[1] for entry in found["connected"]}
    assert reached == {str(port)}, found["connected"]  # by TCP (0 and 6), never the gateway's port


NON_ROOT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from serving.model_server import sandbox
report = sandbox.apply(sandbox.SandboxPolicy(read=sandbox.SYSTEM_READ + (sys.argv[1],), own_port=int(sys.argv[2])))
sys.path.insert(0, sys.argv[1] + "/probe")
import tenant_probe
found = tenant_probe.sockets_probe(json.loads(sys.argv[3]))
print(json.dumps({"network": report.network, "uid": __import__("os").getuid(), **found}), flush=True)
sys.stdin.readline()  # the test's calls are made: collect
import time
while not tenant_probe._GOT["done"]:
    time.sleep(0.1)
print(tenant_probe._GOT["received"], flush=True)
"""


@pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
    reason="needs root (to drop to another user), setpriv and a system Python",
)
def test_a_non_root_server_walls_containers_off_with_a_user_namespace(gateway, neighbour) -> None:
    """As an ordinary user (nobody), where the distribution allows unprivileged user namespaces, the
    sandbox makes a user namespace to hold the network one. The project's virtualenv lies under
    /root here, which that user cannot enter: the sandbox (standard library only) and the probe run
    from a world-readable copy, in the system's Python."""
    if netns.unavailable() is not None:
        pytest.skip("this kernel gives no network namespaces")
    copy = Path(tempfile.mkdtemp(prefix="serving-nonroot-"))
    try:
        shutil.copytree(
            ROOT / "serving", copy / "serving", ignore=shutil.ignore_patterns("__pycache__")
        )
        (copy / "probe").mkdir()
        shutil.copy(PROBE, copy / "probe" / "tenant_probe.py")
        for folder, _, files in os.walk(copy):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        targets = json.dumps(_targets(gateway, neighbour, window_s=6))
        child = subprocess.Popen(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-I",
                "-c",
                NON_ROOT,
                str(copy),
                "45999",
                targets,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        try:
            line = child.stdout.readline()
            assert line, child.stderr.read()
            found = json.loads(line)
            origins = gateway.calls()
            child.stdin.write("\n")
            child.stdin.flush()
            received = int(child.stdout.readline())
        finally:
            child.kill()
            child.wait(timeout=10)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    assert found["uid"] == 65534 and found["network"] == "user+network", found
    _check(found, received, origins, gateway, udp=True)


def test_without_a_namespace_the_container_is_refused_unless_the_operator_says(monkeypatch) -> None:
    """Where the kernel cannot make a namespace, the sandbox fails (the container does not start)
    unless the policy falls back, by the operator's --shared-container-network, to the node's
    network and its rules."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from serving.model_server import netns, sandbox\n"
        "def refuse(): raise netns.NamespaceError(1, 'not permitted (test)')\n"
        "netns.isolate = refuse\n"
        "try:\n"
        "    report = sandbox.apply(sandbox.SandboxPolicy(read=sandbox.SYSTEM_READ, shared_fallback=sys.argv[2] == '1'))\n"
        "    print(report.network, report.connect_ports)\n"
        "except sandbox.SandboxError as error:\n"
        "    print('refused:', error)\n"
    )
    refused = subprocess.run(
        [sys.executable, "-c", script, str(ROOT), "0"], capture_output=True, text=True, timeout=60
    )
    assert refused.stdout.startswith("refused: no network namespace"), (
        refused.stdout + refused.stderr
    )
    shared = subprocess.run(
        [sys.executable, "-c", script, str(ROOT), "1"], capture_output=True, text=True, timeout=60
    )
    if sandbox.landlock_abi() >= 4:
        # no TCP port at all
        assert shared.stdout.strip() == "host []", shared.stdout + shared.stderr
    else:
        assert shared.stdout.startswith("refused: in the node's network"), (
            shared.stdout + shared.stderr
        )


def test_the_scratch_root_is_private() -> None:
    from serving.model_server import scratch

    info = os.lstat(scratch.root())
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
