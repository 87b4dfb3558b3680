"""A container's spec as the Ray `runtime_env` and environment of its replicas (no Ray import here).

`Environment` becomes `env_vars`, plus the container's CPU and GPU share (`SERVING_CPUS`,
`SERVING_GPUS`, and `SERVING_MEMORY_MB` when set) so that framework stacks size their thread pools and pick a device;
`RuntimeEnvironment.Pip` becomes `pip`; `RuntimeEnvironment.WorkingDir` becomes
`working_dir`: a directory is used in place (`local://`), a .zip is unpacked by Ray.
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
    """Environment variables of the container's replicas: its `Environment` plus its resource share."""
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
    """The Ray runtime_env of the container's replicas."""
    runtime_env: dict[str, Any] = {"env_vars": replica_environment(container)}
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
