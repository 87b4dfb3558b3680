"""SageMaker's endpoint operations: create, describe, list, update (blue/green), weights and
capacities, delete.

An endpoint's document (`stored.EndpointDocument`) holds the fleet of variants that serves and,
while an update is under way, the fleet coming up. Every operation that changes the fleet starts an
endpoint update, and `tick` (about twice a second) advances each one: `endpoint_update` owns it from
the new generation through its steps to finish, rollback and drain. Capacity changes and scaling
policies re-apply a variant's own served endpoint (the container-level blue/green of `serving
apply`).
"""

from __future__ import annotations

import logging
from typing import Any

from serving.config.data_capture import capture_summary
from serving.errors import ApiValidationError
from serving.protocol import VARIANT_SEPARATOR
from serving.sagemaker_api import deployment, shapes
from serving.sagemaker_api.api_context import ApiContext, missing
from serving.sagemaker_api.descriptions import describe_spec_endpoint, describe_variants
from serving.sagemaker_api.endpoint_configs import EndpointConfigs
from serving.sagemaker_api.endpoint_update import EndpointUpdates, next_generation, served_names
from serving.sagemaker_api.resources import page, sort_and_filter
from serving.sagemaker_api.stored import ApiJson, EndpointDocument, UpdateKind, VariantRow
from serving.sagemaker_api.variant_fleet import VariantFleet

logger = logging.getLogger(__name__)

__all__ = ["Endpoints"]


