"""Prometheus metric definitions (exposition on /metrics comes with a later version).

Metrics live in this module's own registry rather than prometheus_client's global one,
so nothing else in the process (Ray registers its own) can collide with them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

__all__ = ["ACCESS_DECISIONS", "REGISTRY"]

REGISTRY = CollectorRegistry(auto_describe=True)

ACCESS_DECISIONS = Counter(
    "serving_access_decisions",  # exposed as serving_access_decisions_total
    "Access decisions on invocations of endpoints with AccessControl: allow, deny (policy) or unauthenticated.",
    labelnames=("endpoint", "decision"),
    registry=REGISTRY,
)
