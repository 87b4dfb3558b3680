"""SageMaker's endpoint operations: create, describe, list, update (blue/green), weights and capacities, delete.

An endpoint's document holds the variants that serve (`variants`) and, while a change is under way, the
set coming up (`pending`). Every CreateEndpoint / UpdateEndpoint starts a new generation: its variants are
new served endpoints beside the old ones, so traffic moves only when the whole new set is InService (`tick`,
about twice a second), in one step (the gateway's variant table is swapped whole) or in the steps of the
update's DeploymentConfig (`deployment`), and the old set is deleted after `DRAIN_S`, so requests already
routed to it finish. A new set that fails is deleted and the
endpoint keeps serving the old one, with the failure in DescribeEndpoint. Capacity changes and scaling
policies re-apply a variant's own served endpoint (the container-level blue/green of `serving apply`).
"""

from __future__ import annotations

import logging
from typing import Any

from serving.config.data_capture import capture_summary
from serving.errors import ApiValidationError
from serving.protocol import VARIANT_SEPARATOR
from serving.sagemaker_api import deployment, shapes
from serving.sagemaker_api.descriptions import describe_spec_endpoint, describe_variants
from serving.sagemaker_api.resources import page, sort_and_filter
from serving.sagemaker_api.sagemaker import SageMakerApi, _missing
from serving.sagemaker_api.translate import internal_name

logger = logging.getLogger(__name__)

__all__ = ["DRAIN_S", "EndpointApi"]

DRAIN_S = 10.0  # an old variant set is deleted this long after traffic left it (requests in flight finish)


