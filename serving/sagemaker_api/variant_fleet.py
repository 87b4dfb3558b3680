"""A variant as it is served: each production or shadow variant of an endpoint is a served endpoint
of its own (`<endpoint>@<variant>@<generation>`), built from the variant's model snapshot, instances
and scaling, deployed by the same mechanism as `serving apply`; the gateways route an endpoint's
traffic over its variants by weight. `VariantFleet` is the `Fleet` an endpoint update drives
(`endpoint_update`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from serving.config.spec import EndpointSpec
from serving.errors import ResourceLimitExceededError
from serving.gateway.variants import Front, ShadowRoute, VariantRoute
from serving.protocol import VARIANT_SEPARATOR
from serving.sagemaker_api.api_context import ApiContext
from serving.sagemaker_api.endpoint_update import routes as stepped_routes
from serving.sagemaker_api.models import Models
from serving.sagemaker_api.stored import EndpointConfigDocument, VariantRow
from serving.sagemaker_api.translate import scaling_block, variant_spec

__all__ = ["VariantFleet", "shadow_routes"]


class VariantFleet:
    """VariantFleet from configs, their specs, their capacity, their deployment and their routes."""

    def __init__(self, context: ApiContext, models: Models) -> None:
        self.context, self.models = context, models

    def variants_of(
        self,
        config: EndpointConfigDocument,
        current: list[VariantRow],
        *,
        retain: bool,
        served: Callable[[str], str],
    ) -> list[VariantRow]:
        """A config's variants with a snapshot of each model, each served as `served(variant name)`
        (`retain`: same-named variants keep their current weight and instance count,
        RetainAllVariantProperties)."""
        kept = {variant["VariantName"]: variant for variant in current} if retain else {}
        variants: list[VariantRow] = []
        rows = [(row, False) for row in config["request"]["ProductionVariants"]]
        rows += [(row, True) for row in config["request"].get("ShadowProductionVariants") or []]
        for index, (row, shadow) in enumerate(rows):
            self.context.instance(row["InstanceType"], f"ProductionVariants[{index}].InstanceType")
            old = kept.get(row["VariantName"])
            variants.append(
                {
                    "Served": served(row["VariantName"]),
                    "VariantName": row["VariantName"],
                    "ModelName": row["ModelName"],
                    "Model": self.models.model(row["ModelName"])["model"],
                    "InstanceType": row["InstanceType"],
                    "Weight": old["Weight"] if old else row.get("InitialVariantWeight", 1.0),
                    "Count": old["Count"] if old else row.get("InitialInstanceCount", 1),
                    # every variant captures alike
                    "DataCapture": config["request"].get("DataCaptureConfig"),
                }
            )
            if shadow:
                variants[-1]["Shadow"] = True
        return variants

    def spec_of(self, endpoint: str, variant: VariantRow) -> EndpointSpec:
        """The spec of one variant now: its model, instances, and its scalable target and policies
        if any."""
        resource = f"endpoint/{endpoint}/variant/{variant['VariantName']}"
        target = self.context.state.scalable_targets.get(resource)
        policies = [
            p for p in self.context.state.scaling_policies.all() if p["ResourceId"] == resource
        ]
        scaling = scaling_block(int(variant["Count"]), target, policies)
        instance = self.context.instance(variant["InstanceType"], "InstanceType")
        opened = {**variant, "Model": self.context.sealer.opened(dict(variant["Model"]))}
        spec = variant_spec(
            endpoint,
            opened,
            instance,
            scaling,
            self.context.identities_file,
            self.context.allow_model_requirements,
        )
        return spec.model_copy(update={"EndpointName": variant["Served"]})

    def check_capacity(self, variants: list[VariantRow], beside: list[VariantRow]) -> None:
        """ResourceLimitExceeded when the variants (beside those still serving) need more than the
        cluster has."""
        capacity = self.context.deployer.capacity()
        if not capacity:
            return
        for resource, key in (("CPU", "Cpus"), ("GPU", "Gpus")):
            needed = sum(
                getattr(self.context.instance_types[v["InstanceType"]], key) * int(v["Count"])
                for v in [*variants, *beside]
            )
            if needed > capacity.get(resource, 0.0) + 1e-9:
                raise ResourceLimitExceededError(
                    f"the endpoint's variants need {needed:g} {resource}s (instance types × instance counts"
                    f"{', with the variants still serving during the update' if beside else ''}); this cluster has "
                    f"{capacity.get(resource, 0.0):g}. Use smaller instance types or counts, or --instance-types"
                )

    def deploy(self, endpoint: str, variants: list[VariantRow]) -> dict[str, int]:
        """Apply every variant's spec; their generations, to recognise when each update is done.
        Every spec is built (and checked) before the first is applied, so a refused variant deploys
        none."""
        specs = {v["Served"]: self.spec_of(endpoint, v) for v in variants}
        return {served: self.context.deployer.apply(spec) for served, spec in specs.items()}

    def fronts(self) -> dict[str, Front]:
        """The routing table of every API endpoint that has variants serving."""
        table = {}
        for document in self.context.state.endpoints.all():
            if document["variants"]:
                name, pending = document["EndpointName"], document.get("pending")
                production = [v for v in document["variants"] if not v.get("Shadow")]
                shadows = shadow_routes(document["variants"])
                # an update moving traffic in steps: both fleets, by share
                if pending and pending.get("shift"):
                    table[name] = Front(name, stepped_routes(production, pending), shadows)
                    continue
                routes = tuple(
                    VariantRoute(v["VariantName"], v["Served"], float(v["Weight"]))
                    for v in production
                )
                table[name] = Front(name, routes, shadows)
        return table

    def publish(self) -> None:
        """Hand every gateway the routing table as the state now has it."""
        self.context.deployer.set_fronts(self.fronts())

    def spec_endpoints(self) -> dict[str, Mapping[str, Any]]:
        """Endpoints from specs given to `serving up` (not the API's variants), by name."""
        return {
            name: description
            for name, description in self.context.deployer.descriptions().items()
            if VARIANT_SEPARATOR not in name and self.context.state.endpoints.get(name) is None
        }

    def delete(self, served: str) -> bool:
        return self.context.deployer.delete(served)


def shadow_routes(variants: list[VariantRow]) -> tuple[ShadowRoute, ...]:
    """The shadow variants of a set, each sampling its weight over the production variants' (at most
    all)."""
    production = sum(float(v["Weight"]) for v in variants if not v.get("Shadow")) or 1.0
    return tuple(
        ShadowRoute(v["VariantName"], v["Served"], min(1.0, float(v["Weight"]) / production))
        for v in variants
        if v.get("Shadow")
    )
