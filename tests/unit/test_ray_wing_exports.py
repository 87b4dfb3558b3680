"""`serving.ray_wing` exports its names lazily: each is the object its module defines, however the
package's submodules were imported before, and a container replica's worker does not import the
gateway with replica.py. Each check runs in a fresh interpreter, since this test process may have
imported any of the modules already."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys, types
import serving.ray_wing.replica, serving.ray_wing.registry, serving.ray_wing.serve_status  # submodules first
from serving import ray_wing
print(json.dumps({
    "modules": [name for name in ray_wing.__all__ if isinstance(getattr(ray_wing, name), types.ModuleType)],
    "missing": [name for name in ray_wing.__all__ if getattr(ray_wing, name, None) is None],
}))
"""


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def test_every_exported_name_is_its_object_not_a_submodule() -> None:
    found = json.loads(_run(_PROBE))
    assert found == {"modules": [], "missing": []}


def test_a_replica_imports_neither_the_gateway_nor_the_embedded_server() -> None:
    code = (
        "import sys, serving.ray_wing.replica; "
        "print(sorted(m for m in ('serving.ray_wing.gateway', 'serving.ray_wing.embedded', 'serving.gateway.router')"
        " if m in sys.modules))"
    )
    assert _run(code) == "[]"


def test_a_container_host_imports_no_serve() -> None:
    # A container host supervises its node's container processes without Serve: `ray.serve` (with
    # FastAPI, ~30 MiB of a host's PSS) came in with the package's eager import of `serve_status`,
    # replica.py's top-level `from ray import serve`, and the registry's module, which Ray imports in
    # every process that takes a handle to the registry (it loads the actor's class), with its
    # reconcile loop. Nor the server's settings (pydantic-settings, ~0.1 CPU-seconds at a host's
    # start), which the gateways' module named for a type only.
    code = (
        "import sys, serving._worker_preload as preload; preload.install(); "
        "import serving.ray_wing.container_host, serving.ray_wing.registry; "
        "print(sorted(m for m in ('ray.serve', 'fastapi', 'starlette', 'pydantic_settings')"
        " if m in sys.modules))"
    )
    assert _run(code) == "[]"


def test_the_process_starting_a_server_imports_neither_serve_nor_the_gateway() -> None:
    # `serving up` starts Ray, the registry and the gateways without Serve (~0.9 CPU-seconds): the
    # gateway's class loads only in the gateways' processes (`gateway_fleet.NodeGateway`).
    code = (
        "import sys, serving._worker_preload, serving.cli.up, serving.ray_wing.embedded, "
        "serving.ray_wing.server_start, serving.ray_wing.operations; "
        "print(sorted(m for m in ('ray.serve', 'serving.ray_wing.gateway', 'serving.console.overview')"
        " if m in sys.modules))"
    )
    assert _run(code) == "[]"


def test_the_registry_imports_neither_serve_nor_the_gateway() -> None:
    # The registry starts the gateways and runs the control plane and the reconcile loop; Serve
    # loads there only once a container Serve runs is deployed (`replica.deploy_container`).
    code = (
        "import sys, serving._worker_preload as preload; preload.install(); "
        "import serving.ray_wing.registry, serving.ray_wing.reconcile, serving.ray_wing.control_plane, "
        "serving.ray_wing.gateway_fleet; "
        "print(sorted(m for m in ('ray.serve', 'serving.ray_wing.gateway') if m in sys.modules))"
    )
    assert _run(code) == "[]"


def test_serves_controller_is_looked_up_by_serves_own_name() -> None:
    # `serve_status.serve_running` names it without importing Serve
    code = (
        "from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE; "
        "from serving.ray_wing.serve_status import SERVE_CONTROLLER; "
        "print(SERVE_CONTROLLER == (SERVE_CONTROLLER_NAME, SERVE_NAMESPACE))"
    )
    assert _run(code) == "True"


def test_a_gateway_imports_none_of_the_control_planes_services() -> None:
    # The gateway authenticates an API call and hands it to the control plane in the registry's
    # process; the services themselves (SageMaker's, Application Auto Scaling's, CloudWatch's, their
    # state) are the control plane's.
    code = (
        "import sys, serving._worker_preload, serving.ray_wing.gateway; "
        "print(sorted(m for m in ('serving.sagemaker_api.service', 'serving.sagemaker_api.sagemaker',"
        " 'serving.sagemaker_api.application_autoscaling', 'serving.sagemaker_api.database',"
        " 'serving.cloudwatch.api') if m in sys.modules))"
    )
    assert _run(code) == "[]"
