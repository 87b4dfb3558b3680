"""Ray nodes and `serving up` on simulated hosts (`machine`): host 1 is the head, the others join it.

Each host runs `ray start --block` at its own address with a custom resource `host-N` (so a spec can pin
a container to a host) and a `slot` (one per host: a container asking for a slot gets a replica per
host); the driver, `serving up --address`, runs on the head host and binds its gateways to every
address (`--host 0.0.0.0`), so that each host's gateways answer on that host's address, as behind an L4
balancer. Ray's token authentication is on, as `deploy/` sets it. Clients run in the load namespace
(`Machine.load`): `probe` sends one request from there and reports what came back.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadtests.cluster.machine import Host, Machine

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
GCS_PORT = 6379
HTTP_PORT = 8080
START_TIMEOUT_S = 180.0


class SimulatedCluster:
    """`hosts` simulated hosts, each a Ray node (host 1 the head), each capped at `cpus` cores."""

    def __init__(
        self,
        hosts: int = 3,
        cpus: float | None = None,
        node_cpus: int = 1,
        machine: Machine | None = None,
        resources: dict[str, float] | None = None,
    ) -> None:
        """`resources`: custom resources every host's node offers besides `host-N` and `slot`."""
        self.machine = machine or Machine()
        self.node_cpus = node_cpus
        self.resources = resources or {}
        self.environment = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_preload_python_modules": "serving._worker_preload",
            "SERVING_STATE_DIR": str(self.machine.folder / "state"),
        }
        for name in ("RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "TMPDIR"):
            self.environment.pop(name, None)
        self.nodes: dict[int, subprocess.Popen] = {}
        self.driver: subprocess.Popen | None = None
        try:
            for index in range(1, hosts + 1):
                self.machine.add_host(index, cpus)
            self.start_node(1)
            for index in range(2, hosts + 1):
                self.start_node(index)
        except BaseException:
            self.close()
            raise

    @property
    def head(self) -> Host:
        return self.machine.hosts[1]

    @property
    def address(self) -> str:
        return f"{self.head.address}:{GCS_PORT}"

    def start_node(self, index: int, attempts: int = 2) -> subprocess.Popen:
        """Host `index`'s Ray node (the head for 1), once it says it runs: nodes start one after another,
        since on 2 cores a raylet starting beside another can miss Ray's start-up deadline (it is then
        started again, up to `attempts` times)."""
        host = self.machine.hosts.get(index) or self.machine.add_host(index)
        resources = json.dumps({f"host-{index}": 10, "slot": 1, **self.resources})
        where = (
            ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"]
            if index == 1
            else [f"--address={self.address}"]
        )
        command = [
            str(BIN / "ray"),
            "start",
            "--block",
            "--disable-usage-stats",
            f"--node-ip-address={host.address}",
            f"--num-cpus={self.node_cpus}",
            f"--resources={resources}",
            *where,
        ]
        log_path = host.tmp / "ray-start.log"
        for attempt in range(attempts):
            with open(log_path, "w") as log:
                node = self.machine.start(
                    host, command, self.environment, stdout=log, stderr=subprocess.STDOUT
                )

            def started(node: subprocess.Popen = node) -> bool:
                if node.poll() is not None:
                    raise RuntimeError(f"ray start on host {index} exited ({node.returncode})")
                return "Ray runtime started." in log_path.read_text()

            try:
                self.wait_until(started, f"host {index}'s Ray node up", every=0.2)
                break
            except RuntimeError:
                if attempt == attempts - 1:
                    raise RuntimeError(
                        f"host {index}'s Ray node did not start:\n{log_path.read_text()[-2000:]}"
                    ) from None
        self.nodes[index] = node
        return node

    def run_on(
        self, index: int, command: list[str], timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """`command` on host `index`, to completion."""
        process = self.machine.start(
            self.machine.hosts[index],
            command,
            self.environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(command, process.returncode, out, err)

    def up(self, spec: Path | list[Path], *arguments: str) -> subprocess.Popen:
        """`serving up SPEC... --address <head>` on the head host, its gateways on every host's address."""
        specs = [str(path) for path in (spec if isinstance(spec, list) else [spec])]
        log = open(self.machine.folder / "serving-up.log", "w")
        self.driver = self.machine.start(
            self.head,
            [
                str(BIN / "serving"),
                "up",
                *specs,
                "--address",
                self.address,
                "--host",
                "0.0.0.0",
                "--port",
                str(HTTP_PORT),
                "--allow-anonymous",
                "--wait-timeout",
                "300",
                *arguments,
            ],
            self.environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        return self.driver

    def driver_log(self) -> str:
        path = self.machine.folder / "serving-up.log"
        return path.read_text() if path.exists() else ""

    def url(self, index: int) -> str:
        """Host `index`'s gateways, as the load namespace reaches them."""
        return f"http://{self.machine.hosts[index].address}:{HTTP_PORT}"

    def probe(self, method: str, url: str, body: Any = None, headers: dict | None = None) -> dict:
        """One request from the load namespace: {"status", "body"} (body parsed as JSON where it is)."""
        code = (
            "import json, sys, httpx; a = json.loads(sys.argv[1]);"
            "r = httpx.request(a['method'], a['url'], json=a['body'], headers=a['headers'], timeout=30);"
            "b = r.text\n"
            "try: b = r.json()\nexcept ValueError: pass\n"
            "print(json.dumps({'status': r.status_code, 'body': b}))"
        )
        request = json.dumps({"method": method, "url": url, "body": body, "headers": headers or {}})
        assert self.machine.load is not None
        process = self.machine.start(
            self.machine.load,
            [sys.executable, "-c", code, request],
            self.environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = process.communicate(timeout=60)
        if process.returncode != 0:
            return {"status": None, "body": err.strip().splitlines()[-1] if err.strip() else ""}
        return json.loads(out)

    def load(
        self,
        endpoint: str,
        container: str | None,
        seconds: float,
        hosts: list[int],
        stop_file: Path,
    ) -> subprocess.Popen:
        """Callers behind an L4 balancer over `hosts`' gateways (`balanced_load`), in the load namespace;
        its JSON report on stdout when it ends (after `seconds`, or once `stop_file` exists)."""
        assert self.machine.load is not None
        addresses = ",".join(self.machine.hosts[index].address for index in hosts)
        command = [
            sys.executable, "-m", "loadtests.cluster.balanced_load", "--hosts", addresses,
            "--port", str(HTTP_PORT), "--endpoint", endpoint, "--seconds", str(seconds),
            "--stop-file", str(stop_file),
        ] + (["--container", container] if container else [])  # fmt: skip
        return self.machine.start(
            self.machine.load,
            command,
            self.environment,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    def gateway_pids(self, index: int) -> set[int]:
        """Host `index`'s gateway processes (`ray::NodeGateway` actors, by their titles)."""
        found = set()
        for pid in self.machine.hosts[index].pids():
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if title.startswith(b"ray::NodeGateway"):
                found.add(pid)
        return found

    def wait_in_service(self, endpoint: str, index: int = 1, timeout: float = 300) -> float:
        """Seconds until `endpoint` is InService, asked through host `index`'s gateway."""

        def in_service() -> bool:
            if self.driver is not None and self.driver.poll() is not None:
                raise RuntimeError(
                    f"serving up exited ({self.driver.returncode}):\n{self.driver_log()[-3000:]}"
                )
            answer = self.probe("GET", f"{self.url(index)}/endpoints/{endpoint}")
            return answer["status"] == 200 and answer["body"].get("EndpointStatus") == "InService"

        return self.wait_until(in_service, f"{endpoint} InService", timeout)

    def wait_until(
        self, predicate, what: str, timeout: float = START_TIMEOUT_S, every: float = 1.0
    ) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if predicate():
                return time.monotonic() - started
            time.sleep(every)
        raise TimeoutError(f"not {what} within {timeout:.0f} s")

    def close(self) -> None:
        """Everything: the driver, every node, every host (by their cgroups), the namespaces."""
        self.machine.close()

    def __enter__(self) -> SimulatedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