class EndpointApi(SageMakerApi):
    """The endpoint operations and the background step that completes them."""

    def _endpoint(self, name: str) -> dict[str, Any]:
        document = self.state.get("endpoint", name)
        if document is None:
            raise _missing("endpoint", self.arn("endpoint", name))
        return document

    # Whether the last tick found nothing under way: ticks then skip their reads until a create, update or
    # restore starts something (an idle server's gateway reads no state twice a second).
    _settled = False

    def _start(self, document: dict[str, Any], variants: list[dict[str, Any]], kind: str, config: str) -> None:
        self._settled = False
        document["pending"] = {
            "kind": kind,
            "EndpointConfigName": config,
            "variants": variants,
            "generations": self._deploy(document["EndpointName"], variants),
            "StartedAt": self.clock(),
        }
        document["LastModifiedTime"] = self.clock()

    def _new_generation(self, document: dict[str, Any], variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
        document["Generation"] = int(document.get("Generation", 0)) + 1
        for variant in variants:
            variant["Served"] = internal_name(document["EndpointName"], variant["VariantName"], document["Generation"])
        return variants

    def CreateEndpoint(self, body: dict[str, Any]) -> dict[str, Any]:
        request = shapes.parse(shapes.CreateEndpointInput, body, "CreateEndpoint")
        name = request.EndpointName
        if self.state.get("endpoint", name) is not None or name in self.spec_endpoints():
            raise ApiValidationError(f'Cannot create already existing endpoint "{self.arn("endpoint", name)}".')
        config = self._config(request.EndpointConfigName)
        now = self.clock()
        document: dict[str, Any] = {
            "EndpointName": name,
            "EndpointArn": self.arn("endpoint", name),
            "EndpointConfigName": request.EndpointConfigName,
            "CreationTime": now,
            "LastModifiedTime": now,
            "EndpointStatus": "Creating",
            "FailureReason": None,
            "Tags": [tag.model_dump() for tag in request.Tags],
            "variants": [],
        }
        variants = self._new_generation(document, self.variants_of(config, [], retain=False))
        if request.DeploymentConfig is not None:  # for later updates (RetainDeploymentConfig), as SageMaker keeps it
            deployment.plan(request.DeploymentConfig, variants, self._alarm_exists)
            document["DeploymentConfig"] = request.DeploymentConfig.model_dump(exclude_unset=True)
        self._check_capacity(variants, [])
        for variant in variants:  # every spec is checked before any is deployed
            self.spec_of(name, variant)
        self._start(document, variants, "create", request.EndpointConfigName)
        self.state.put("endpoint", name, document)
        return {"EndpointArn": document["EndpointArn"]}

    def UpdateEndpoint(self, body: dict[str, Any]) -> dict[str, Any]:
        request = shapes.parse(shapes.UpdateEndpointInput, body, "UpdateEndpoint")
        document = self._endpoint(request.EndpointName)
        self._updatable(document)
        config = self._config(request.EndpointConfigName)
        variants = self.variants_of(config, document["variants"], retain=request.RetainAllVariantProperties)
        names = {variant["VariantName"] for variant in variants}
        for old in document["variants"]:
            resource = f"endpoint/{document['EndpointName']}/variant/{old['VariantName']}"
            if old["VariantName"] not in names and self.state.get("scalable-target", resource) is not None:
                raise ApiValidationError(
                    f"the update removes variant {old['VariantName']}, which has a scalable target "
                    f"({resource}); deregister it first (as SageMaker requires)"
                )
        self._check_capacity(variants, document["variants"])
        chosen = request.DeploymentConfig
        if chosen is None and request.RetainDeploymentConfig and document.get("DeploymentConfig"):
            chosen = shapes.DeploymentConfigShape.model_validate(document["DeploymentConfig"])
        shift = deployment.plan(chosen, variants, self._alarm_exists) if chosen is not None else None
        self._new_generation(document, variants)
        for variant in variants:
            self.spec_of(request.EndpointName, variant)
        self._start(document, variants, "update", request.EndpointConfigName)
        document["pending"]["deployment"] = shift
        if chosen is not None:
            document["DeploymentConfig"] = chosen.model_dump(exclude_unset=True)
        document["EndpointStatus"], document["FailureReason"] = "Updating", None
        self.state.put("endpoint", request.EndpointName, document)
        return {"EndpointArn": document["EndpointArn"]}

    def _alarm_exists(self, name: str) -> bool:
        return self.state.get("alarm", name) is not None

    def _updatable(self, document: dict[str, Any]) -> None:
        if document["EndpointStatus"] != "InService" or document.get("pending"):
            raise ApiValidationError(
                f'Cannot update in-progress endpoint "{document["EndpointArn"]}" (it is {document["EndpointStatus"]}).'
            )

    def UpdateEndpointWeightsAndCapacities(self, body: dict[str, Any]) -> dict[str, Any]:
        request = shapes.parse(shapes.UpdateWeightsInput, body, "UpdateEndpointWeightsAndCapacities")
        document = self._endpoint(request.EndpointName)
        self._updatable(document)
        variants = [dict(variant) for variant in document["variants"]]
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
            if desired.DesiredInstanceCount is not None and desired.DesiredInstanceCount != variant["Count"]:
                self._check_count(request.EndpointName, variant, desired.DesiredInstanceCount, index)
                variant["Count"] = desired.DesiredInstanceCount
                recount.append(variant)
        if sum(float(v["Weight"]) for v in variants) <= 0:
            raise ApiValidationError("DesiredWeightsAndCapacities: the variants' weights cannot all be 0")
        # Weights move traffic at once; new counts re-apply those variants and finish in the background.
        document["variants"] = [
            {**old, "Weight": by_name[old["VariantName"]]["Weight"]} for old in document["variants"]
        ]
        document["LastModifiedTime"] = self.clock()
        if recount:
            self._check_capacity(variants, [])
            self._start(document, variants, "capacity", document["EndpointConfigName"])
            document["EndpointStatus"] = "Updating"
        self.state.put("endpoint", request.EndpointName, document)
        self.publish()
        return {"EndpointArn": document["EndpointArn"]}

    def _check_count(self, endpoint: str, variant: dict[str, Any], count: int, index: int) -> None:
        field = f"DesiredWeightsAndCapacities[{index}].DesiredInstanceCount"
        if count < 1:
            raise ApiValidationError(f"{field}: at least 1 instance (this runtime does not scale a variant to 0)")
        resource = f"endpoint/{endpoint}/variant/{variant['VariantName']}"
        target = self.state.get("scalable-target", resource)
        if target is not None and not target["MinCapacity"] <= count <= target["MaxCapacity"]:
            raise ApiValidationError(
                f"{field}: {count} is outside the scalable target's bounds "
                f"[{target['MinCapacity']}, {target['MaxCapacity']}] ({resource})"
            )

    def DeleteEndpoint(self, body: dict[str, Any]) -> dict[str, Any]:
        request = shapes.parse(shapes.EndpointNameInput, body, "DeleteEndpoint")
        name = request.EndpointName
        if self.state.get("endpoint", name) is None and name in self.spec_endpoints():
            raise ApiValidationError(
                f"endpoint {name} comes from a spec given to `serving up`; delete it with `serving delete {name}`"
            )
        document = self._endpoint(name)
        self.state.delete("endpoint", name)
        self.publish()  # no new request reaches it from here on
        for variant in [*document["variants"], *((document.get("pending") or {}).get("variants") or [])]:
            self.deployer.delete(variant["Served"])
        for retired in document.get("retired", []):
            self.deployer.delete(retired["Served"])
        prefix = f"endpoint/{name}/variant/"
        for policy in self.state.all("scaling-policy"):
            if policy["ResourceId"].startswith(prefix):
                self.state.delete("scaling-policy", policy["key"])
        for target in self.state.all("scalable-target"):
            if target["ResourceId"].startswith(prefix):
                self.state.delete("scalable-target", target["ResourceId"])
        return {}

    # --- describing ---------------------------------------------------------------------------------
    def DescribeEndpoint(self, body: dict[str, Any]) -> dict[str, Any]:
        request = shapes.parse(shapes.EndpointNameInput, body, "DescribeEndpoint")
        document = self.state.get("endpoint", request.EndpointName)
        if document is None:
            spec_endpoint = self.spec_endpoints().get(request.EndpointName)
            if spec_endpoint is None:
                raise _missing("endpoint", self.arn("endpoint", request.EndpointName))
            return describe_spec_endpoint(spec_endpoint, self.arn("endpoint", request.EndpointName))
        descriptions, pending = self.deployer.descriptions(), document.get("pending")
        described = {
            key: document[key]
            for key in ("EndpointName", "EndpointArn", "EndpointConfigName", "EndpointStatus", "CreationTime")
        }
        described["LastModifiedTime"] = document["LastModifiedTime"]
        described.update(describe_variants(document["variants"], descriptions, pending, new=False))
        if document.get("FailureReason"):
            described["FailureReason"] = document["FailureReason"]
        if document.get("DeploymentConfig"):
            described["LastDeploymentConfig"] = document["DeploymentConfig"]
        variants = [*document["variants"], *(pending["variants"] if pending else [])]  # serving first, else coming
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

    def ListEndpoints(self, body: dict[str, Any]) -> dict[str, Any]:
        request = shapes.parse(shapes.ListInput, body, "ListEndpoints")
        keys = ("EndpointName", "EndpointArn", "CreationTime", "LastModifiedTime", "EndpointStatus")
        rows = [{key: d[key] for key in keys} for d in self.state.all("endpoint")]
        for description in self.spec_endpoints().values():
            described = describe_spec_endpoint(description, self.arn("endpoint", description["EndpointName"]))
            rows.append({key: described[key] for key in keys})
        ordered = sort_and_filter(rows, request, "EndpointName", "EndpointStatus")
        chunk, token = page(ordered, request.NextToken, request.MaxResults)
        return {"Endpoints": chunk, **({"NextToken": token} if token else {})}

    # --- the background step -----------------------------------------------------------------------
    def tick(self) -> None:
        """Finish what is under way: move traffic to a ready set, roll back a failed one, delete drained sets."""
        with self.lock:
            if self._settled:
                return
            descriptions = self.deployer.descriptions()
            changed, under_way = False, False
            for document in self.state.all("endpoint"):
                before = repr(document)
                self._advance(document, descriptions)
                self._retire(document)
                if repr(document) != before:
                    self.state.put("endpoint", document["EndpointName"], document)
                    changed = True
                under_way = under_way or bool(document.get("pending") or document.get("retired"))
            if changed:
                self.publish()
            self._settled = not under_way

    def _advance(self, document: dict[str, Any], descriptions: Any) -> None:
        pending = document.get("pending")
        if not pending:
            return
        done, failure = True, None
        for variant in pending["variants"]:
            served = variant["Served"]
            description = descriptions.get(served)
            update = (description or {}).get("LastUpdate") or {}
            if description is None or (update.get("Generation") or 0) < pending["generations"][served]:
                done = False
                continue
            if update.get("Status") == "Failed":
                failure = f"variant {variant['VariantName']}: {update.get('FailureReason')}"
                break
            if update.get("Status") != "Succeeded" or description.get("EndpointStatus") != "InService":
                done = False
        now = self.clock()
        if failure is not None:
            self._fail(document, pending, failure, now)
        elif done and pending.get("deployment") and pending["kind"] == "update":
            self._shift(document, pending, now)
        elif done:
            self._finish(document, pending, now)

    def _shift(self, document: dict[str, Any], pending: dict[str, Any], now: float) -> None:
        """An update with a DeploymentConfig: its next step of traffic, its end, or its rollback."""
        if not pending.get("shift"):
            pending["shift"] = {"step": 0, "since": now}
            return
        action, why = deployment.progress(
            pending, now, lambda name: (self.state.get("alarm", name) or {}).get("StateValue")
        )
        if action == "rollback":
            self._fail(document, pending, why, now)
        elif action == "step":
            pending["shift"] = {"step": pending["shift"]["step"] + 1, "since": now}
        elif action == "finish":
            self._finish(document, pending, now, termination=pending["deployment"]["termination"])

    def _finish(self, document: dict[str, Any], pending: dict[str, Any], now: float, termination: float = 0) -> None:
        """All traffic on the new fleet; the old one deleted DRAIN_S (plus `termination`) from now."""
        retiring = {v["Served"] for v in pending["variants"]}
        document["retired"] = [
            *document.get("retired", []),
            *(
                {"Served": v["Served"], "At": now + termination}
                for v in document["variants"]
                if v["Served"] not in retiring
            ),
        ]
        document["variants"], document["pending"] = pending["variants"], None
        document["EndpointConfigName"] = pending["EndpointConfigName"]
        document["EndpointStatus"], document["FailureReason"] = "InService", None
        document["LastModifiedTime"] = now

    def _fail(self, document: dict[str, Any], pending: dict[str, Any], failure: str, now: float) -> None:
        serving = {v["Served"] for v in document["variants"]}
        for variant in pending["variants"]:
            if variant["Served"] in serving:
                continue
            if pending.get("shift"):  # it took traffic: deleted only once the gateways route without it
                document["retired"] = [*document.get("retired", []), {"Served": variant["Served"], "At": now}]
            else:
                self.deployer.delete(variant["Served"])
        document["pending"], document["LastModifiedTime"] = None, now
        if document["variants"] and pending["kind"] != "restore":  # rolled back: the serving set stays
            document["EndpointStatus"] = "InService"
            document["FailureReason"] = f"The update failed and was rolled back: {failure}"
        else:
            document["EndpointStatus"], document["FailureReason"], document["variants"] = "Failed", failure, []

    def _retire(self, document: dict[str, Any]) -> None:
        keep = []
        for retired in document.get("retired", []):
            if self.clock() - retired["At"] >= DRAIN_S:
                self.deployer.delete(retired["Served"])
            else:
                keep.append(retired)
        document["retired"] = keep

    def served_names(self) -> set[str]:
        """The served endpoint of every variant the stored endpoints route to or are bringing up."""
        with self.lock:
            return {
                variant["Served"]
                for document in self.state.all("endpoint")
                for variant in [*document["variants"], *((document.get("pending") or {}).get("variants") or [])]
            }

    def restore(self) -> None:
        """Bring back every stored endpoint (a restarted server): re-apply what served and what was coming up."""
        with self.lock:
            self._settled = False
            referenced: set[str] = set()
            for document in self.state.all("endpoint"):
                pending = document.get("pending")
                try:
                    self._restore_one(document, pending)
                except Exception as error:  # one bad stored endpoint must not keep every other one down
                    logger.exception("could not restore endpoint %s", document["EndpointName"])
                    reason = f"could not be restored after a restart: {type(error).__name__}: {error}"
                    document.update(EndpointStatus="Failed", FailureReason=reason, variants=[], pending=None)
                pending = document.get("pending")
                referenced |= {v["Served"] for v in [*document["variants"], *((pending or {}).get("variants") or [])]}
                self.state.put("endpoint", document["EndpointName"], document)
            for name in list(self.deployer.descriptions()):  # served variants no stored endpoint names (a crash
                if VARIANT_SEPARATOR in name and name not in referenced:  # between the two steps of a delete)
                    self.deployer.delete(name)
            self.publish()

    def _restore_one(self, document: dict[str, Any], pending: dict[str, Any] | None) -> None:
        if pending:
            pending["generations"] = self._deploy(document["EndpointName"], pending["variants"])
            pending.pop("shift", None)  # traffic shifting starts again once the new fleet is back
        if document["variants"]:
            generations = self._deploy(document["EndpointName"], document["variants"])
            if not pending:
                document["EndpointStatus"] = "Updating"  # until its variants are back
                document["pending"] = {
                    "kind": "restore",
                    "EndpointConfigName": document["EndpointConfigName"],
                    "variants": document["variants"],
                    "generations": generations,
                    "StartedAt": self.clock(),
                }
        for retired in document.get("retired", []):
            self.deployer.delete(retired["Served"])
        document["retired"] = []
