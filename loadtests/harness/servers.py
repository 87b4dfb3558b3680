"""Our endpoint server for a benchmark: in this process (`in_process`), or in a child process with a
fresh embedded Ray of its own (`embedded_endpoint`), so that runs do not disturb each other and the
benchmark's own threads stay out of the Ray driver. Both are serving.ray_wing.EmbeddedServer: ready
means InService and routable through the gateway."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# A child process serving specs on its own embedded Ray: prints its URL, stops when stdin closes.
CHILD_SCRIPT = """
import json, sys
from serving.config.spec import parse_spec
from serving.ray_wing import EmbeddedServer
from serving.settings import ServerSettings
options = json.loads(sys.argv[1])
specs = [parse_spec(document) for document in options["specs"]]
with EmbeddedServer(specs, ServerSettings(port=0, **options["settings"]), num_cpus=options["num_cpus"],
                    ready_timeout_s=options["ready_timeout_s"]) as server:
    print(server.url, flush=True)
    sys.stdin.read()  # until the benchmark closes it
"""


@contextlib.contextmanager
def embedded_endpoint(
    *specs: dict[str, Any],
    num_cpus: int = 2,
    ready_timeout_s: float = 300.0,
    environment: dict[str, str] | None = None,
    source: Path | None = None,
    **settings: Any,
) -> Iterator[str]:
    """The endpoint server's base URL while `specs` are served by a child process; it all stops when
    the block ends. `settings`: ServerSettings fields (e.g. `gateways_per_node`); `environment`:
    variables added to the child's (and so to its Ray's); `source`: another checkout of this
    repository to run instead of the installed one (a baseline commit's worktree)."""
    options = json.dumps(
        {
            "specs": list(specs),
            "num_cpus": num_cpus,
            "ready_timeout_s": ready_timeout_s,
            "settings": settings,
        }
    )
    child_environment = {**os.environ, **(environment or {})}
    if source is not None:
        child_environment["PYTHONPATH"] = str(source)
    server = subprocess.Popen(
        [sys.executable, "-c", CHILD_SCRIPT, options],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_environment,
        cwd=source,
    )
    try:
        # the child exits (and this reads "") if it cannot get ready; Ray may forward a worker's
        # output line to the child's stdout first
        url = server.stdout.readline().strip()
        while url and not url.startswith("http"):
            url = server.stdout.readline().strip()
        if not url.startswith("http"):
            names = ", ".join(spec["EndpointName"] for spec in specs)
            raise RuntimeError(
                f"the endpoint server for {names} did not start (exit {server.wait(60)})"
            )
        yield url
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)


def in_process(
    *specs: dict[str, Any],
    num_cpus: int | None = 2,
    wait: bool = True,
    ready_timeout_s: float = 300.0,
    **settings: Any,
):
    """An EmbeddedServer for `specs` (spec documents) in this process, as a context manager;
    `settings` are ServerSettings fields (port 0 by default: the gateway takes a free port)."""
    from serving.config.spec import parse_spec
    from serving.ray_wing import EmbeddedServer
    from serving.settings import ServerSettings

    return EmbeddedServer(
        [parse_spec(document) for document in specs],
        ServerSettings(**{"port": 0, **settings}),
        num_cpus=num_cpus,
        wait=wait,
        ready_timeout_s=ready_timeout_s,
    )
