"""Application Auto Scaling's operations for SageMaker variants, driving the runtime's target
tracking.

A scalable target (`endpoint/<name>/variant/<variant>`, `sagemaker:variant:DesiredInstanceCount`)
and its target-tracking policies become the variant's endpoint-level `AutoScaling` block — the same
block a spec writes — and the variant's served endpoint is re-applied with it, so a policy put
through boto3 is decided by the same engine (`autoscaling.policy`, run by Serve's controller) as one
written in a spec. Scaling activities are the engine's, as that engine records them.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

from serving.errors import ApiValidationError, ObjectNotFoundError
from serving.protocol import SIGNING_SERVICE
from serving.sagemaker_api import autoscaling_shapes
from serving.sagemaker_api.resources import page
from serving.sagemaker_api.sagemaker import SageMakerApi
from serving.sagemaker_api.shapes import parse
from serving.sagemaker_api.stored import (
    ApiJson,
    EndpointDocument,
    ScalableTargetDocument,
    ScalingPolicyDocument,
    VariantRow,
)

__all__ = ["AutoScalingApi"]

DIMENSION = "sagemaker:variant:DesiredInstanceCount"


class AutoScalingApi:
    """The operations of the `application-autoscaling` client, over the SageMaker API's state."""

    def __init__(self, sagemaker: SageMakerApi) -> None:
        self.sagemaker = sagemaker
        self.state = sagemaker.state
        self.lock = sagemaker.lock

    def _arn(self, resource_id: str, policy: str | None = None) -> str:
        api = self.sagemaker.context
        if policy is None:
            return f"arn:aws:application-autoscaling:{api.region}:{api.account}:scalable-target/{resource_id}"
        scope = f"{api.region}:{api.account}"
        policy_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{resource_id}/{policy}")
        return f"arn:aws:autoscaling:{scope}:scalingPolicy:{policy_id}:resource/sagemaker/{resource_id}:policyName/{policy}"

    def _variant(self, resource_id: str) -> tuple[EndpointDocument, VariantRow]:
        """The endpoint document and variant a ResourceId names, or a ValidationException."""
        _, endpoint, _, variant_name = resource_id.split("/")
        document = self.state.endpoints.get(endpoint)
        pending = document["pending"] if document else None
        variants = [
            *(document["variants"] if document else []),
            *(pending["variants"] if pending else []),
        ]
        for variant in variants:
            if variant["VariantName"] == variant_name and document is not None:
                return document, variant
        raise ApiValidationError(
            f"ResourceId {resource_id}: no endpoint {endpoint} with variant {variant_name} was created through "
            "this API (an endpoint from a spec scales by its spec's AutoScaling)"
        )

    def _reapply(self, resource_id: str) -> None:
        """Re-apply the variant's served endpoint(s) with its scaling as now stored."""
        document, _ = self._variant(resource_id)
        variant_name = resource_id.split("/")[3]
        name = document["EndpointName"]
        pending = document.get("pending")
        for variant in document["variants"]:
            if variant["VariantName"] == variant_name:
                self.sagemaker.deployer.apply(self.sagemaker.fleet.spec_of(name, variant))
        for variant in pending["variants"] if pending else []:
            if variant["VariantName"] == variant_name:
                pending["generations"][variant["Served"]] = self.sagemaker.deployer.apply(  # type: ignore[index]
                    self.sagemaker.fleet.spec_of(name, variant)
                )
        self.state.endpoints.put(name, document)

    def RegisterScalableTarget(self, body: ApiJson) -> ApiJson:
        request = parse(
            autoscaling_shapes.RegisterScalableTargetInput, body, "RegisterScalableTarget"
        )
        self._variant(request.ResourceId)
        existing = self.state.scalable_targets.get(request.ResourceId)
        low = (
            request.MinCapacity
            if request.MinCapacity is not None
            else existing and existing["MinCapacity"]
        )
        high = (
            request.MaxCapacity
            if request.MaxCapacity is not None
            else existing and existing["MaxCapacity"]
        )
        if low is None or high is None:
            raise ApiValidationError(
                "MinCapacity and MaxCapacity are required to register a new scalable target"
            )
        if low > high:
            raise ApiValidationError(f"MinCapacity ({low}) must not exceed MaxCapacity ({high})")
        document: ScalableTargetDocument = {
            "ServiceNamespace": SIGNING_SERVICE,
            "ResourceId": request.ResourceId,
            "ScalableDimension": DIMENSION,
            "MinCapacity": low,
            "MaxCapacity": high,
            "RoleARN": request.RoleARN or "",
            "CreationTime": existing["CreationTime"] if existing else time.time(),
            "ScalableTargetARN": self._arn(request.ResourceId),
        }
        self.state.scalable_targets.put(request.ResourceId, document)
        if existing is None or (existing["MinCapacity"], existing["MaxCapacity"]) != (low, high):
            self._reapply(request.ResourceId)
        return {"ScalableTargetARN": document["ScalableTargetARN"]}

    def DescribeScalableTargets(self, body: ApiJson) -> ApiJson:
        request = parse(autoscaling_shapes.TargetsInput, body, "DescribeScalableTargets")
        rows = [
            dict(target)
            for target in self.state.scalable_targets.all()
            if request.ResourceIds is None or target["ResourceId"] in request.ResourceIds
        ]
        chunk, token = page(rows, request.NextToken, request.MaxResults)
        return {"ScalableTargets": chunk, **({"NextToken": token} if token else {})}

    def DeregisterScalableTarget(self, body: ApiJson) -> ApiJson:
        request = parse(autoscaling_shapes.TargetInput, body, "DeregisterScalableTarget")
        if self.state.scalable_targets.get(request.ResourceId) is None:
            raise ObjectNotFoundError(
                f"No scalable target registered for service namespace: sagemaker, resource ID: "
                f"{request.ResourceId}, scalable dimension: {DIMENSION}"
            )
        # as Application Auto Scaling does: its policies go too
        for policy in self.state.scaling_policies.all():
            if policy["ResourceId"] == request.ResourceId:
                self.state.scaling_policies.delete(policy["key"])
        self.state.scalable_targets.delete(request.ResourceId)
        self._reapply(request.ResourceId)
        return {}

    def PutScalingPolicy(self, body: ApiJson) -> ApiJson:
        request = parse(autoscaling_shapes.PutScalingPolicyInput, body, "PutScalingPolicy")
        if self.state.scalable_targets.get(request.ResourceId) is None:
            raise ObjectNotFoundError(
                f"No scalable target registered for service namespace: sagemaker, resource ID: {request.ResourceId}, "
                f"scalable dimension: {DIMENSION}"
            )
        config = request.TargetTrackingScalingPolicyConfiguration
        spec: ApiJson = {
            "TargetValue": config.TargetValue,
            "ScaleOutCooldown": config.ScaleOutCooldown,
            "ScaleInCooldown": config.ScaleInCooldown,
            "DisableScaleIn": config.DisableScaleIn,
        }
        if config.PredefinedMetricSpecification is not None:
            spec["PredefinedMetricSpecification"] = {
                "PredefinedMetricType": config.PredefinedMetricSpecification.PredefinedMetricType
            }
        else:
            assert config.CustomizedMetricSpecification is not None
            spec["CustomizedMetricSpecification"] = {
                "MetricName": config.CustomizedMetricSpecification.MetricName
            }
        key = f"{request.ResourceId}/{request.PolicyName}"
        others = [
            p
            for p in self.state.scaling_policies.all()
            if p["ResourceId"] == request.ResourceId and p["key"] != key
        ]
        metric = _metric(spec)
        if any(_metric(p["spec"]) == metric for p in others):
            raise ApiValidationError(
                f"variant {request.ResourceId} already has a target-tracking policy on {metric}"
            )
        document: ScalingPolicyDocument = {
            "key": key,
            "PolicyName": request.PolicyName,
            "PolicyARN": self._arn(request.ResourceId, request.PolicyName),
            "ServiceNamespace": SIGNING_SERVICE,
            "ResourceId": request.ResourceId,
            "ScalableDimension": DIMENSION,
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": config.model_dump(
                mode="json", exclude_none=True
            ),
            "Alarms": [],
            "CreationTime": time.time(),
            "spec": spec,
        }
        self.state.scaling_policies.put(key, document)
        self._reapply(request.ResourceId)
        return {"PolicyARN": document["PolicyARN"], "Alarms": []}

    def DescribeScalingPolicies(self, body: ApiJson) -> ApiJson:
        request = parse(autoscaling_shapes.PoliciesInput, body, "DescribeScalingPolicies")
        rows = [
            {key: value for key, value in policy.items() if key not in ("key", "spec")}
            for policy in self.state.scaling_policies.all()
            if (request.ResourceId is None or policy["ResourceId"] == request.ResourceId)
            and (request.PolicyNames is None or policy["PolicyName"] in request.PolicyNames)
        ]
        chunk, token = page(rows, request.NextToken, request.MaxResults)
        return {"ScalingPolicies": chunk, **({"NextToken": token} if token else {})}

    def DeleteScalingPolicy(self, body: ApiJson) -> ApiJson:
        request = parse(autoscaling_shapes.DeletePolicyInput, body, "DeleteScalingPolicy")
        if not self.state.scaling_policies.delete(f"{request.ResourceId}/{request.PolicyName}"):
            raise ObjectNotFoundError(
                f"No scaling policy found for service namespace: sagemaker, resource ID: "
                f"{request.ResourceId}, scalable dimension: {DIMENSION}, policy name: "
                f"{request.PolicyName}"
            )
        self._reapply(request.ResourceId)
        return {}

    def DescribeScalingActivities(self, body: ApiJson) -> ApiJson:
        request = parse(autoscaling_shapes.ActivitiesInput, body, "DescribeScalingActivities")
        descriptions = self.sagemaker.deployer.descriptions()
        activities = []
        for document in self.state.endpoints.all():
            for variant in document["variants"]:
                resource = f"endpoint/{document['EndpointName']}/variant/{variant['VariantName']}"
                if request.ResourceId is not None and resource != request.ResourceId:
                    continue
                seen = set()
                for entry in (descriptions.get(variant["Served"]) or {}).get(
                    "ScalingActivities"
                ) or []:
                    if (entry["Time"], entry["To"]) in seen:
                        # one activity per instance count change, whichever container recorded it
                        continue
                    seen.add((entry["Time"], entry["To"]))
                    activities.append(_activity(resource, entry))
        activities.sort(key=lambda activity: activity["StartTime"], reverse=True)
        chunk, token = page(activities, request.NextToken, request.MaxResults)
        return {"ScalingActivities": chunk, **({"NextToken": token} if token else {})}


def _metric(spec: ApiJson) -> str:
    custom = spec.get("CustomizedMetricSpecification")
    if custom:
        return custom["MetricName"]
    return spec["PredefinedMetricSpecification"]["PredefinedMetricType"]


def _activity(resource: str, entry: ApiJson) -> ApiJson:
    """The engine's activity record as DescribeScalingActivities returns one."""
    when = datetime.fromisoformat(entry["Time"].replace("Z", "+00:00")).timestamp()
    direction = "out" if entry["To"] > entry["From"] else "in"
    return {
        "ActivityId": str(
            uuid.uuid5(uuid.NAMESPACE_URL, f"{resource}/{entry['Time']}/{entry['To']}")
        ),
        "ServiceNamespace": SIGNING_SERVICE,
        "ResourceId": resource,
        "ScalableDimension": DIMENSION,
        "Description": f"Setting desired instance count to {entry['To']}.",
        "Cause": f"scale {direction}: {entry.get('Reason') or ''}".strip(),
        "StartTime": when,
        "EndTime": when,
        "StatusCode": "Successful",
        "StatusMessage": f"Successfully set desired instance count to {entry['To']}. Change successfully fulfilled "
        f"by sagemaker (from {entry['From']}).",
    }
