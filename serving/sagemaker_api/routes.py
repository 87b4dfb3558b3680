"""`POST /` with `X-Amz-Target`: SageMaker's, Application Auto Scaling's and CloudWatch's JSON
protocols on the endpoint server.

With an API identities file (`--api-identities`), every call must be signed (SigV4, scoped to the
operation's service) or carry an identity's API key, and that identity's policies must allow the
operation's IAM action on every resource the call names (`authorization`: an endpoint config's
models too, an endpoint's config, the metric an alarm watches); DescribeAlarms withholds the
datapoints of alarms from a caller who may not read metrics. Without one, calls are refused unless
`--allow-anonymous-api` (a loopback server only): creating an endpoint chooses code that runs. A
body is read only once the headers have authenticated its sender as far as they can, as for
invocations. Every decision is an audit line (`serving.audit`); then the operation is dispatched to
the control plane (`service.ControlApi`), which runs one at a time. Details: docs/security.md, "The
control-plane API".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving import protocol
from serving.access.decision import AUDIT_LOGGER
from serving.access.identities import Identities, load_identities
from serving.access.policies import Decision, RequestContext, evaluate
from serving.access.sigv4 import Authenticator, Caller
from serving.cloudwatch.alarms import withheld
from serving.documents import ApiJson
from serving.errors import AccessDeniedError, ApiValidationError, UnknownApiOperationError
from serving.gateway.body_budget import BodyBudget
from serving.gateway.router import raw_request
from serving.http.bodies import read_bounded
from serving.sagemaker_api.authorization import checks, metric_read

if TYPE_CHECKING:
    from serving.settings import ServerSettings

__all__ = [
    "AUTOSCALING_OPERATIONS",
    "CLOUDWATCH_OPERATIONS",
    "MAX_BODY_BYTES",
    "OPERATIONS",
    "SAGEMAKER_OPERATIONS",
    "Answer",
    "ApiRoutes",
    "api_routes",
]

# status, headers, body: what an operation answers, error or not
Answer = tuple[int, dict[str, str], bytes]

MAX_BODY_BYTES = 1_000_000
SAGEMAKER_OPERATIONS = (
    "CreateModel",
    "DescribeModel",
    "ListModels",
    "DeleteModel",
    "CreateEndpointConfig",
    "DescribeEndpointConfig",
    "ListEndpointConfigs",
    "DeleteEndpointConfig",
    "CreateEndpoint",
    "DescribeEndpoint",
    "ListEndpoints",
    "UpdateEndpoint",
    "UpdateEndpointWeightsAndCapacities",
    "DeleteEndpoint",
)
AUTOSCALING_OPERATIONS = (
    "RegisterScalableTarget",
    "DescribeScalableTargets",
    "DeregisterScalableTarget",
    "PutScalingPolicy",
    "DescribeScalingPolicies",
    "DeleteScalingPolicy",
    "DescribeScalingActivities",
)
CLOUDWATCH_OPERATIONS = (
    "PutMetricAlarm",
    "DescribeAlarms",
    "DeleteAlarms",
    "SetAlarmState",
    "DescribeAlarmHistory",
    "GetMetricStatistics",
    "GetMetricData",
    "ListMetrics",
)
OPERATIONS = {
    protocol.SAGEMAKER_TARGET_PREFIX: SAGEMAKER_OPERATIONS,
    protocol.AUTOSCALING_TARGET_PREFIX: AUTOSCALING_OPERATIONS,
    protocol.CLOUDWATCH_TARGET_PREFIX: CLOUDWATCH_OPERATIONS,
}
audit_log = logging.getLogger(AUDIT_LOGGER)


class ApiRoutes:
    """The control-plane API's one route."""

    def __init__(
        self,
        dispatch: Callable[[str, str, ApiJson], Awaitable[Answer]],
        region: str,
        account: str,
        identities: Identities | None,
        anonymous_allowed: bool,
        budget: BodyBudget,
    ) -> None:
        """`dispatch(prefix, operation, document)`: runs an authorized call where the control plane
        runs."""
        self.dispatch, self.region, self.account = dispatch, region, account
        self.anonymous_allowed = anonymous_allowed
        self.budget = budget  # the gateway's, shared with invocations
        self.authenticators = (
            {
                prefix: Authenticator(identities, region, service=service)
                for prefix, service in protocol.API_SIGNING_SERVICES.items()
            }
            if identities is not None
            else None
        )

    def routes(self) -> list[Route]:
        return [Route("/", self.call, methods=["POST"])]

    def operation(self, target: str | None) -> tuple[str, str]:
        """(service prefix, operation) of an X-Amz-Target, or UnknownOperationException."""
        prefix, _, operation = (target or "").partition(".")
        if operation in OPERATIONS.get(prefix, ()):
            return prefix, operation
        served = " and ".join(
            f"{known}.<{'|'.join(operations)}>" for known, operations in OPERATIONS.items()
        )
        raise UnknownApiOperationError(
            f"{protocol.AMZ_TARGET} {target!r} is not an operation of this server; it serves {served} "
            "(docs/sagemaker-api.md, docs/cloudwatch.md)"
        )

    async def call(self, request: Request) -> Response:
        prefix, operation = self.operation(request.headers.get(protocol.AMZ_TARGET))
        caller, body = await self._authenticated_body(request, prefix)
        document = _document(body, operation)
        withhold = False
        if caller is not None:
            for action, resource in checks(prefix, operation, document, self.region, self.account):
                self._authorize_one(caller, action, resource)
            withhold = self._withholds_datapoints(caller, prefix, operation)
        status, headers, answer = await self.dispatch(prefix, operation, document)
        if withhold and status == 200:
            answer = _without_datapoints(answer)
        return Response(answer, status_code=status, headers=headers)

    async def _authenticated_body(
        self, request: Request, prefix: str
    ) -> tuple[Caller | None, bytes]:
        """The caller (None: anonymous) and the body, read only once the headers allow it."""
        if self.authenticators is None:
            if not self.anonymous_allowed:
                raise AccessDeniedError(
                    "this server's control-plane API accepts no anonymous calls: start it with --api-identities "
                    "FILE and sign calls with an identity's keys (or, on a loopback server for local development, "
                    "--allow-anonymous-api)"
                )
            return None, await _read(request)
        authenticator, raw = self.authenticators[prefix], raw_request(request)
        claim = authenticator.claim(raw)  # from the headers, before a byte of the body
        if not claim.needs_body:
            return authenticator.verify(claim, raw), await _read(request)
        with self.budget.hold() as hold:  # the signature covers the body: hold it until verified
            body = await _read(request, hold)
            return authenticator.verify(claim, replace(raw, body=body)), body

    def _authorize_one(self, caller: Caller, action: str, resource: str) -> None:
        decision = self._decide(caller, action, resource)
        if not decision.allowed:
            why = (
                "an explicit deny"
                if decision.explicit
                else f"no identity-based policy allows the {action} action"
            )
            raise AccessDeniedError(
                f"User: {caller.principal} is not authorized to perform: {action} on resource: {resource} because {why}"
            )

    def _withholds_datapoints(self, caller: Caller, prefix: str, operation: str) -> bool:
        """Whether the answer must go without alarms' datapoints: DescribeAlarms to a caller who may
        not read metrics (GetMetricStatistics' authorization), which an alarm's state reason would
        show."""
        if (prefix, operation) != (protocol.CLOUDWATCH_TARGET_PREFIX, "DescribeAlarms"):
            return False
        return not self._decide(
            caller, *metric_read(self.region, self.account), denied="datapoints withheld"
        ).allowed

    def _decide(self, caller: Caller, action: str, resource: str, denied: str = "") -> Decision:
        """The policies' decision, as one audit line (`denied`: what a deny does, when it refuses no
        call)."""
        decision = evaluate(caller.identity.policies, RequestContext(action, resource, {}))
        record = {
            "event": "api",
            "principal": caller.principal,
            "action": action,
            "resource": resource,
            "decision": "allow" if decision.allowed else "deny",
            "statement": decision.statement,
            **({"then": denied} if denied and not decision.allowed else {}),
        }
        audit_log.log(
            logging.INFO if decision.allowed else logging.WARNING,
            json.dumps(record, separators=(",", ":")),
        )
        return decision


