"""A container's spec as the environment of its container process and the Ray `runtime_env` of its replicas.

`Environment`, plus the container's CPU and GPU share (`SERVING_CPUS`, `SERVING_GPUS`, and `SERVING_MEMORY_MB`
when set) so that framework stacks size their thread pools and pick a device, is the container process's
environment: the replica's supervisor hands it over (`model_server.supervisor`). It is not the Ray worker's: Ray
starts a worker whose actor has a `runtime_env` through an extra Python that imports Ray first (~0.8 CPU-seconds
more per replica, docs/performance.md), and the variables would reach the one process that holds Ray's credentials.
`RuntimeEnvironment.Pip` becomes `pip`; `RuntimeEnvironment.WorkingDir` becomes `working_dir`: a directory is used
in place (`local://`), a .zip is unpacked by Ray. A container with neither has no `runtime_env`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.config.spec import ContainerSpec
from serving.control.requirements import model_requirements
from serving.protocol import CPUS_ENV, GPUS_ENV, MEMORY_ENV


def _share(value: float) -> str:
    return f"{value:g}"


def replica_environment(container: ContainerSpec) -> dict[str, str]:
    """Environment variables of the container's process: its `Environment` plus its resource share."""
    resources = container.Resources
    # The reservation is authoritative: a value in Environment cannot claim a different share.
    environment = {
        **container.Environment,
        **container.batching_environment,  # the Batching field reaches the container process as its variables
        CPUS_ENV: _share(resources.Cpus),
        GPUS_ENV: _share(resources.Gpus),
    }
    if resources.MemoryMb:  # the memory utilization metric's 100%
        environment[MEMORY_ENV] = str(resources.MemoryMb)
    return environment


def ray_runtime_env(container: ContainerSpec) -> dict[str, Any]:
    """The Ray runtime_env of the container's replicas: only what its `RuntimeEnvironment` asks for."""
    runtime_env: dict[str, Any] = {}
    extra = container.RuntimeEnvironment
    packages = list(extra.Pip) if extra is not None else []
    packages += [line for line in model_requirements(container.ModelDataUrl) if line not in packages]
    if packages:  # RuntimeEnvironment.Pip, then the model's code/requirements.txt (SageMaker installs it)
        runtime_env["pip"] = {"packages": packages, "pip_check": False}
    if extra is None:
        return runtime_env
    if extra.WorkingDir:
        path = Path(extra.WorkingDir)
        runtime_env["working_dir"] = f"file://{path}" if path.suffix == ".zip" else f"local://{path}"
    return runtime_env
