"""What a CreateModel `Image` and a ProductionVariant `InstanceType` mean here.

Images: a stack's own name (`sklearn`, `pytorch`, ...) is that stack. A SageMaker framework or
built-in algorithm image URI
(`<account>.dkr.ecr.<region>.amazonaws.com[.cn]/<repository>[:tag|@digest]`, as the SageMaker Python
SDK's `image_uris.retrieve` returns them) maps by its repository to the stack that serves the same
artifacts; the tag (framework version) is not used: this runtime serves each framework at the
version it has installed. Any other image is refused, naming it.

Instance types: a table from the type to what one instance reserves on Ray (CPUs, memory, GPUs),
shared by the containers of the variant's model. The default table holds the AWS figures of common
types; a YAML or JSON file (`--instance-types`) replaces it for clusters whose nodes differ, or for
a laptop.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from serving.errors import ApiValidationError

__all__ = ["DEFAULT_INSTANCE_TYPES", "InstanceType", "load_instance_types", "stack_of"]

# The repositories of AWS's framework inference images and built-in algorithms, by the stack that
# serves them.
REPOSITORY_STACKS = {
    "sagemaker-scikit-learn": "sklearn",
    "sagemaker-sklearn": "sklearn",
    "pytorch-inference": "pytorch",
    "sagemaker-pytorch": "pytorch",
    "tensorflow-inference": "tensorflow",
    "sagemaker-tensorflow-serving": "tensorflow",
    "sagemaker-xgboost": "xgboost",
    "xgboost": "xgboost",  # the built-in algorithm's older repository
    "huggingface-pytorch-inference": "huggingface",  # the Hugging Face inference toolkit's DLC
    "huggingface-pytorch-tgi-inference": "huggingface",  # the LLM container (TGI)
}
_ECR = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[a-z0-9._/-]+?)(?::(?P<tag>[\w.-]+)|@sha256:[0-9a-f]{64})?$"
)


def stack_of(image: str, stacks: tuple[str, ...] | list[str], field: str) -> str:
    """The stack an Image runs on, or a ValidationException naming `field` and the rule."""
    if image in stacks:
        return image
    match = _ECR.match(image)
    if match is not None:
        stack = REPOSITORY_STACKS.get(match["repository"].rsplit("/", 1)[-1])
        if stack is not None and stack in stacks:
            return stack
    raise ApiValidationError(
        f"{field}: image {image!r} is not served by this runtime; use a stack name ({', '.join(stacks)}) or a "
        f"SageMaker framework image URI whose repository is one of {', '.join(sorted(REPOSITORY_STACKS))}"
    )


class InstanceType(BaseModel):
    """What one instance of a type reserves on Ray."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    Cpus: float = Field(
        gt=0, description="Logical Ray CPUs of one instance (its vCPUs by default)."
    )
    MemoryMb: int | None = Field(
        None, gt=0, description="Memory reserved per instance in MiB (None: not reserved)."
    )
    Gpus: float = Field(0, ge=0, description="GPUs of one instance.")


def _table(rows: dict[str, tuple[float, int, float]]) -> dict[str, InstanceType]:
    # Memory is listed for the record but not reserved by default: Ray's memory resource is a
    # reservation, and a laptop would rarely fit an ml.m5.xlarge's 16 GiB beside everything else. A
    # table file can reserve it.
    return {
        name: InstanceType(Cpus=cpus, Gpus=gpus) for name, (cpus, _memory_mb, gpus) in rows.items()
    }


# vCPUs, memory (MiB) and GPUs of common SageMaker hosting instance types, as AWS lists them.
DEFAULT_INSTANCE_TYPES: dict[str, InstanceType] = _table(
    {
        "ml.t2.medium": (2, 4096, 0),
        "ml.t2.large": (2, 8192, 0),
        "ml.m5.large": (2, 8192, 0),
        "ml.m5.xlarge": (4, 16384, 0),
        "ml.m5.2xlarge": (8, 32768, 0),
        "ml.m5.4xlarge": (16, 65536, 0),
        "ml.c5.large": (2, 4096, 0),
        "ml.c5.xlarge": (4, 8192, 0),
        "ml.c5.2xlarge": (8, 16384, 0),
        "ml.c5.4xlarge": (16, 32768, 0),
        "ml.r5.large": (2, 16384, 0),
        "ml.r5.xlarge": (4, 32768, 0),
        "ml.g4dn.xlarge": (4, 16384, 1),
        "ml.g4dn.2xlarge": (8, 32768, 1),
        "ml.g5.xlarge": (4, 16384, 1),
        "ml.g5.2xlarge": (8, 32768, 1),
        "ml.p3.2xlarge": (8, 62464, 1),
        # The SageMaker Python SDK's local mode: a share of this machine.
        "local": (0.5, 0, 0),
    }
)


def load_instance_types(path: str | Path | None) -> dict[str, InstanceType]:
    """The table in `path` (YAML or JSON: `{InstanceTypes: {ml.m5.large: {Cpus: 2, MemoryMb:
    8192}}}`), else the default one. Raises ValueError naming the entry at fault."""
    if path is None:
        return dict(DEFAULT_INSTANCE_TYPES)
    path = Path(path)
    text = path.read_text()
    document: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(document, dict) or not isinstance(document.get("InstanceTypes"), dict):
        raise ValueError(
            f"{path}: expected a mapping with InstanceTypes: {{<type>: {{Cpus, MemoryMb, Gpus}}}}"
        )
    table = {}
    for name, row in document["InstanceTypes"].items():
        try:
            table[str(name)] = InstanceType.model_validate(row)
        except PydanticValidationError as error:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
            )
            raise ValueError(f"{path}: InstanceTypes.{name}: {problems}") from None
    return table
