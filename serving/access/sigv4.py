"""Who is calling: AWS Signature Version 4 and bearer API keys, checked against the identities.

botocore's signer (`_signer`) is imported by the `Authenticator`, which verifies signatures, not by this
module: what only needs the request and caller types (the router, the spec's validation) never loads it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from serving import protocol
from serving.access.identities import Identities, Identity
from serving.errors import (
    InvalidSignatureError,
    MissingAuthenticationTokenError,
    ServingError,
    UnrecognizedClientError,
)

ALGORITHM = "AWS4-HMAC-SHA256"


MAX_SKEW_S = 300  # AWS accepts signatures made within 5 minutes of its own clock


_AMZ_DATE = "%Y%m%dT%H%M%SZ"
_AMZ_DATE_FORM = re.compile(r"(\d{4})(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)Z", re.ASCII)


def _amz_datetime(value: str) -> datetime | None:
    """X-Amz-Date as a UTC datetime, None unless exactly YYYYMMDD'T'HHMMSS'Z' and a real date and time.

    By hand, not `strptime`: it runs on every signed request, and strptime costs several times more."""
    match = _AMZ_DATE_FORM.fullmatch(value)
    if match is None:
        return None
    try:
        year, month, day, hour, minute, second = (int(part) for part in match.groups())
        return datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:  # month 13, February 30, hour 24 ...
        return None


# A request naming a target must have signed that name, or a replayed request could be retargeted.
_MUST_BE_SIGNED = (protocol.TARGET_CONTAINER.lower(), protocol.TARGET_MODEL.lower())


@dataclass(frozen=True)
class RawRequest:
    """The parts of an HTTP request a signature covers, exactly as they arrived."""

    method: str
    path: str  # the raw (still percent-encoded) path, without the query string
    query: str  # the raw query string, without '?'
    headers: tuple[tuple[str, str], ...]  # in arrival order, repeated names kept
    body: bytes

    def values(self, name: str) -> list[str]:
        wanted = name.lower()
        return [value for key, value in self.headers if key.lower() == wanted]


@dataclass(frozen=True)
class Caller:
    """An authenticated caller and how it proved who it is."""

    identity: Identity
    scheme: Literal["sigv4", "bearer"]

    @property
    def principal(self) -> str:
        return self.identity.principal


@dataclass(frozen=True)
class Claim:
    """Who a request says it comes from, checked as far as its headers allow (not yet a Caller).

    A bearer key is checked in full from the headers; a Signature V4 also needs the body, whose hash it
    signs: `Authenticator.verify` finishes the check once the body has been read.
    """

    identity: Identity
    scheme: Literal["sigv4", "bearer"]
    signed: tuple[str, ...] = ()  # SigV4: the SignedHeaders, lower-cased
    signature: str = field(default="", repr=False)
    amz_date: str = ""

    @property
    def needs_body(self) -> bool:
        return self.scheme == "sigv4"


def _fail(error_type: type[ServingError], message: str, key_id: str | None = None) -> ServingError:
    error = error_type(message)
    error.key_id = key_id  # type: ignore[attr-defined]  # for the audit log: an access key id is not a secret
    return error


def _parse_authorization(value: str) -> dict[str, str]:
    parts = {}
    for item in value.split(","):
        key, _, val = item.strip().partition("=")
        parts[key.strip()] = val.strip()
    if not all(parts.get(k) for k in ("Credential", "SignedHeaders", "Signature")):
        raise _fail(
            InvalidSignatureError,
            "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' parameters.",
        )
    return parts


class Authenticator:
    """Turns a request's Authorization header into a Caller, or raises the AWS error for why not."""

    def __init__(
        self,
        identities: Identities,
        region: str,
        clock: Callable[[], float] = time.time,
        service: str = protocol.SIGNING_SERVICE,
    ) -> None:
        self.identities = identities
        self.region = region
        self.clock = clock
        self.service = service  # the signing name the credential scope must name
        # Here rather than at the top: only a verifier needs botocore (~150 ms to import), and the gateway makes
        # its verifiers when it loads an endpoint, so no request waits for the import.
        from serving.access._signer import expected_signature

        self._expected_signature = expected_signature

    def authenticate(self, request: RawRequest) -> Caller:
        """The caller of a request whose body has been read, or the AWS error for why not."""
        return self.verify(self.claim(request), request)

    def claim(self, request: RawRequest) -> Claim:
        """Every check the headers allow, before the body is read (`request.body` is not looked at).

        Bearer: the key is known. SigV4: the key id is known, the credential scope names this server's region,
        the service and the terminator, SignedHeaders include host and x-amz-date and name only headers the
        request has (and every target header it has), and X-Amz-Date is within the allowed skew.
        """
        values = request.values("authorization")
        if not values or not values[0].strip():
            raise _fail(
                MissingAuthenticationTokenError,
                "Missing Authentication Token: sign the request with AWS Signature Version 4 (as boto3 does) "
                "or send 'Authorization: Bearer <ApiKey>'.",
            )
        if len(values) > 1:
            raise _fail(
                InvalidSignatureError, "The request carries more than one Authorization header."
            )
        scheme, _, rest = values[0].strip().partition(" ")
        if scheme == ALGORITHM:
            return self._sigv4_claim(request, rest)
        if scheme.lower() == "bearer" and rest.strip():
            identity = self.identities.by_api_key(rest.strip())
            if identity is None:
                raise _fail(
                    UnrecognizedClientError, "The API key included in the request is invalid."
                )
            return Claim(identity, "bearer")
        raise _fail(
            MissingAuthenticationTokenError,
            f"Authorization header must use {ALGORITHM} (Signature Version 4) or 'Bearer <ApiKey>'.",
        )

    def verify(self, claim: Claim, request: RawRequest) -> Caller:
        """The Caller once what the headers could not prove holds: for SigV4, the body's hash and the signature."""
        if not claim.needs_body:
            return Caller(claim.identity, claim.scheme)
        key_id = claim.identity.access_key_id
        declared = request.values("x-amz-content-sha256")
        if declared and declared[0].strip() != hashlib.sha256(request.body).hexdigest():
            raise _fail(
                InvalidSignatureError,
                "The provided x-amz-content-sha256 header does not match what was computed.",
                key_id,
            )
        expected = self._signature(request, claim.identity, claim.signed, claim.amz_date)
        if not hmac.compare_digest(expected.encode(), claim.signature.encode()):
            raise _fail(
                InvalidSignatureError,
                "The request signature we calculated does not match the signature you provided. "
                "Check your AWS Secret Access Key and signing method.",
                key_id,
            )
        return Caller(claim.identity, "sigv4")

    def _sigv4_claim(self, request: RawRequest, authorization: str) -> Claim:
        parts = _parse_authorization(authorization)
        scope = parts["Credential"].split("/")
        if len(scope) != 5:
            raise _fail(
                InvalidSignatureError,
                "Credential must have the form <AccessKeyId>/<date>/<region>/<service>/aws4_request.",
            )
        key_id, scope_date, region, service, terminator = scope
        identity = self.identities.by_access_key_id(key_id)
        if identity is None or identity.secret_access_key is None:
            raise _fail(
                UnrecognizedClientError,
                "The security token included in the request is invalid.",
                key_id,
            )
        if region != self.region:
            raise _fail(
                InvalidSignatureError,
                f"Credential should be scoped to a valid region, not '{region}'; this server's region is '{self.region}'.",
                key_id,
            )
        if service != self.service:
            raise _fail(
                InvalidSignatureError,
                f"Credential should be scoped to correct service: '{self.service}'.",
                key_id,
            )
        if terminator != "aws4_request":
            raise _fail(
                InvalidSignatureError,
                f"Credential should be scoped with a valid terminator: 'aws4_request', not '{terminator}'.",
                key_id,
            )

        signed = [name.strip().lower() for name in parts["SignedHeaders"].split(";")]
        for required in ("host", "x-amz-date"):
            if required not in signed:
                raise _fail(
                    InvalidSignatureError, f"SignedHeaders must include '{required}'.", key_id
                )
        present = {name.lower() for name, _ in request.headers}
        for name in signed:
            if name not in present:
                raise _fail(
                    InvalidSignatureError,
                    f"Signed header '{name}' is missing from the request.",
                    key_id,
                )
        for name in _MUST_BE_SIGNED:
            if name in present and name not in signed:
                raise _fail(InvalidSignatureError, f"Header '{name}' must be signed.", key_id)

        amz_date = request.values("x-amz-date")[0].strip()
        self._check_time(amz_date, scope_date, key_id)
        return Claim(identity, "sigv4", tuple(signed), parts["Signature"], amz_date)

    def _check_time(self, amz_date: str, scope_date: str, key_id: str) -> None:
        signed_at = _amz_datetime(amz_date)
        if signed_at is None:
            raise _fail(
                InvalidSignatureError,
                f"X-Amz-Date '{amz_date}' is not in the form YYYYMMDD'T'HHMMSS'Z'.",
                key_id,
            )
        if scope_date != amz_date[:8]:
            raise _fail(
                InvalidSignatureError,
                f"Date in Credential scope does not match YYYYMMDD from X-Amz-Date: '{scope_date}' != '{amz_date[:8]}'.",
                key_id,
            )
        now = datetime.fromtimestamp(self.clock(), UTC)
        window = timedelta(seconds=MAX_SKEW_S)
        if signed_at < now - window:
            stamp = now.strftime(_AMZ_DATE)
            raise _fail(
                InvalidSignatureError,
                f"Signature expired: {amz_date} is now earlier than {(now - window).strftime(_AMZ_DATE)} ({stamp} - 5 min.)",
                key_id,
            )
        if signed_at > now + window:
            stamp = now.strftime(_AMZ_DATE)
            raise _fail(
                InvalidSignatureError,
                f"Signature not yet current: {amz_date} is still later than {(now + window).strftime(_AMZ_DATE)} ({stamp} + 5 min.)",
                key_id,
            )

    def _signature(
        self, request: RawRequest, identity: Identity, signed: Sequence[str], amz_date: str
    ) -> str:
        assert (
            identity.access_key_id and identity.secret_access_key
        )  # found by its access key id: a SigV4 identity
        return self._expected_signature(
            request.method,
            request.path,
            request.query,
            request.headers,
            request.body,
            access_key_id=identity.access_key_id,
            secret_access_key=identity.secret_access_key,
            service=self.service,
            region=self.region,
            signed=signed,
            amz_date=amz_date,
        )
