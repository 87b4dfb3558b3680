"""One endpoint on a fresh embedded Ray in a child process, for benchmarks that drive it from outside.

The child deploys the spec, waits until it is InService, prints the server's URL and serves until its
stdin closes; a Ray per run keeps runs from disturbing each other.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from typing import Any, Iterator

_CHILD = """
import sys, time
from serving import ray_wing
from serving.settings import ServerSettings
from serving.config.spec import parse_spec
settings = ServerSettings(port={port})
ray_wing.start_local_ray(num_cpus=2)
try:
    url = ray_wing.start_gateway(settings)
    ray_wing.deploy_endpoint(parse_spec({spec!r}), settings)
    deadline = time.monotonic() + 300
    while ray_wing.describe_endpoints().get({name!r}, {{}}).get("EndpointStatus") != "InService":
        assert time.monotonic() < deadline, "not InService after 300 s"
        time.sleep(1)
    time.sleep(3)  # the gateway's next registry poll
    print(url, flush=True)
    sys.stdin.read()  # until the benchmark closes it
finally:
    ray_wing.shutdown()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def embedded_endpoint(spec: dict[str, Any]) -> Iterator[str]:
    """The endpoint server's base URL while `spec` is served; everything stops when the block ends."""
    script = _CHILD.format(port=free_port(), spec=spec, name=spec["EndpointName"])
    server = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the endpoint server for {spec['EndpointName']} did not start")
        yield url
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
