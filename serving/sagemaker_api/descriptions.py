"""DescribeEndpoint's parts: a production or shadow variant as SageMaker shows it (weights while an
update shifts traffic, instance counts, images), and an endpoint from a spec shown as an endpoint of
one `AllTraffic` variant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serving.protocol import DEFAULT_VARIANT
from serving.sagemaker_api.endpoint_update import share, variant_status
from serving.sagemaker_api.stored import ApiJson, PendingUpdate, VariantRow

__all__ = ["describe_spec_endpoint", "describe_variant", "describe_variants"]


def describe_variant(
    variant: VariantRow,
    descriptions: Mapping[str, Any],
    pending: PendingUpdate | None,
    *,
    new: bool,
) -> ApiJson:
    """One variant of the serving fleet (`new` False) or of the one an update brings up (`new`
    True)."""
    containers = (descriptions.get(variant["Served"]) or {}).get("Containers") or []
    current = min((c.get("CurrentReplicas", 0) for c in containers), default=0)
    desired = max((c.get("DesiredReplicas", 0) for c in containers), default=int(variant["Count"]))
    images = variant["Model"].get("images") or [c["Image"] for c in variant["Model"]["containers"]]
    weight = float(variant["Weight"])
    # the new set's share of the traffic, while an update shifts it (shadows are not shifted)
    on_new = None
    if pending is not None and pending.get("deployment") is not None and not variant.get("Shadow"):
        on_new = share(pending)
    described: ApiJson = {
        "VariantName": variant["VariantName"],
        "DeployedImages": [
            {"SpecifiedImage": image, "ResolvedImage": container["Image"]}
            for image, container in zip(images, variant["Model"]["containers"], strict=False)
        ],
        # While an update shifts traffic, each fleet's weight is its variant's times its share of
        # the traffic.
        "CurrentWeight": weight if on_new is None else weight * (on_new if new else 1 - on_new),
        "DesiredWeight": weight,
        "CurrentInstanceCount": current,
        "DesiredInstanceCount": desired,
    }
    if new and pending is not None:
        described["VariantStatus"] = variant_status(pending)
    return described


def describe_variants(
    variants: list[VariantRow],
    descriptions: Mapping[str, Any],
    pending: PendingUpdate | None,
    *,
    new: bool,
) -> ApiJson:
    """`ProductionVariants` and, when the set has any, `ShadowProductionVariants` of one variant
    set."""
    described: ApiJson = {
        "ProductionVariants": [
            describe_variant(v, descriptions, pending, new=new)
            for v in variants
            if not v.get("Shadow")
        ]
    }
    shadows = [
        describe_variant(v, descriptions, pending, new=new) for v in variants if v.get("Shadow")
    ]
    return {**described, **({"ShadowProductionVariants": shadows} if shadows else {})}


def describe_spec_endpoint(description: Mapping[str, Any], arn: str) -> ApiJson:
    """An endpoint from a spec, as DescribeEndpoint shows it: its own config, one AllTraffic
    variant."""
    name = description["EndpointName"]
    containers = description.get("Containers") or []
    started = (description.get("LastUpdate") or {}).get("StartedAt") or 0.0
    described: ApiJson = {
        "EndpointName": name,
        "EndpointArn": arn,
        "EndpointConfigName": name,  # a spec is its own config
        "EndpointStatus": description["EndpointStatus"],
        "CreationTime": started,
        "LastModifiedTime": (description.get("LastUpdate") or {}).get("FinishedAt") or started,
        "ProductionVariants": [
            {
                "VariantName": DEFAULT_VARIANT,
                "DeployedImages": [
                    {"SpecifiedImage": c["Image"], "ResolvedImage": c["Image"]} for c in containers
                ],
                "CurrentWeight": 1.0,
                "DesiredWeight": 1.0,
                "CurrentInstanceCount": min(
                    (c.get("CurrentReplicas", 0) for c in containers), default=0
                ),
                "DesiredInstanceCount": max(
                    (c.get("DesiredReplicas", 0) for c in containers), default=0
                ),
            }
        ],
    }
    if description.get("FailureReason"):
        described["FailureReason"] = description["FailureReason"]
    return described
