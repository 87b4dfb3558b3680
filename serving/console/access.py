"""Who may read the console: the decision, made from the request's headers and client address
alone (no web framework; `page` asks it before anything is read from the control plane).

- A server without `--api-identities`: anonymous callers, only when the server binds a loopback
  address *and* the call comes from one (as invocations of an endpoint without AccessControl:
  docs/security.md). Anything else is refused: there is no credential to sign in with.
- A server with `--api-identities`: an API identity's `ApiKey`, as a bearer token or as the password
  of HTTP Basic (what a browser asks for); its policies must allow the console's read actions
  (`READS`), and an endpoint is shown only if they allow `sagemaker:DescribeEndpoint` on it. The
  invocation API keys of an endpoint's AccessControl are another file's: they are unknown here, and
  an identity of this file whose policies allow only `sagemaker:InvokeEndpoint` is refused.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from serving import protocol
from serving.access.decision import AUDIT_LOGGER
from serving.access.identities import Identities, Identity
from serving.access.policies import RequestContext, evaluate
from serving.errors import AccessDeniedError, MissingAuthenticationTokenError
from serving.sagemaker_api.authorization import checks, metric_read
from serving.settings import is_loopback

__all__ = ["ConsoleAccess", "SignInError", "Viewer", "reads"]

audit_log = logging.getLogger(AUDIT_LOGGER)
UNAUTHORIZED = 401  # HTTP's own status for "credentials, please": the browser then asks for them


class SignInError(MissingAuthenticationTokenError):
    """No credential, or one this server does not know: a 401 with HTTP Basic's challenge, so that
    a browser asks the operator for it (the body is the documented error shape)."""

    status = UNAUTHORIZED

    def wire_headers(self) -> dict[str, str]:
        return {protocol.AUTHENTICATE_HEADER: protocol.CONSOLE_CHALLENGE}


def reads(region: str, account: str) -> list[tuple[str, str]]:
    """The (IAM action, resource) pairs every console view needs: listing endpoints, reading alarms
    and reading metrics, each as the control-plane API authorizes it."""
    return [
        *checks(protocol.SAGEMAKER_TARGET_PREFIX, "ListEndpoints", {}, region, account),
        *checks(protocol.CLOUDWATCH_TARGET_PREFIX, "DescribeAlarms", {}, region, account),
        metric_read(region, account),
    ]


@dataclass(frozen=True)
class Viewer:
    """Who reads the console: an identity (None: an anonymous caller on loopback), and what it may
    see."""

    identity: Identity | None
    region: str
    account: str

    @property
    def principal(self) -> str:
        return self.identity.principal if self.identity is not None else "(anonymous)"

    def may_describe(self, endpoint: str) -> bool:
        """Whether the viewer may see `endpoint` (DescribeEndpoint's authorization)."""
        if self.identity is None:
            return True
        document = {"EndpointName": endpoint}
        wanted = checks(
            protocol.SAGEMAKER_TARGET_PREFIX,
            "DescribeEndpoint",
            document,
            self.region,
            self.account,
        )
        return all(
            evaluate(self.identity.policies, RequestContext(action, resource, {})).allowed
            for action, resource in wanted
        )


class ConsoleAccess:
    """The console's authentication and authorization for one server's settings."""

    def __init__(
        self, identities: Identities | None, server_host: str, region: str, account: str
    ) -> None:
        self.identities, self.server_host = identities, server_host
        self.region, self.account = region, account

    def viewer(self, headers: Mapping[str, str], client_host: str | None) -> Viewer:
        """The caller, or the error that refuses it (SignInError: 401; AccessDeniedError: 403)."""
        if self.identities is None:
            if is_loopback(self.server_host) and client_host and is_loopback(client_host):
                return Viewer(None, self.region, self.account)
            raise AccessDeniedError(
                "the operator console accepts anonymous callers only on a loopback server, from this "
                "machine; start the server with --api-identities FILE and sign in with an API identity's "
                "ApiKey (docs/console.md)"
            )
        key = _presented_key(headers.get("authorization", ""))
        if key is None:
            raise SignInError(
                "the operator console needs an API identity's ApiKey: as the password of HTTP Basic, or "
                "'Authorization: Bearer <key>' (docs/console.md)"
            )
        identity = self.identities.by_api_key(key)
        if identity is None:
            raise SignInError("the key is not an API identity's ApiKey on this server")
        for action, resource in reads(self.region, self.account):
            decision = evaluate(identity.policies, RequestContext(action, resource, {}))
            _audit(identity.principal, action, resource, decision.allowed, decision.statement)
            if not decision.allowed:
                raise AccessDeniedError(
                    f"User: {identity.principal} is not authorized to perform: {action} on resource: "
                    f"{resource}, which the operator console needs"
                )
        return Viewer(identity, self.region, self.account)


def _presented_key(authorization: str) -> str | None:
    """The key of `Authorization: Bearer <key>` or of `Basic base64(<any user>:<key>)`."""
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if not value:
        return None
    if scheme.lower() == protocol.BASIC_SCHEME:
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        _, colon, password = decoded.partition(":")
        return password or None if colon else None
    return value if scheme.lower() == "bearer" else None


def _audit(principal: str, action: str, resource: str, allowed: bool, statement: object) -> None:
    record = {
        "event": "console",
        "principal": principal,
        "action": action,
        "resource": resource,
        "decision": "allow" if allowed else "deny",
        "statement": statement,
    }
    audit_log.log(
        logging.INFO if allowed else logging.WARNING, json.dumps(record, separators=(",", ":"))
    )
