"""SageMaker's model, endpoint-config and endpoint operations, on this runtime.

CreateModel and CreateEndpointConfig only store (checked as far as they can be: images, model data,
names). CreateEndpoint and UpdateEndpoint bring a set of variants up beside what serves (each variant is
an endpoint of its own, deployed by the same blue/green mechanism as `serving apply`), and `tick` moves
the endpoint's traffic to the new set only once every variant of it is InService; if one fails, the
endpoint keeps the set it had, with the failure in DescribeEndpoint (the first set of a new endpoint has
nothing to fall back to: the endpoint is Failed). One lock serializes every operation and tick.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from serving.config.spec import EndpointSpec
from serving.errors import ApiValidationError, ResourceLimitExceededError
from serving.gateway.variants import Front, ShadowRoute, VariantRoute
from serving.protocol import VARIANT_SEPARATOR
from serving.sagemaker_api import shapes
from serving.sagemaker_api.database import ApiState
from serving.sagemaker_api.documents import (
    ApiJson,
    EndpointConfigDocument,
    ModelDocument,
    ModelSnapshot,
    VariantRow,
)
from serving.sagemaker_api.endpoint_update import routes as stepped_routes
from serving.sagemaker_api.images import InstanceType
from serving.sagemaker_api.resources import Deployer, arn, page, sort_and_filter
from serving.sagemaker_api.sealed import Sealer, masked
from serving.sagemaker_api.translate import check_model, public_name, scaling_block, variant_spec

__all__ = ["SageMakerApi"]


def _missing(kind: str, resource_arn: str) -> ApiValidationError:
    # SageMaker's words and code for a resource that does not exist (the endpoint_deleted waiter expects them).
    return ApiValidationError(f'Could not find {kind} "{resource_arn}".')


class SageMakerApi:
    """The SageMaker operations over `state`, deploying through `deployer`."""

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
        self.state, self.deployer = state, deployer
        self.region, self.account = region, account
        self.instance_types, self.model_roots = dict(instance_types), model_roots
        self.identities_file = identities_file
        self.allow_model_requirements = allow_model_requirements  # settings.allow_model_requirements
        self.container_egress = container_egress  # whether settings.container_egress_ports names any
        self.clock = clock
        self.sealer = sealer or Sealer(None)  # secret Environment values, sealed in the state
        self.lock = threading.RLock()

    def arn(self, kind: str, name: str) -> str:
        return arn(self.region, self.account, kind, name)

    # --- models ---------------------------------------------------------------------------------
    def CreateModel(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.CreateModelInput, body, "CreateModel")
        if self.state.models.get(request.ModelName) is not None:
            raise ApiValidationError(f'Cannot create already existing model "{self.arn("model", request.ModelName)}".')
        if request.EnableNetworkIsolation is False and not self.container_egress:
            raise ApiValidationError(
                "EnableNetworkIsolation: false asks for outbound network for the model's containers, which this "
                "server allows none (its operator sets --container-egress-ports); leave it out, or true"
            )
        model = check_model(request, self.model_roots, self.allow_model_requirements)
        definitions = [request.PrimaryContainer] if request.PrimaryContainer else list(request.Containers or [])
        model["images"] = [definition.Image for definition in definitions if definition is not None]
        document: ModelDocument = {
            "ModelName": request.ModelName,
            "ModelArn": self.arn("model", request.ModelName),
            "CreationTime": self.clock(),
            "request": self.sealer.seal(request.model_dump(mode="json", exclude_none=True)),
            "model": cast(ModelSnapshot, self.sealer.seal(dict(model))),
        }
        self.state.models.put(request.ModelName, document)
        return {"ModelArn": document["ModelArn"]}

    def _model(self, name: str) -> ModelDocument:
        document = self.state.models.get(name)
        if document is None:
            raise _missing("model", self.arn("model", name))
        return document

    def DescribeModel(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.ModelNameInput, body, "DescribeModel")
        document = self._model(request.ModelName)
        described = masked({key: value for key, value in document["request"].items() if key != "Tags"})
        return {**described, "ModelArn": document["ModelArn"], "CreationTime": document["CreationTime"]}

    def ListModels(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.ListInput, body, "ListModels")
        rows = [
            {"ModelName": d["ModelName"], "ModelArn": d["ModelArn"], "CreationTime": d["CreationTime"]}
            for d in self.state.models.all()
        ]
        chunk, token = page(sort_and_filter(rows, request, "ModelName"), request.NextToken, request.MaxResults)
        return {"Models": chunk, **({"NextToken": token} if token else {})}

    def DeleteModel(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.ModelNameInput, body, "DeleteModel")
        if not self.state.models.delete(request.ModelName):
            raise _missing("model", self.arn("model", request.ModelName))
        return {}  # as on SageMaker, endpoints already serving it keep serving (they hold their own copy)

    # --- endpoint configs ------------------------------------------------------------------------
    def CreateEndpointConfig(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.CreateEndpointConfigInput, body, "CreateEndpointConfig")
        name = request.EndpointConfigName
        if self.state.endpoint_configs.get(name) is not None:
            raise ApiValidationError(
                f'Cannot create already existing endpoint configuration "{self.arn("endpoint-config", name)}".'
            )
        for field, rows in (
            ("ProductionVariants", request.ProductionVariants),
            ("ShadowProductionVariants", request.ShadowProductionVariants or []),
        ):
            for index, variant in enumerate(rows):
                self._instance(variant.InstanceType, f"{field}[{index}].InstanceType")
                self._model(variant.ModelName)  # SageMaker checks the model exists, too
        document: EndpointConfigDocument = {
            "EndpointConfigName": name,
            "EndpointConfigArn": self.arn("endpoint-config", name),
            "CreationTime": self.clock(),
            "request": request.model_dump(mode="json", exclude_none=True),
        }
        self.state.endpoint_configs.put(name, document)
        return {"EndpointConfigArn": document["EndpointConfigArn"]}

    def _instance(self, instance_type: str, field: str) -> InstanceType:
        instance = self.instance_types.get(instance_type)
        if instance is None:
            raise ApiValidationError(
                f"{field}: instance type {instance_type!r} is not in this server's instance table "
                f"({', '.join(sorted(self.instance_types))}); see --instance-types"
            )
        return instance

    def _config(self, name: str) -> EndpointConfigDocument:
        document = self.state.endpoint_configs.get(name)
        if document is None:
            raise _missing("endpoint configuration", self.arn("endpoint-config", name))
        return document

    def DescribeEndpointConfig(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.EndpointConfigNameInput, body, "DescribeEndpointConfig")
        document = self._config(request.EndpointConfigName)
        described = {key: value for key, value in document["request"].items() if key != "Tags"}
        return {
            **described,
            "EndpointConfigArn": document["EndpointConfigArn"],
            "CreationTime": document["CreationTime"],
        }

    def ListEndpointConfigs(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.ListInput, body, "ListEndpointConfigs")
        rows = [
            {
                "EndpointConfigName": d["EndpointConfigName"],
                "EndpointConfigArn": d["EndpointConfigArn"],
                "CreationTime": d["CreationTime"],
            }
            for d in self.state.endpoint_configs.all()
        ]
        chunk, token = page(sort_and_filter(rows, request, "EndpointConfigName"), request.NextToken, request.MaxResults)
        return {"EndpointConfigs": chunk, **({"NextToken": token} if token else {})}

    def DeleteEndpointConfig(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.EndpointConfigNameInput, body, "DeleteEndpointConfig")
        if not self.state.endpoint_configs.delete(request.EndpointConfigName):
            raise _missing("endpoint configuration", self.arn("endpoint-config", request.EndpointConfigName))
        return {}

    # --- variants as served endpoints -------------------------------------------------------------
    def variants_of(
        self,
        config: EndpointConfigDocument,
        current: list[VariantRow],
        *,
        retain: bool,
        served: Callable[[str], str],
    ) -> list[VariantRow]:
        """A config's variants with a snapshot of each model, each served as `served(variant name)` (`retain`:
        same-named variants keep their current weight and instance count, RetainAllVariantProperties)."""
        kept = {variant["VariantName"]: variant for variant in current} if retain else {}
        variants: list[VariantRow] = []
        rows = [(row, False) for row in config["request"]["ProductionVariants"]]
        rows += [(row, True) for row in config["request"].get("ShadowProductionVariants") or []]
        for index, (row, shadow) in enumerate(rows):
            self._instance(row["InstanceType"], f"ProductionVariants[{index}].InstanceType")
            old = kept.get(row["VariantName"])
            variants.append(
                {
                    "Served": served(row["VariantName"]),
                    "VariantName": row["VariantName"],
                    "ModelName": row["ModelName"],
                    "Model": self._model(row["ModelName"])["model"],
                    "InstanceType": row["InstanceType"],
                    "Weight": old["Weight"] if old else row.get("InitialVariantWeight", 1.0),
                    "Count": old["Count"] if old else row.get("InitialInstanceCount", 1),
                    "DataCapture": config["request"].get("DataCaptureConfig"),  # every variant captures alike
                }
            )
            if shadow:
                variants[-1]["Shadow"] = True
        return variants

    def spec_of(self, endpoint: str, variant: VariantRow) -> EndpointSpec:
        """The spec of one variant now: its model, instances, and its scalable target and policies if any."""
        resource = f"endpoint/{endpoint}/variant/{variant['VariantName']}"
        target = self.state.scalable_targets.get(resource)
        policies = [p for p in self.state.scaling_policies.all() if p["ResourceId"] == resource]
        scaling = scaling_block(int(variant["Count"]), target, policies)
        instance = self._instance(variant["InstanceType"], "InstanceType")
        opened = {**variant, "Model": self.sealer.opened(dict(variant["Model"]))}
        spec = variant_spec(endpoint, opened, instance, scaling, self.identities_file, self.allow_model_requirements)
        return spec.model_copy(update={"EndpointName": variant["Served"]})

    def _check_capacity(self, variants: list[VariantRow], beside: list[VariantRow]) -> None:
        """ResourceLimitExceeded when the variants (beside those still serving) need more than the cluster has."""
        capacity = self.deployer.capacity()
        if not capacity:
            return
        for resource, key in (("CPU", "Cpus"), ("GPU", "Gpus")):
            needed = sum(
                getattr(self.instance_types[v["InstanceType"]], key) * int(v["Count"]) for v in [*variants, *beside]
            )
            if needed > capacity.get(resource, 0.0) + 1e-9:
                raise ResourceLimitExceededError(
                    f"the endpoint's variants need {needed:g} {resource}s (instance types × instance counts"
                    f"{', with the variants still serving during the update' if beside else ''}); this cluster has "
                    f"{capacity.get(resource, 0.0):g}. Use smaller instance types or counts, or --instance-types"
                )

    def _deploy(self, endpoint: str, variants: list[VariantRow]) -> dict[str, int]:
        """Apply every variant's spec; their generations, to recognise when each update is done. Every spec is
        built (and checked) before the first is applied, so a refused variant deploys none."""
        specs = {v["Served"]: self.spec_of(endpoint, v) for v in variants}
        return {served: self.deployer.apply(spec) for served, spec in specs.items()}

    def fronts(self) -> dict[str, Front]:
        """The routing table of every API endpoint that has variants serving."""
        table = {}
        for document in self.state.endpoints.all():
            if document["variants"]:
                name, pending = document["EndpointName"], document.get("pending")
                production = [v for v in document["variants"] if not v.get("Shadow")]
                shadows = shadow_routes(document["variants"])
                if pending and pending.get("shift"):  # an update moving traffic in steps: both fleets, by share
                    table[name] = Front(name, stepped_routes(production, pending), shadows)
                    continue
                routes = tuple(VariantRoute(v["VariantName"], v["Served"], float(v["Weight"])) for v in production)
                table[name] = Front(name, routes, shadows)
        return table

    def publish(self) -> None:
        self.deployer.set_fronts(self.fronts())

    def spec_endpoints(self) -> dict[str, Mapping[str, Any]]:
        """Endpoints from specs given to `serving up` (not the API's variants), by name."""
        return {
            name: description
            for name, description in self.deployer.descriptions().items()
            if VARIANT_SEPARATOR not in name and self.state.endpoints.get(name) is None
        }

    @staticmethod
    def split(name: str) -> tuple[str, str]:
        return public_name(name)


def shadow_routes(variants: list[VariantRow]) -> tuple[ShadowRoute, ...]:
    """The shadow variants of a set, each sampling its weight over the production variants' (at most all)."""
    production = sum(float(v["Weight"]) for v in variants if not v.get("Shadow")) or 1.0
    return tuple(
        ShadowRoute(v["VariantName"], v["Served"], min(1.0, float(v["Weight"]) / production))
        for v in variants
        if v.get("Shadow")
    )
