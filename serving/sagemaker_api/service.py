"""The control-plane API assembled from server settings: its state and its services (`ControlApi`,
run where the control plane runs), and both in one process for tests (`build_api`). The route that
authenticates a call and hands it to them runs on every gateway (`routes.api_routes`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable

from starlette.routing import Route

from serving import protocol
from serving.cloudwatch.api import CloudWatchApi
from serving.cloudwatch.sampler import Served
from serving.documents import ApiJson
from serving.errors import ServingError, UnknownApiOperationError, wire_error
from serving.gateway.body_budget import BodyBudget
from serving.sagemaker_api.application_autoscaling import AutoScalingApi
from serving.sagemaker_api.database import ApiState
from serving.sagemaker_api.images import load_instance_types
from serving.sagemaker_api.model_roots import check_model_roots
from serving.sagemaker_api.resources import Deployer
from serving.sagemaker_api.routes import (
    AUTOSCALING_OPERATIONS,
    CLOUDWATCH_OPERATIONS,
    SAGEMAKER_OPERATIONS,
    Answer,
    api_routes,
)
from serving.sagemaker_api.sagemaker import SageMakerApi
from serving.sagemaker_api.sealed import Sealer
from serving.sagemaker_api.state_file import KEY_SUFFIX
from serving.sagemaker_api.translate import public_name
from serving.settings import ServerSettings

__all__ = ["ControlApi", "build_api"]


class ControlApi:
    """The services over one state: what a call runs once its caller is authenticated and
    authorized."""

    def __init__(self, settings: ServerSettings, deployer: Deployer) -> None:
        """Raises ModelRootError for a model root that holds what the server runs or its secrets."""
        check_model_roots(settings)
        self.sagemaker = SageMakerApi(
            ApiState(settings.state_file),
            deployer,
            region=settings.region,
            account=settings.account_id,
            instance_types=load_instance_types(settings.instance_types_file),
            model_roots=[root for root in settings.model_roots.split(os.pathsep) if root],
            identities_file=settings.api_identities,
            allow_model_requirements=settings.allow_model_requirements,
            container_egress=bool(settings.container_egress_ports),
            sealer=Sealer(settings.state_file + KEY_SUFFIX if settings.state_file else None),
        )
        self.autoscaling = AutoScalingApi(self.sagemaker)
        state = self.sagemaker.state
        self.cloudwatch = CloudWatchApi(
            state.alarms,
            state.alarm_history,
            settings.region,
            settings.account_id,
            self._layout(deployer),
        )
        # What each service prefix runs, by operation: exactly the operations the route admits.
        self.handlers: dict[str, dict[str, Callable[[ApiJson], ApiJson]]] = {
            protocol.SAGEMAKER_TARGET_PREFIX: {
                name: self.sagemaker.operations[name] for name in SAGEMAKER_OPERATIONS
            },
            protocol.AUTOSCALING_TARGET_PREFIX: {
                name: getattr(self.autoscaling, name) for name in AUTOSCALING_OPERATIONS
            },
            protocol.CLOUDWATCH_TARGET_PREFIX: {
                name: getattr(self.cloudwatch, name) for name in CLOUDWATCH_OPERATIONS
            },
        }

    @staticmethod
    def _layout(deployer: Deployer) -> Callable[[str], Served | None]:
        """How CloudWatch names a served endpoint: its API endpoint and variant, its mode and
        replicas."""

        def layout(served: str) -> Served | None:
            description = deployer.descriptions().get(served)
            if description is None:
                return None
            endpoint, variant = public_name(served)
            containers = description.get("Containers") or []
            replicas = {
                c["ContainerHostname"]: int(c.get("CurrentReplicas") or 0) for c in containers
            }
            serial = (description.get("InferenceExecutionConfig") or {}).get("Mode") == "Serial"
            return Served(endpoint, variant, serial, replicas)

        return layout

    def call(self, prefix: str, operation: str, document: ApiJson) -> Answer:
        """Run one operation (SageMaker's one at a time; CloudWatch's beside them); its answer or
        its error, in the wire shape."""
        try:
            handler = self.handlers.get(prefix, {}).get(operation)
            # the route admits only known operations; this holds if another caller does not
            if handler is None:
                raise UnknownApiOperationError(
                    f"{prefix}.{operation} is not an operation of this server"
                )
            # reads of the metric store never wait on a deploy
            if prefix == protocol.CLOUDWATCH_TARGET_PREFIX:
                answer = handler(document)
                return 200, {"content-type": protocol.AMZ_JSON_1_0}, json.dumps(answer).encode()
            with self.sagemaker.lock:
                answer = handler(document)
        except ServingError as error:
            return wire_error(error)
        return 200, {"content-type": protocol.AMZ_JSON}, json.dumps(answer).encode()


def build_api(
    settings: ServerSettings, deployer: Deployer, budget: BodyBudget | None = None
) -> tuple[ControlApi, list[Route]]:
    """The API and its route in one process (tests, and anything without a separate control
    plane)."""
    control = ControlApi(settings, deployer)

    async def dispatch(prefix: str, operation: str, document: ApiJson) -> Answer:
        return await asyncio.to_thread(control.call, prefix, operation, document)

    budget = budget if budget is not None else BodyBudget(settings.preauth_body_budget_bytes)
    return control, api_routes(settings, dispatch, budget)
