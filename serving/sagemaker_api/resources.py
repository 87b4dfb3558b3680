"""What the SageMaker operations share: ARNs, timestamps, paging, and the `Deployer` the API drives.

No Ray and no web framework: the gateway passes in a `Deployer` (apply a spec, delete an endpoint,
the served endpoints' descriptions, the variant routing table, the cluster's capacity).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from serving.config.spec import EndpointSpec
from serving.documents import ApiJson
from serving.errors import ApiValidationError
from serving.gateway.variants import Front
from serving.protocol import SIGNING_SERVICE

__all__ = ["Deployer", "arn", "page", "sort_and_filter"]


class Deployer(Protocol):
    """What the API needs of the runtime under it."""

    def apply(self, spec: EndpointSpec) -> int:
        """Make `spec` an endpoint's desired state (blue/green when it exists); the update's
        generation."""
        ...

    def delete(self, name: str) -> bool: ...

    def descriptions(self) -> Mapping[str, Mapping[str, Any]]:
        """The served endpoints' descriptions (`control.status.describe`), by served name."""
        ...

    def set_fronts(self, fronts: dict[str, Front]) -> None:
        """Route API endpoints' invocations to their variants."""
        ...

    def capacity(self) -> Mapping[str, float] | None:
        """The cluster's total resources (`CPU`, `GPU`), None when unknown."""
        ...


def arn(region: str, account: str, kind: str, name: str, service: str = SIGNING_SERVICE) -> str:
    """SageMaker's ARN of a resource (names lower-cased, as SageMaker writes them)."""
    return f"arn:aws:{service}:{region}:{account}:{kind}/{name.lower()}"


def page(items: Sequence[Any], token: str | None, limit: int) -> tuple[list[Any], str | None]:
    """One page of `items` after `token`, and the token of the next page (None on the last)."""
    start = 0
    if token:
        try:
            start = int(json.loads(base64.urlsafe_b64decode(token.encode()))["offset"])
            # a negative offset would slice from the end and page back round to the start
            if start < 0:
                raise ValueError(start)
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise ApiValidationError("NextToken: not a token this server gave") from None
    chunk = list(items[start : start + limit])
    following = start + limit
    next_token = (
        base64.urlsafe_b64encode(json.dumps({"offset": following}).encode()).decode()
        if following < len(items)
        else None
    )
    return chunk, next_token


def sort_and_filter(
    rows: list[ApiJson], request: Any, name_key: str, status_key: str | None = None
) -> list[ApiJson]:
    """The List* operations' filters (NameContains, times, StatusEquals) and sort (SortBy,
    SortOrder)."""

    def keep(row: ApiJson) -> bool:
        checks: list[Callable[[], bool]] = [
            lambda: (
                request.NameContains is None
                or request.NameContains.lower() in row[name_key].lower()
            ),
            lambda: (
                request.CreationTimeBefore is None
                or row["CreationTime"] < request.CreationTimeBefore
            ),
            lambda: (
                request.CreationTimeAfter is None or row["CreationTime"] > request.CreationTimeAfter
            ),
            lambda: (
                getattr(request, "LastModifiedTimeBefore", None) is None
                or row.get("LastModifiedTime", row["CreationTime"]) < request.LastModifiedTimeBefore
            ),
            lambda: (
                getattr(request, "LastModifiedTimeAfter", None) is None
                or row.get("LastModifiedTime", row["CreationTime"]) > request.LastModifiedTimeAfter
            ),
            lambda: (
                getattr(request, "StatusEquals", None) is None
                or status_key is None
                or row.get(status_key) == request.StatusEquals
            ),
        ]
        return all(check() for check in checks)

    key = {"Name": name_key, "CreationTime": "CreationTime", "Status": status_key or name_key}[
        request.SortBy
    ]
    kept = [row for row in rows if keep(row)]
    return sorted(
        kept,
        # a CreationTime of 0.0 (a spec endpoint not yet applied) sorts as a time, not as ""
        key=lambda row: (row[key] if row.get(key) is not None else "", row[name_key]),
        reverse=request.SortOrder == "Descending",
    )