class Endpoints:
    """The endpoint operations and the background step that completes them."""

    def __init__(self, context: ApiContext, configs: EndpointConfigs, fleet: VariantFleet) -> None:
        self.context, self.configs, self.fleet = context, configs, fleet
        self.state, self.lock = context.state, context.lock

    def _endpoint(self, name: str) -> EndpointDocument:
        document = self.state.endpoints.get(name)
        if document is None:
            raise missing("endpoint", self.context.arn("endpoint", name))
        return document

    # Whether the last tick found nothing under way: ticks then skip their reads until a create,
    # update or restore starts something (an idle server's gateway reads no state twice a second).
    _settled = False

    @property
    def updates(self) -> EndpointUpdates:
        """The owner of every endpoint update, driving the served endpoints through this API's
        deployer."""
        return EndpointUpdates(self.fleet, self.context.clock, self._alarm_state)

    def _alarm_state(self, name: str) -> str | None:
        alarm = self.state.alarms.get(name)
        return alarm["StateValue"] if alarm else None

    def _start(
        self,
        document: EndpointDocument,
        variants: list[VariantRow],
        kind: UpdateKind,
        config: str,
        **plan: Any,
    ) -> None:
        self._settled = False
        self.updates.start(document, variants, kind, config, **plan)

    def CreateEndpoint(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.CreateEndpointInput, body, "CreateEndpoint")
        name = request.EndpointName
        if self.state.endpoints.get(name) is not None or name in self.fleet.spec_endpoints():
            raise ApiValidationError(
                f'Cannot create already existing endpoint "{self.context.arn("endpoint", name)}".'
            )
        config = self.configs.config(request.EndpointConfigName)
        now = self.context.clock()
        document: EndpointDocument = {
            "EndpointName": name,
            "EndpointArn": self.context.arn("endpoint", name),
            "EndpointConfigName": request.EndpointConfigName,
            "CreationTime": now,
            "LastModifiedTime": now,
            "EndpointStatus": "Creating",
            "FailureReason": None,
            "Tags": [tag.model_dump() for tag in request.Tags],
            "Generation": 0,
            "variants": [],
            "pending": None,
        }
        document["Generation"], served = next_generation(document)
        variants = self.fleet.variants_of(config, [], retain=False, served=served)
        # for later updates (RetainDeploymentConfig), as SageMaker keeps it
        if request.DeploymentConfig is not None:
            deployment.plan(request.DeploymentConfig, variants, self._alarm_exists)
            document["DeploymentConfig"] = request.DeploymentConfig.model_dump(exclude_unset=True)
        self.fleet.check_capacity(variants, [])
        for variant in variants:  # every spec is checked before any is deployed
            self.fleet.spec_of(name, variant)
        self._start(document, variants, "create", request.EndpointConfigName)
        self.state.endpoints.put(name, document)
        return {"EndpointArn": document["EndpointArn"]}

    def UpdateEndpoint(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.UpdateEndpointInput, body, "UpdateEndpoint")
        document = self._endpoint(request.EndpointName)
        self._updatable(document)
        config = self.configs.config(request.EndpointConfigName)
        generation, served = next_generation(document)
        retain = request.RetainAllVariantProperties
        variants = self.fleet.variants_of(
            config, document["variants"], retain=retain, served=served
        )
        names = {variant["VariantName"] for variant in variants}
        for old in document["variants"]:
            resource = f"endpoint/{document['EndpointName']}/variant/{old['VariantName']}"
            if (
                old["VariantName"] not in names
                and self.state.scalable_targets.get(resource) is not None
            ):
                raise ApiValidationError(
                    f"the update removes variant {old['VariantName']}, which has a scalable target "
                    f"({resource}); deregister it first (as SageMaker requires)"
                )
        self.fleet.check_capacity(variants, document["variants"])
        chosen = request.DeploymentConfig
        if chosen is None and request.RetainDeploymentConfig and document.get("DeploymentConfig"):
            chosen = shapes.DeploymentConfigShape.model_validate(document["DeploymentConfig"])
        plan = deployment.plan(chosen, variants, self._alarm_exists) if chosen is not None else None
        for variant in variants:
            self.fleet.spec_of(request.EndpointName, variant)
        document["Generation"] = generation
        self._start(document, variants, "update", request.EndpointConfigName, plan=plan)
        if chosen is not None:
            document["DeploymentConfig"] = chosen.model_dump(exclude_unset=True)
        document["EndpointStatus"], document["FailureReason"] = "Updating", None
        self.state.endpoints.put(request.EndpointName, document)
        return {"EndpointArn": document["EndpointArn"]}

    def _alarm_exists(self, name: str) -> bool:
        return self.state.alarms.get(name) is not None

    def _updatable(self, document: EndpointDocument) -> None:
        if document["EndpointStatus"] != "InService" or document.get("pending"):
            raise ApiValidationError(
                f'Cannot update in-progress endpoint "{document["EndpointArn"]}" (it is {document["EndpointStatus"]}).'
            )

    def UpdateEndpointWeightsAndCapacities(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(
            shapes.UpdateWeightsInput, body, "UpdateEndpointWeightsAndCapacities"
        )
        document = self._endpoint(request.EndpointName)
        self._updatable(document)
        variants = [VariantRow(**variant) for variant in document["variants"]]
        by_name = {variant["VariantName"]: variant for variant in variants}
        recount = []
        for index, desired in enumerate(request.DesiredWeightsAndCapacities):
            variant = by_name.get(desired.VariantName)
            if variant is None:
                raise ApiValidationError(
                    f"DesiredWeightsAndCapacities[{index}].VariantName: endpoint {request.EndpointName} has no "
                    f"variant {desired.VariantName} ({', '.join(by_name)})"
                )
            if desired.DesiredWeight is not None:
                variant["Weight"] = desired.DesiredWeight
            if (
                desired.DesiredInstanceCount is not None
                and desired.DesiredInstanceCount != variant["Count"]
            ):
                self._check_count(
                    request.EndpointName, variant, desired.DesiredInstanceCount, index
                )
                variant["Count"] = desired.DesiredInstanceCount
                recount.append(variant)
        if sum(float(v["Weight"]) for v in variants) <= 0:
            raise ApiValidationError(
                "DesiredWeightsAndCapacities: the variants' weights cannot all be 0"
            )
        # Weights move traffic at once; new counts re-apply those variants and finish in the
        # background.
        for old in document["variants"]:
            old["Weight"] = by_name[old["VariantName"]]["Weight"]
        document["LastModifiedTime"] = self.context.clock()
        if recount:
            self.fleet.check_capacity(variants, [])
            self._start(document, variants, "capacity", document["EndpointConfigName"])
            document["EndpointStatus"] = "Updating"
        self.state.endpoints.put(request.EndpointName, document)
        self.fleet.publish()
        return {"EndpointArn": document["EndpointArn"]}

    def _check_count(self, endpoint: str, variant: VariantRow, count: int, index: int) -> None:
        field = f"DesiredWeightsAndCapacities[{index}].DesiredInstanceCount"
        if count < 1:
            raise ApiValidationError(
                f"{field}: at least 1 instance (this runtime does not scale a variant to 0)"
            )
        resource = f"endpoint/{endpoint}/variant/{variant['VariantName']}"
        target = self.state.scalable_targets.get(resource)
        if target is not None and not target["MinCapacity"] <= count <= target["MaxCapacity"]:
            raise ApiValidationError(
                f"{field}: {count} is outside the scalable target's bounds "
                f"[{target['MinCapacity']}, {target['MaxCapacity']}] ({resource})"
            )

    def DeleteEndpoint(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.EndpointNameInput, body, "DeleteEndpoint")
        name = request.EndpointName
        if self.state.endpoints.get(name) is None and name in self.fleet.spec_endpoints():
            raise ApiValidationError(
                f"endpoint {name} comes from a spec given to `serving up`; delete it with `serving delete {name}`"
            )
        document = self._endpoint(name)
        self.state.endpoints.delete(name)
        self.fleet.publish()  # no new request reaches it from here on
        for served in sorted(
            served_names(document) | {r["Served"] for r in document.get("retired", [])}
        ):
            self.context.deployer.delete(served)
        prefix = f"endpoint/{name}/variant/"
        for policy in self.state.scaling_policies.all():
            if policy["ResourceId"].startswith(prefix):
                self.state.scaling_policies.delete(policy["key"])
        for target in self.state.scalable_targets.all():
            if target["ResourceId"].startswith(prefix):
                self.state.scalable_targets.delete(target["ResourceId"])
        return {}

    # --- describing -------------------------------------------------------------------------------
    def DescribeEndpoint(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.EndpointNameInput, body, "DescribeEndpoint")
        document = self.state.endpoints.get(request.EndpointName)
        if document is None:
            spec_endpoint = self.fleet.spec_endpoints().get(request.EndpointName)
            if spec_endpoint is None:
                raise missing("endpoint", self.context.arn("endpoint", request.EndpointName))
            return describe_spec_endpoint(
                spec_endpoint, self.context.arn("endpoint", request.EndpointName)
            )
        descriptions, pending = self.context.deployer.descriptions(), document.get("pending")
        described: ApiJson = {
            "EndpointName": document["EndpointName"],
            "EndpointArn": document["EndpointArn"],
            "EndpointConfigName": document["EndpointConfigName"],
            "EndpointStatus": document["EndpointStatus"],
            "CreationTime": document["CreationTime"],
            "LastModifiedTime": document["LastModifiedTime"],
        }
        described.update(describe_variants(document["variants"], descriptions, pending, new=False))
        if document.get("FailureReason"):
            described["FailureReason"] = document["FailureReason"]
        if document.get("DeploymentConfig"):
            described["LastDeploymentConfig"] = document["DeploymentConfig"]
        # serving first, else coming
        variants = [*document["variants"], *(pending["variants"] if pending else [])]
        capture = next((v["DataCapture"] for v in variants if v.get("DataCapture")), None)
        if capture:
            described["DataCaptureConfig"] = capture_summary(capture)
        if pending and pending["kind"] != "capacity":
            described["PendingDeploymentSummary"] = {
                "EndpointConfigName": pending["EndpointConfigName"],
                **describe_variants(pending["variants"], descriptions, pending, new=True),
                "StartTime": pending["StartedAt"],
            }
        return described

    def ListEndpoints(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.ListInput, body, "ListEndpoints")
        keys = ("EndpointName", "EndpointArn", "CreationTime", "LastModifiedTime", "EndpointStatus")
        rows: list[ApiJson] = [
            {key: dict(d)[key] for key in keys} for d in self.state.endpoints.all()
        ]
        for description in self.fleet.spec_endpoints().values():
            described = describe_spec_endpoint(
                description, self.context.arn("endpoint", description["EndpointName"])
            )
            rows.append({key: described[key] for key in keys})
        ordered = sort_and_filter(rows, request, "EndpointName", "EndpointStatus")
        chunk, token = page(ordered, request.NextToken, request.MaxResults)
        return {"Endpoints": chunk, **({"NextToken": token} if token else {})}

    # --- the background step ----------------------------------------------------------------------
    def tick(self) -> None:
        """Advance every endpoint update under way (`endpoint_update`), then publish the routes if
        any moved."""
        with self.lock:
            if self._settled:
                return
            descriptions, updates = self.context.deployer.descriptions(), self.updates
            changed, under_way = False, False
            for document in self.state.endpoints.all():
                if updates.advance(document, descriptions):
                    self.state.endpoints.put(document["EndpointName"], document)
                    changed = True
                under_way = under_way or bool(document.get("pending") or document.get("retired"))
            if changed:
                self.fleet.publish()
            self._settled = not under_way

    def served_names(self) -> set[str]:
        """The served endpoint of every variant the stored endpoints route to or are bringing up."""
        with self.lock:
            return {
                served
                for document in self.state.endpoints.all()
                for served in served_names(document)
            }

    def restore(self) -> None:
        """Bring back every stored endpoint (a restarted server): re-apply what served and what was
        coming up."""
        with self.lock:
            self._settled = False
            referenced: set[str] = set()
            for document in self.state.endpoints.all():
                try:
                    self.updates.restore(document)
                # one bad stored endpoint must not keep every other one down
                except Exception as error:
                    logger.exception("could not restore endpoint %s", document["EndpointName"])
                    reason = (
                        f"could not be restored after a restart: {type(error).__name__}: {error}"
                    )
                    document["EndpointStatus"], document["FailureReason"] = "Failed", reason
                    document["variants"], document["pending"] = [], None
                referenced |= served_names(document)
                self.state.endpoints.put(document["EndpointName"], document)
            # served variants no stored endpoint names (a crash
            for name in list(self.context.deployer.descriptions()):
                # between the two steps of a delete)
                if VARIANT_SEPARATOR in name and name not in referenced:
                    self.context.deployer.delete(name)
            self.fleet.publish()
