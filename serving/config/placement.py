"""Where a container's replicas run and with what: the Ray resources each reserves and its own
Python environment (Ray `runtime_env`), two documents of the container's spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

from serving.documents import Document, document_path, folder_of

__all__ = ["ResourceConfig", "RuntimeEnvironmentConfig", "local_path"]


class ResourceConfig(Document):
    """Ray resources reserved for each replica of a container."""

    Cpus: float = Field(
        0.1,
        gt=0,
        le=512,
        description="Logical CPUs per replica (Ray num_cpus); fractional shares allowed.",
    )
    MemoryMb: int | None = Field(
        None, gt=0, description="Memory reserved per replica in MiB (Ray memory resource)."
    )
    Gpus: float = Field(0, ge=0, le=64, description="GPUs per replica (Ray num_gpus).")
    Custom: dict[
        Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$")],
        Annotated[float, Field(gt=0)],
    ] = Field(
        default_factory=dict,
        description="Ray custom resources per replica (e.g. {gpu-node: 1} to place it on nodes started with "
        "--resources '{\"gpu-node\": 4}'); Ray's own names (CPU, GPU, memory, node:...) are refused.",
    )

    @field_validator("Custom")
    @classmethod
    def _custom_is_custom(cls, custom: dict[str, float]) -> dict[str, float]:
        reserved = [
            name
            for name in custom
            if name in ("CPU", "GPU", "memory", "object_store_memory")
            or name.startswith("node:")
            or name.startswith("accelerator_type:")
        ]
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)}: use Cpus, Gpus or MemoryMb; node:... is Ray's own"
            )
        return custom


def local_path(value: str, info: ValidationInfo) -> Path:
    """A local path or `file://` URL from the spec, by the documents' path rule (relative to the
    spec's folder)."""
    return document_path(value.removeprefix("file://"), folder_of(info))


class RuntimeEnvironmentConfig(Document):
    """The container's own Python environment on Ray (its replicas' Ray `runtime_env`); environment
    variables come from the container's `Environment`."""

    Pip: list[Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        default_factory=list,
        max_length=100,
        description="Requirement specifiers (`name==1.2`) Ray installs into a virtualenv for this container's "
        "replicas, on top of the node's packages (Ray runtime_env `pip`). Needs the package index on every node.",
    )
    WorkingDir: str | None = Field(
        None,
        description="A directory or .zip, relative to the spec file: the replicas' working directory, importable "
        "from code/inference.py (Ray runtime_env `working_dir`). Cluster mode: the same path on every node.",
    )

    @field_validator("Pip")
    @classmethod
    def _requirements_only(cls, packages: list[str]) -> list[str]:
        for package in packages:
            if package.lstrip().startswith("-"):
                raise ValueError(f"{package!r}: list requirement specifiers only, not pip options")
        return packages

    @field_validator("WorkingDir")
    @classmethod
    def _resolve_working_dir(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        path = local_path(value, info)
        if not (path.is_dir() or (path.is_file() and path.suffix == ".zip")):
            raise ValueError(
                f"working dir {value!r} must be an existing directory or .zip file (looked at {path})"
            )
        return str(path.resolve())
