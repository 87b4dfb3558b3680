"""Access control of one endpoint: authenticate the caller, authorize every container it would run.

Each decision is written as one JSON line to the `serving.audit` logger and counted in
`serving_access_decisions_total{endpoint,decision}`. Audit lines name the principal,
the containers, the decision and the statement that decided; never a secret, a
signature or the policy text.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import IO, Any

from serving.access.identities import AccessReference, Identities, load_reference
from serving.access.policies import (
    ACTION_INVOKE,
    KEY_TARGET_CONTAINER,
    KEY_TARGET_MODEL,
    RequestContext,
    endpoint_arn,
    evaluate,
)
from serving.access.sigv4 import Authenticator, Caller, Claim, RawRequest
from serving.errors import AccessDeniedError, ServingError
from serving.metrics.invocations import record_access
from serving.tracing import spans as tracing

__all__ = ["AUDIT_LOGGER", "EndpointAccess", "configure_audit_log"]

AUDIT_LOGGER = "serving.audit"
audit_log = logging.getLogger(AUDIT_LOGGER)


# One audit line's fields: the decision's facts, which differ by event (authenticate, authorize);
# open.
AuditRecord = dict[str, Any]


def _audit(level: int, record: AuditRecord) -> None:
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    trace_id = tracing.current_trace_id()  # None unless tracing is on
    if trace_id is not None:
        record = {**record, "trace_id": trace_id}
    audit_log.log(level, json.dumps({"time": stamp, **record}, separators=(",", ":")))


def configure_audit_log(stream: IO[str] | None = None) -> None:
    """Write audit lines, one JSON object each, to `stream` (stderr) unless the logger already has a
    handler.

    Called in the gateway process, whose root logger has no handler (INFO lines would be dropped).
    """
    if not audit_log.handlers:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        audit_log.addHandler(handler)
        # the lines are complete as they are; no second copy via the root logger
        audit_log.propagate = False
    audit_log.setLevel(logging.INFO)
    tracing.OWN_TRACE_FIELD.add(AUDIT_LOGGER)  # its JSON lines say `trace_id` as a field


class EndpointAccess:
    """The identities of one endpoint and the ARN its policies are matched against."""

    def __init__(
        self,
        identities: Identities,
        *,
        region: str,
        account_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.identities = identities
        self.region = region
        self.account_id = account_id
        self.authenticator = Authenticator(identities, region, clock)

    @classmethod
    def from_reference(
        cls, reference: AccessReference, *, region: str, account_id: str
    ) -> EndpointAccess:
        """Load the identities file the registry names (`Identities.reference`), as validated at
        deploy."""
        return cls(load_reference(reference), region=region, account_id=account_id)

    def authenticate(self, endpoint: str, request: RawRequest) -> Caller:
        """The caller, or the AWS authentication error (audited and counted as
        `unauthenticated`)."""
        return self.verify(endpoint, self.claim(endpoint, request), request)

    def claim(self, endpoint: str, request: RawRequest) -> Claim:
        """What the headers prove, before the body is read (failures audited and counted as for
        `authenticate`)."""
        return self._audited(endpoint, self.authenticator.claim, request)

    def verify(self, endpoint: str, claim: Claim, request: RawRequest) -> Caller:
        """The caller of a claim, once the body it needs (SigV4) is in `request`."""
        return self._audited(endpoint, self.authenticator.verify, claim, request)

    def known_caller(self, request: RawRequest) -> Caller | None:
        """The caller when this endpoint's identities know the request's credentials (a SigV4
        request's body in `request`), else None. Not audited: a listing asks every endpoint, and
        most know no given caller."""
        try:
            return self.authenticator.verify(self.authenticator.claim(request), request)
        except ServingError:
            return None

    def permits(
        self, endpoint: str, caller: Caller, container: str, model: str | None = None
    ) -> bool:
        """Whether the caller may invoke `container` (`model`): what a listing shows, so not audited
        either."""
        keys = {
            KEY_TARGET_CONTAINER: container,
            **({KEY_TARGET_MODEL: model} if model is not None else {}),
        }
        resource = endpoint_arn(self.region, self.account_id, endpoint)
        return evaluate(
            caller.identity.policies, RequestContext(ACTION_INVOKE, resource, keys)
        ).allowed

    def _audited(self, endpoint: str, check: Callable[..., Any], *args: Any) -> Any:
        try:
            return check(*args)
        except ServingError as error:
            record_access(endpoint, "unauthenticated")
            _audit(
                logging.WARNING,
                {
                    "event": "authenticate",
                    "endpoint": endpoint,
                    "decision": "unauthenticated",
                    "error": error.code,
                    "reason": error.message,
                    "access_key_id": getattr(error, "key_id", None),
                },
            )
            raise

    def authorize(
        self,
        endpoint: str,
        caller: Caller,
        containers: Sequence[str],
        model: str | None = None,
        action: str = ACTION_INVOKE,
    ) -> None:
        """Allow only if the caller's policies allow `action` for every container; else
        AccessDeniedException."""
        resource = endpoint_arn(self.region, self.account_id, endpoint)
        record: AuditRecord = {
            "event": "authorize",
            "principal": caller.principal,
            "auth": caller.scheme,
            "endpoint": endpoint,
            "containers": list(containers),
            "model": model,
            "action": action,
            "resource": resource,
        }
        statements: dict[str, str | None] = {}
        for container in containers:
            keys = {KEY_TARGET_CONTAINER: container}
            if model is not None:
                keys[KEY_TARGET_MODEL] = model
            decision = evaluate(caller.identity.policies, RequestContext(action, resource, keys))
            statements[container] = decision.statement
            if not decision.allowed:
                record_access(endpoint, "deny")
                _audit(
                    logging.WARNING,
                    {
                        **record,
                        "decision": "deny",
                        "denied_container": container,
                        "statements": statements,
                    },
                )
                why = (
                    "an explicit deny in an identity-based policy"
                    if decision.explicit
                    else f"no identity-based policy allows the {action} action"
                )
                target = f"container {container}" + (
                    f", model {model}" if model is not None else ""
                )
                raise AccessDeniedError(
                    f"User: {caller.principal} is not authorized to perform: {action} on resource: {resource} "
                    f"({target}) because {why}"
                )
        record_access(endpoint, "allow")
        _audit(logging.INFO, {**record, "decision": "allow", "statements": statements})
