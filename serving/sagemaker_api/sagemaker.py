"""SageMaker's operations on this runtime, assembled: one group per resource over one shared
context.

CreateModel and CreateEndpointConfig only store (checked as far as they can be: images, model data,
names). CreateEndpoint and UpdateEndpoint bring a fleet of variants up beside what serves, and
`tick` advances each endpoint update until it is done (`endpoint_update`). One lock serializes every
operation and tick.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from serving.sagemaker_api.api_context import ApiContext
from serving.sagemaker_api.database import ApiState
from serving.sagemaker_api.endpoint_configs import EndpointConfigs
from serving.sagemaker_api.endpoints import Endpoints
from serving.sagemaker_api.images import InstanceType
from serving.sagemaker_api.models import Models
from serving.sagemaker_api.resources import Deployer
from serving.sagemaker_api.sealed import Sealer
from serving.sagemaker_api.stored import ApiJson
from serving.sagemaker_api.variant_fleet import VariantFleet

__all__ = ["SageMakerApi"]

Operation = Callable[[ApiJson], ApiJson]


class SageMakerApi:
    """The SageMaker operations over `state`, deploying through `deployer`, by operation name
    (`operations`)."""

    def __init__(
        self,
        state: ApiState,
        deployer: Deployer,
        *,
        region: str,
        account: str,
        instance_types: Mapping[str, InstanceType],
        model_roots: list[str],
        identities_file: str | None,
        allow_model_requirements: bool = False,
        container_egress: bool = False,
        clock: Any = time.time,
        sealer: Sealer | None = None,
    ) -> None:
        self.context = ApiContext(
            state,
            deployer,
            region,
            account,
            dict(instance_types),
            model_roots,
            identities_file,
            allow_model_requirements,
            container_egress,
            clock,
            sealer or Sealer(None),
        )
        self.models = Models(self.context)
        self.configs = EndpointConfigs(self.context, self.models)
        self.fleet = VariantFleet(self.context, self.models)
        self.endpoints = Endpoints(self.context, self.configs, self.fleet)
        self.state, self.deployer, self.lock = state, deployer, self.context.lock
        self.operations: dict[str, Operation] = {
            name: getattr(group, name)
            for group in (self.models, self.configs, self.endpoints)
            for name in dir(group)
            if name[:1].isupper()
        }

    def tick(self) -> None:
        """Advance every endpoint update under way (about twice a second, from the control
        plane)."""
        self.endpoints.tick()

    def restore(self) -> None:
        """Bring back every stored endpoint after a restart."""
        self.endpoints.restore()

    def served_names(self) -> set[str]:
        """Every served endpoint the API's endpoints route to or are bringing up."""
        return self.endpoints.served_names()
