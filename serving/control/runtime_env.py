"""A container's spec as the environment of its container process and the Ray `runtime_env` of its
replicas.

`Environment`, plus the container's CPU and GPU share (`SERVING_CPUS`, `SERVING_GPUS`, and
`SERVING_MEMORY_MB` when set) so that framework stacks size their thread pools and pick a device, is
the container process's environment: the replica's supervisor hands it over
(`model_server.supervisor`). It is not the Ray worker's: Ray starts a worker whose actor has a
`runtime_env` through an extra Python that imports Ray first (~0.8 CPU-seconds more per replica,
docs/benchmarks/bench_replica_start.md), and the variables would reach the one process that holds
Ray's credentials. `RuntimeEnvironment.Pip` becomes `pip`; `RuntimeEnvironment.WorkingDir` becomes
`working_dir`: a directory is used in place (`local://`), a .zip is unpacked by Ray. A container
with neither has no `runtime_env`.

A local model's `code/requirements.txt` joins `pip` only where the operator allows it
(`SERVING_ALLOW_MODEL_REQUIREMENTS`): Ray installs those packages outside the container's sandbox,
into the virtualenv of the replica's Ray worker, so their install scripts and `.pth` files would run
with Ray's credentials (docs/security.md). Lines this Python already satisfies need no install and
are dropped, as are lines `Pip` lists (the operator vouches for those); any other line is refused at
deploy time, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.config.spec import ContainerSpec, SpecError
from serving.control.requirements import model_requirements
from serving.protocol import CPUS_ENV, GPUS_ENV, MEMORY_ENV
from serving.runtimes.requirements import unmet

# Ray's runtime_env document (pip, working_dir, env_vars ...) as Ray reads it: its shape is Ray's.
RuntimeEnv = dict[str, Any]


def _share(value: float) -> str:
    return f"{value:g}"


def replica_environment(container: ContainerSpec) -> dict[str, str]:
    """Environment variables of the container's process: its `Environment` plus its resource
    share."""
    resources = container.Resources
    # The reservation is authoritative: a value in Environment cannot claim a different share.
    environment = {
        **container.Environment,
        # the Batching field reaches the container process as its variables
        **container.batching_environment,
        CPUS_ENV: _share(resources.Cpus),
        GPUS_ENV: _share(resources.Gpus),
    }
    if resources.MemoryMb:  # the memory utilization metric's 100%
        environment[MEMORY_ENV] = str(resources.MemoryMb)
    return environment


def ray_runtime_env(container: ContainerSpec, allow_model_requirements: bool = False) -> RuntimeEnv:
    """The Ray runtime_env of the container's replicas: what its `RuntimeEnvironment` asks for, and
    its model's `code/requirements.txt` where allowed (the module docstring). Raises SpecError
    naming what is refused."""
    runtime_env: RuntimeEnv = {}
    extra = container.RuntimeEnvironment
    packages = list(extra.Pip) if extra is not None else []
    try:
        listed = model_requirements(container.ModelDataUrl)
    except ValueError as error:  # a pip option, not UTF-8, or an archive that is not one
        raise SpecError(
            f"Containers[{container.ContainerHostname}].ModelDataUrl: {error}"
        ) from None
    wanted = [line for line in listed if line not in packages]
    to_install = [line for line in wanted if unmet([line], unknown_unmet=True)]
    if to_install and not allow_model_requirements:
        raise SpecError(
            f"Containers[{container.ContainerHostname}].ModelDataUrl: the model's code/requirements.txt asks to "
            f"install {', '.join(to_install)}, which this server's Python lacks. Ray would install them outside the "
            "container's sandbox, where a package's install script and .pth files run with Ray's credentials; "
            "list them in RuntimeEnvironment.Pip if you vouch for them, or start the server with "
            "SERVING_ALLOW_MODEL_REQUIREMENTS=1 (docs/security.md)"
        )
    packages += to_install
    # RuntimeEnvironment.Pip, then the model's code/requirements.txt (SageMaker installs it)
    if packages:
        runtime_env["pip"] = {"packages": packages, "pip_check": False}
    if extra is None:
        return runtime_env
    if extra.WorkingDir:
        path = Path(extra.WorkingDir)
        runtime_env["working_dir"] = (
            f"file://{path}" if path.suffix == ".zip" else f"local://{path}"
        )
    return runtime_env
