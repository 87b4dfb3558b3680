"""SageMaker's endpoint metrics, each with the family of `GET /metrics` it is computed from.

Names, namespaces and units are SageMaker's (docs/cloudwatch.md lists them with their sources).
Utilization is filed under `/aws/sagemaker/Endpoints` as SageMaker files it, and under
`AWS/SageMaker` too, where its users' dashboards sometimes look for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from serving.protocol import ENDPOINTS_NAMESPACE, SAGEMAKER_NAMESPACE

__all__ = ["METRICS", "NAMESPACES", "Source", "source"]

Kind = Literal[
    "invocations", "errors", "per_instance", "latency", "utilization", "cache_hits", "gauge"
]


@dataclass(frozen=True)
class Source:
    """One CloudWatch metric: how its datapoints are made (`kind`) from which family of the merged
    metrics."""

    metric: str
    kind: Kind
    family: str
    unit: str
    namespaces: tuple[str, ...] = (SAGEMAKER_NAMESPACE,)


_BOTH = (ENDPOINTS_NAMESPACE, SAGEMAKER_NAMESPACE)
METRICS: dict[str, Source] = {
    source.metric: source
    for source in (
        Source("Invocations", "invocations", "serving_invocations", "None"),
        Source("Invocation4XXErrors", "errors", "serving_invocation_4xx_errors", "None"),
        Source("Invocation5XXErrors", "errors", "serving_invocation_5xx_errors", "None"),
        Source("InvocationsPerInstance", "per_instance", "serving_invocations", "None"),
        Source("ModelLatency", "latency", "serving_model_latency_seconds", "Microseconds"),
        Source("OverheadLatency", "latency", "serving_overhead_latency_seconds", "Microseconds"),
        Source("ModelSetupTime", "latency", "serving_model_loading_time_seconds", "Microseconds"),
        Source(
            "ModelLoadingWaitTime",
            "latency",
            "serving_model_loading_wait_time_seconds",
            "Microseconds",
        ),
        Source("ModelLoadingTime", "latency", "serving_model_loading_time_seconds", "Microseconds"),
        Source(
            "ModelDownloadingTime",
            "latency",
            "serving_model_downloading_time_seconds",
            "Microseconds",
        ),
        Source(
            "ModelUnloadingTime", "latency", "serving_model_unloading_time_seconds", "Microseconds"
        ),
        Source("ModelCacheHit", "cache_hits", "serving_model_cache_hit", "None"),
        Source("LoadedModelCount", "gauge", "serving_loaded_model_count", "None"),
        Source(
            "CPUUtilization", "utilization", "serving_cpu_utilization_percent", "Percent", _BOTH
        ),
        Source(
            "MemoryUtilization",
            "utilization",
            "serving_memory_utilization_percent",
            "Percent",
            _BOTH,
        ),
        Source(
            "GPUUtilization", "utilization", "serving_gpu_utilization_percent", "Percent", _BOTH
        ),
    )
}
NAMESPACES = (SAGEMAKER_NAMESPACE, ENDPOINTS_NAMESPACE)
CACHE_MISS_FAMILY = "serving_model_cache_miss"


def source(namespace: str, metric: str) -> Source | None:
    """The metric `metric` of `namespace`, or None if this server does not keep it."""
    found = METRICS.get(metric)
    return found if found is not None and namespace in found.namespaces else None
