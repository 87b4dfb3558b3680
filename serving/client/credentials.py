"""How the SDK authenticates: Signature V4 with botocore's own signer, or a bearer API key.

Credentials come from explicit keys, a named profile, or the usual AWS environment
variables and shared files, in botocore's order. The instance-metadata and container
credential providers are left out on purpose: they are network lookups that stall for
seconds on machines that are not in AWS, and this SDK usually talks to a self-hosted server.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, create_credential_resolver

from serving.protocol import SIGNING_SERVICE

DEFAULT_REGION = "us-east-1"
_NETWORK_PROVIDERS = ("container-role", "iam-role")


class Authenticator(Protocol):
    def headers(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, str]:
        """Headers to add to this request (computed per attempt: a signature has a timestamp)."""
        ...


class Anonymous:
    """No Authorization header: for endpoints without AccessControl."""

    def headers(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return "Anonymous()"


class BearerKey:
    """`Authorization: Bearer <key>`: an identity's ApiKey, for callers that cannot sign."""

    def __init__(self, api_key: str) -> None:
        if not api_key or any(c.isspace() for c in api_key):
            raise ValueError("api_key must be a non-empty string without spaces")
        self._value = f"Bearer {api_key}"

    def headers(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, str]:
        return {"Authorization": self._value}

    def __repr__(self) -> str:  # never the key itself
        return "BearerKey(***)"


class SigV4:
    """AWS Signature Version 4 over the method, URL, every header sent and the body (botocore's
    signer)."""

    def __init__(self, credentials: Credentials, region: str) -> None:
        self.credentials = credentials
        self.region = region
        self._signer = SigV4Auth(credentials, SIGNING_SERVICE, region)

    def headers(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, str]:
        request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
        self._signer.add_auth(request)
        signed = {
            "Authorization": request.headers["Authorization"],
            "X-Amz-Date": request.headers["X-Amz-Date"],
        }
        if "X-Amz-Security-Token" in request.headers:
            signed["X-Amz-Security-Token"] = request.headers["X-Amz-Security-Token"]
        return signed

    def __repr__(self) -> str:
        return f"SigV4(access_key={self.credentials.access_key[:4]}..., region={self.region!r})"


def resolve(
    *,
    api_key: str | None = None,
    aws_access_key_id: str | None = None,
    aws_secret_access_key: str | None = None,
    aws_session_token: str | None = None,
    profile_name: str | None = None,
    region_name: str | None = None,
    sign: bool | None = None,
) -> Authenticator:
    """Pick the authenticator from the arguments (see `Client`'s docstring for the order)."""
    if api_key is not None:
        if aws_access_key_id or profile_name or sign:
            raise ValueError("give api_key or AWS credentials, not both")
        return BearerKey(api_key)
    if (aws_access_key_id is None) != (aws_secret_access_key is None):
        raise ValueError("aws_access_key_id and aws_secret_access_key go together")
    if sign is False:
        if aws_access_key_id or profile_name:
            raise ValueError("sign=False with credentials: drop the credentials or the flag")
        return Anonymous()
    environment_key = api_key_from_environment()
    if aws_access_key_id is None and not profile_name and not sign and environment_key:
        return BearerKey(environment_key)
    session = botocore.session.Session(profile=profile_name)
    region = region_name or session.get_config_variable("region") or DEFAULT_REGION
    if aws_access_key_id is not None:
        return SigV4(
            Credentials(aws_access_key_id, aws_secret_access_key, aws_session_token), region
        )
    credentials = _local_credentials(session)
    if credentials is not None:
        return SigV4(credentials, region)
    if sign or profile_name:
        where = (
            f"profile {profile_name!r}"
            if profile_name
            else "the environment or the shared AWS files"
        )
        raise ValueError(f"sign=True but no AWS credentials were found in {where}")
    return Anonymous()


def _local_credentials(session: botocore.session.Session) -> Credentials | None:
    """botocore's credential chain without its network lookups."""
    resolver = create_credential_resolver(session)
    for name in _NETWORK_PROVIDERS:
        try:
            resolver.remove(name)
        except Exception:  # not in this botocore's chain
            pass
    return resolver.load_credentials()  # None when the chain finds nothing


def api_key_from_environment() -> str | None:
    """`SERVING_API_KEY`, when set: the bearer key a Client uses when given no credentials."""
    return os.environ.get("SERVING_API_KEY") or None


__all__ = [
    "Anonymous",
    "Authenticator",
    "BearerKey",
    "SigV4",
    "api_key_from_environment",
    "resolve",
]
