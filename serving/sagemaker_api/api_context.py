"""What every SageMaker resource's operations share: the state, the deployer, this server's
settings, one lock.

The operations are grouped by resource (`models`, `endpoint_configs`, `endpoints`, and `variants`
for what a variant is served as); each group gets this one context rather than inheriting it, so a
group's module reads on its own and names what it uses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from serving.errors import ApiValidationError
from serving.sagemaker_api.database import ApiState
from serving.sagemaker_api.images import InstanceType
from serving.sagemaker_api.resources import Deployer, arn
from serving.sagemaker_api.sealed import Sealer

__all__ = ["ApiContext", "missing"]


def missing(kind: str, resource_arn: str) -> ApiValidationError:
    """SageMaker's words and code for a resource that does not exist (the endpoint_deleted waiter
    expects them)."""
    return ApiValidationError(f'Could not find {kind} "{resource_arn}".')


@dataclass
class ApiContext:
    """The state and settings the SageMaker operations run over; `lock` serializes every operation
    and tick."""

    state: ApiState
    deployer: Deployer
    region: str
    account: str
    instance_types: Mapping[str, InstanceType]
    model_roots: list[str]
    identities_file: str | None
    allow_model_requirements: bool = False  # settings.allow_model_requirements
    container_egress: bool = False  # whether settings.container_egress_ports names any
    clock: Callable[[], float] = time.time
    # secret Environment values, sealed in the state
    sealer: Sealer = field(default_factory=lambda: Sealer(None))
    lock: threading.RLock = field(default_factory=threading.RLock)

    def arn(self, kind: str, name: str) -> str:
        return arn(self.region, self.account, kind, name)

    def instance(self, instance_type: str, field: str) -> InstanceType:
        """The instance table's entry, or a ValidationException naming `field`."""
        instance = self.instance_types.get(instance_type)
        if instance is None:
            raise ApiValidationError(
                f"{field}: instance type {instance_type!r} is not in this server's instance table "
                f"({', '.join(sorted(self.instance_types))}); see --instance-types"
            )
        return instance