async def _read(request: Request, hold: Any = None) -> bytes:
    """The body within MAX_BODY_BYTES (and, with `hold`, within the pre-authentication budget)."""
    declared = request.headers.get("content-length")
    return bytes(
        await read_bounded(
            request.stream(), MAX_BODY_BYTES, _too_large, declared=declared, hold=hold
        )
    )


def _too_large(size: int | None) -> ApiValidationError:
    return ApiValidationError(f"a control-plane request may be at most {MAX_BODY_BYTES} bytes")


def _document(body: bytes, operation: str) -> ApiJson:
    """The request's JSON object, or a ValidationException naming what is wrong with it."""
    try:
        document = json.loads(body or b"{}")
    except RecursionError:  # json nests by recursion: a deep enough array or object would be a 500
        raise ApiValidationError(f"{operation}: the request body nests too deeply") from None
    except ValueError:
        raise ApiValidationError(f"{operation}: the request body is not JSON") from None
    if not isinstance(document, dict):
        raise ApiValidationError(f"{operation}: the request body must be a JSON object")
    return document


def _without_datapoints(answer: bytes) -> bytes:
    """A DescribeAlarms answer with each alarm's state reason withheld (`alarms.withheld`)."""
    document = json.loads(answer)
    document["MetricAlarms"] = [withheld(alarm) for alarm in document.get("MetricAlarms", [])]
    return json.dumps(document).encode()


def api_routes(
    settings: ServerSettings,
    dispatch: Callable[[str, str, ApiJson], Awaitable[Answer]],
    budget: BodyBudget,
) -> list[Route]:
    """`POST /` on a gateway: authentication and authorization here, then `dispatch` to the control
    plane. `budget`: the gateway's pre-authentication budget, which signed API bodies share with
    invocations."""
    identities = load_identities(settings.api_identities) if settings.api_identities else None
    return ApiRoutes(
        dispatch,
        settings.region,
        settings.account_id,
        identities,
        settings.api_anonymous_allowed,
        budget,
    ).routes()
