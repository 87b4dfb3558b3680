"""Side reads of the server during a load test: its endpoint description and its `/metrics`.

Plain `urllib`, so the same calls work before Locust is imported (the reachability check) and
after (gevent has patched the sockets, so polling during the run does not block the load).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, cast

from serving import protocol
from serving.client.credentials import Authenticator
from serving.client.replies import EndpointDescription

INVOCATIONS_METRIC = "serving_invocations_total"


class ProbeError(Exception):
    """The server could not be read: unreachable, refused, or an unexpected answer."""


def get(url: str, auth: Authenticator, accept: str, timeout: float = 5.0) -> bytes:
    """GET `url` with the run's credentials; the body, or ProbeError saying why not."""
    headers = {"Accept": accept}
    headers.update(auth.headers("GET", url, headers, b""))
    request = urllib.request.Request(url, headers=headers, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        detail = error.read()[:500].decode("utf-8", "replace")
        raise ProbeError(f"GET {url} answered {error.code}: {_message(detail)}") from None
    except (TimeoutError, urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ProbeError(f"cannot reach {url}: {reason}") from None


def _message(body: str) -> str:
    try:
        document = json.loads(body)
        return f"{document.get('__type', '')} {document.get('message', '')}".strip() or body
    except (ValueError, AttributeError):
        return body.strip() or "(empty body)"


def describe(
    base_url: str, endpoint: str, auth: Authenticator, timeout: float = 5.0
) -> EndpointDescription:
    """`GET /endpoints/{endpoint}`: the DescribeEndpoint-style description (docs/api.md)."""
    body = get(f"{base_url}/endpoints/{endpoint}", auth, protocol.JSON, timeout)
    try:
        description = json.loads(body)
    except ValueError:
        raise ProbeError(f"{base_url}/endpoints/{endpoint} did not answer JSON") from None
    if not isinstance(description, dict):
        raise ProbeError(f"{base_url}/endpoints/{endpoint} did not answer a description object")
    return cast(EndpointDescription, description)  # an object, as the server describes one


def replica_counts(description: Mapping[str, Any]) -> dict[str, int]:
    """Container hostname → CurrentReplicas, from a description."""
    counts = {}
    for container in description.get("Containers") or []:
        name, replicas = container.get("ContainerHostname"), container.get("CurrentReplicas")
        if name and isinstance(replicas, (int, float)):
            counts[name] = int(replicas)
    return counts


def invocations_total(text: str, endpoint: str, container: str | None = None) -> float | None:
    """Sum of `serving_invocations_total` over every container (or only `container`) and model of
    `endpoint` (None: not exposed). The server counts a Serial request once per container of its
    chain."""
    from prometheus_client.parser import text_string_to_metric_families

    total, seen = 0.0, False
    for family in text_string_to_metric_families(text):
        if family.name not in (INVOCATIONS_METRIC, INVOCATIONS_METRIC.removesuffix("_total")):
            continue
        seen = True  # exposed, even if this endpoint has no sample yet (0 invocations)
        for sample in family.samples:
            if (
                sample.name == INVOCATIONS_METRIC
                and sample.labels.get("endpoint") == endpoint
                and container in (None, sample.labels.get("container"))
            ):
                total += sample.value
    return total if seen else None


def read_invocations(
    base_url: str,
    endpoint: str,
    auth: Authenticator,
    timeout: float = 5.0,
    container: str | None = None,
) -> float | None:
    """The server's invocation count for `endpoint` now, from `GET /metrics` (ProbeError if
    unreadable)."""
    text = get(f"{base_url}/metrics", auth, "text/plain", timeout).decode("utf-8", "replace")
    try:
        return invocations_total(text, endpoint, container)
    except ValueError as error:
        raise ProbeError(f"{base_url}/metrics is not Prometheus text: {error}") from None


__all__ = [
    "INVOCATIONS_METRIC",
    "ProbeError",
    "describe",
    "get",
    "invocations_total",
    "read_invocations",
    "replica_counts",
]
