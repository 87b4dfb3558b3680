"""The control-plane API assembled from server settings: its state, both services, the route."""

from __future__ import annotations

import os

from starlette.routing import Route

from serving.access.identities import load_identities
from serving.gateway.invocation import BodyBudget
from serving.sagemaker_api.application_autoscaling import AutoScalingApi
from serving.sagemaker_api.database import ApiState
from serving.sagemaker_api.endpoints import EndpointApi
from serving.sagemaker_api.images import load_instance_types
from serving.sagemaker_api.model_roots import check_model_roots
from serving.sagemaker_api.resources import Deployer
from serving.sagemaker_api.routes import ApiRoutes
from serving.sagemaker_api.sealed import Sealer
from serving.settings import ServerSettings

__all__ = ["build_api"]


def build_api(
    settings: ServerSettings, deployer: Deployer, budget: BodyBudget | None = None
) -> tuple[EndpointApi, list[Route]]:
    """The SageMaker API over `settings.state_file` (in memory when None), and its routes. Raises ModelRootError
    for a model root that holds what the server runs or its secrets. `budget`: the gateway's pre-authentication
    budget, which signed API bodies share with invocations (a new one when None)."""
    check_model_roots(settings)
    api = EndpointApi(
        ApiState(settings.state_file),
        deployer,
        region=settings.region,
        account=settings.account_id,
        instance_types=load_instance_types(settings.instance_types_file),
        model_roots=[root for root in settings.model_roots.split(os.pathsep) if root],
        identities_file=settings.api_identities,
        allow_model_requirements=settings.allow_model_requirements,
        sealer=Sealer(settings.state_file + ".key" if settings.state_file else None),
    )
    identities = load_identities(settings.api_identities) if settings.api_identities else None
    budget = budget if budget is not None else BodyBudget(settings.preauth_body_budget_bytes)
    routes = ApiRoutes(api, AutoScalingApi(api), identities, settings.api_anonymous_allowed, budget)
    return api, routes.routes()
