"""Who is calling: the identities file, AWS Signature Version 4 and bearer API keys.

SigV4 is verified by recomputing the signature with botocore's own signer over exactly
the headers the caller signed, so it matches what boto3 sends byte for byte; nothing
of the algorithm is re-implemented here. Secrets are compared in constant time, and
never logged or echoed. The request arrives as plain values (`RawRequest`): no web
framework is imported here.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import yaml
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError

from serving import protocol
from serving.errors import (
    InvalidSignatureError,
    MissingAuthenticationTokenError,
    ServingError,
    UnrecognizedClientError,
)
from serving.policies import Policy, PolicyError, describe_errors, load_policy, parse_policy

__all__ = ["Authenticator", "Caller", "Claim", "Identities", "IdentitiesError", "Identity", "RawRequest", "load_identities",
           "load_reference"]

SIGNING_SERVICE = "sagemaker"  # boto3 signs sagemaker-runtime requests for this service name
ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 300  # AWS accepts signatures made within 5 minutes of its own clock
MIN_SECRET_CHARS = 16
_AMZ_DATE = "%Y%m%dT%H%M%SZ"
# A request naming a target must have signed that name, or a replayed request could be retargeted.
_MUST_BE_SIGNED = (protocol.TARGET_CONTAINER.lower(), protocol.TARGET_MODEL.lower())


class IdentitiesError(ValueError):
    """An identities file that cannot be used; each line names the entry and field at fault."""


# --- the identities file ------------------------------------------------------------------

class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IdentityEntry(_Model):
    """One caller: a principal name, its credentials and the policy documents attached to it."""

    Principal: str = Field(pattern=r"^[\w+=,.@-]{1,64}$", description="Name shown in audit logs.")
    AccessKeyId: str | None = Field(None, pattern=r"^\w{16,128}$", description="Key id of a SigV4 caller (boto3).")
    SecretAccessKey: SecretStr | None = Field(None, description="Secret of that key id.")
    ApiKey: SecretStr | None = Field(None, description="Bearer key of a caller that cannot sign.")
    PolicyDocuments: list[str] = Field(min_length=1, description="Policy JSON files, relative to the identities file.")

    @field_validator("SecretAccessKey", "ApiKey")
    @classmethod
    def _long_enough(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is not None and len(secret.get_secret_value()) < MIN_SECRET_CHARS:
            raise ValueError(f"must be at least {MIN_SECRET_CHARS} characters")
        return secret

    @model_validator(mode="after")
    def _credentials(self) -> IdentityEntry:
        if (self.AccessKeyId is None) != (self.SecretAccessKey is None):
            raise ValueError("AccessKeyId and SecretAccessKey go together: give both or neither")
        if self.AccessKeyId is None and self.ApiKey is None:
            raise ValueError("give AccessKeyId and SecretAccessKey, or ApiKey (or both)")
        return self


class IdentitiesDocument(_Model):
    """The identities file: `Identities: [...]`."""

    Identities: list[IdentityEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> IdentitiesDocument:
        for attribute in ("Principal", "AccessKeyId", "ApiKey"):
            seen: dict[Any, int] = {}
            for index, entry in enumerate(self.Identities):
                value = getattr(entry, attribute)
                if isinstance(value, SecretStr):
                    value = value.get_secret_value()
                if value is None:
                    continue
                if value in seen:  # never repeat a secret in the message
                    raise ValueError(f"Identities[{index}].{attribute} duplicates Identities[{seen[value]}]")
                seen[value] = index
        return self


def _digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


@dataclass(frozen=True)
class Identity:
    """A caller the server knows, with the policies attached to it."""

    principal: str
    access_key_id: str | None
    secret_access_key: str | None = field(repr=False)
    api_key_sha256: str | None = field(repr=False)  # only a digest of the bearer key is kept
    policies: tuple[Policy, ...]


class Identities:
    """Every identity of an identities file, looked up by access key id or bearer key."""

    def __init__(self, identities: Sequence[Identity], source: str = "", fingerprint: str = "") -> None:
        self.identities = tuple(identities)
        self.source = source
        self.fingerprint = fingerprint  # SHA-256 over the file and every policy it attaches, as read
        self._by_key_id = {i.access_key_id: i for i in self.identities if i.access_key_id}

    def by_access_key_id(self, key_id: str) -> Identity | None:
        return self._by_key_id.get(key_id)

    def by_api_key(self, api_key: str) -> Identity | None:
        """The identity holding this bearer key; every stored digest is compared, in constant time."""
        presented, found = _digest(api_key), None
        for identity in self.identities:
            if identity.api_key_sha256 is not None and hmac.compare_digest(presented, identity.api_key_sha256):
                found = identity
        return found

    def reference(self) -> dict[str, str]:
        """Where the gateway loads these identities itself: the file, and a fingerprint of what was validated.

        Never the identities themselves: secrets stay in the file, out of Ray's object store and actor state.
        """
        return {"IdentitiesFile": self.source, "Fingerprint": self.fingerprint}

    def __repr__(self) -> str:
        return f"Identities({[i.principal for i in self.identities]!r} from {self.source!r})"


def load_identities(path: str | Path) -> Identities:
    """Read an identities file and every policy it attaches; raises IdentitiesError naming what is wrong."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        document = yaml.safe_load(raw)
    except OSError as error:
        raise IdentitiesError(f"cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise IdentitiesError(f"{path.name} is not valid YAML: {error}") from None
    if not isinstance(document, dict):
        raise IdentitiesError("(file): must be a mapping with Identities: [...]")
    try:
        parsed = IdentitiesDocument.model_validate(document)
    except PydanticValidationError as error:
        raise IdentitiesError("\n".join(describe_errors(error, "unknown field (not part of an identities file)"))) from None
    problems, identities, policies = [], [], {}
    fingerprint = hashlib.sha256(raw)
    for index, entry in enumerate(parsed.Identities):
        attached = []
        for position, reference in enumerate(entry.PolicyDocuments):
            location = (path.parent / reference).resolve()
            try:
                if location not in policies:
                    policies[location] = load_policy(location, name=Path(reference).name)
                    fingerprint.update(b"\0" + str(location).encode() + b"\0" + _read_quietly(location))
                attached.append(policies[location])
            except PolicyError as error:
                for line in str(error).splitlines():
                    problems.append(f"Identities[{index}].PolicyDocuments[{position}] ({reference}): {line}")
        secret, api_key = entry.SecretAccessKey, entry.ApiKey
        identities.append(Identity(
            principal=entry.Principal,
            access_key_id=entry.AccessKeyId,
            secret_access_key=secret.get_secret_value() if secret else None,
            api_key_sha256=_digest(api_key.get_secret_value()) if api_key else None,
            policies=tuple(attached),
        ))
    if problems:
        raise IdentitiesError("\n".join(problems))
    return Identities(identities, str(path.resolve()), fingerprint.hexdigest())


def load_reference(reference: dict[str, str]) -> Identities:
    """Load identities the control plane validated (`Identities.reference`); refuse a file that changed since."""
    identities = load_identities(reference["IdentitiesFile"])
    if not hmac.compare_digest(identities.fingerprint, reference["Fingerprint"]):
        raise IdentitiesError(f"{Path(reference['IdentitiesFile']).name} or a policy it attaches changed after the "
                              "endpoint was deployed; deploy the endpoint again to use the new version")
    return identities


def _read_quietly(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


# --- authentication -------------------------------------------------------------------------

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


class _Verifier(SigV4Auth):
    """botocore's signer, told to use exactly the headers the caller listed in SignedHeaders."""

    def __init__(self, credentials: Credentials, region: str, signed: Sequence[str]) -> None:
        super().__init__(credentials, SIGNING_SERVICE, region)
        self._signed = frozenset(signed)

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        headers = HTTPHeaders()
        for name, value in request.headers.items():
            if name.lower() in self._signed:
                headers[name.lower()] = value
        return headers


def _fail(error_type: type[ServingError], message: str, key_id: str | None = None) -> ServingError:
    error = error_type(message)
    error.key_id = key_id  # for the audit log: an access key id is not a secret
    return error


def _parse_authorization(value: str) -> dict[str, str]:
    parts = {}
    for item in value.split(","):
        key, _, val = item.strip().partition("=")
        parts[key.strip()] = val.strip()
    if not all(parts.get(k) for k in ("Credential", "SignedHeaders", "Signature")):
        raise _fail(InvalidSignatureError, "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' parameters.")
    return parts


class Authenticator:
    """Turns a request's Authorization header into a Caller, or raises the AWS error for why not."""

    def __init__(self, identities: Identities, region: str, clock: Callable[[], float] = time.time) -> None:
        self.identities = identities
        self.region = region
        self.clock = clock

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
            raise _fail(MissingAuthenticationTokenError,
                        "Missing Authentication Token: sign the request with AWS Signature Version 4 (as boto3 does) "
                        "or send 'Authorization: Bearer <ApiKey>'.")
        if len(values) > 1:
            raise _fail(InvalidSignatureError, "The request carries more than one Authorization header.")
        scheme, _, rest = values[0].strip().partition(" ")
        if scheme == ALGORITHM:
            return self._sigv4_claim(request, rest)
        if scheme.lower() == "bearer" and rest.strip():
            identity = self.identities.by_api_key(rest.strip())
            if identity is None:
                raise _fail(UnrecognizedClientError, "The API key included in the request is invalid.")
            return Claim(identity, "bearer")
        raise _fail(MissingAuthenticationTokenError,
                    f"Authorization header must use {ALGORITHM} (Signature Version 4) or 'Bearer <ApiKey>'.")

    def verify(self, claim: Claim, request: RawRequest) -> Caller:
        """The Caller once what the headers could not prove holds: for SigV4, the body's hash and the signature."""
        if not claim.needs_body:
            return Caller(claim.identity, claim.scheme)
        key_id = claim.identity.access_key_id
        declared = request.values("x-amz-content-sha256")
        if declared and declared[0].strip() != hashlib.sha256(request.body).hexdigest():
            raise _fail(InvalidSignatureError,
                        "The provided x-amz-content-sha256 header does not match what was computed.", key_id)
        expected = self._signature(request, claim.identity, claim.signed, claim.amz_date)
        if not hmac.compare_digest(expected.encode(), claim.signature.encode()):
            raise _fail(InvalidSignatureError,
                        "The request signature we calculated does not match the signature you provided. "
                        "Check your AWS Secret Access Key and signing method.", key_id)
        return Caller(claim.identity, "sigv4")

    def _sigv4_claim(self, request: RawRequest, authorization: str) -> Claim:
        parts = _parse_authorization(authorization)
        scope = parts["Credential"].split("/")
        if len(scope) != 5:
            raise _fail(InvalidSignatureError, "Credential must have the form <AccessKeyId>/<date>/<region>/<service>/aws4_request.")
        key_id, scope_date, region, service, terminator = scope
        identity = self.identities.by_access_key_id(key_id)
        if identity is None or identity.secret_access_key is None:
            raise _fail(UnrecognizedClientError, "The security token included in the request is invalid.", key_id)
        if region != self.region:
            raise _fail(InvalidSignatureError,
                        f"Credential should be scoped to a valid region, not '{region}'; this server's region is '{self.region}'.", key_id)
        if service != SIGNING_SERVICE:
            raise _fail(InvalidSignatureError, f"Credential should be scoped to correct service: '{SIGNING_SERVICE}'.", key_id)
        if terminator != "aws4_request":
            raise _fail(InvalidSignatureError, f"Credential should be scoped with a valid terminator: 'aws4_request', not '{terminator}'.", key_id)

        signed = [name.strip().lower() for name in parts["SignedHeaders"].split(";")]
        for required in ("host", "x-amz-date"):
            if required not in signed:
                raise _fail(InvalidSignatureError, f"SignedHeaders must include '{required}'.", key_id)
        present = {name.lower() for name, _ in request.headers}
        for name in signed:
            if name not in present:
                raise _fail(InvalidSignatureError, f"Signed header '{name}' is missing from the request.", key_id)
        for name in _MUST_BE_SIGNED:
            if name in present and name not in signed:
                raise _fail(InvalidSignatureError, f"Header '{name}' must be signed.", key_id)

        amz_date = request.values("x-amz-date")[0].strip()
        self._check_time(amz_date, scope_date, key_id)
        return Claim(identity, "sigv4", tuple(signed), parts["Signature"], amz_date)

    def _check_time(self, amz_date: str, scope_date: str, key_id: str) -> None:
        try:
            signed_at = datetime.strptime(amz_date, _AMZ_DATE).replace(tzinfo=timezone.utc)
        except ValueError:
            raise _fail(InvalidSignatureError, f"X-Amz-Date '{amz_date}' is not in the form YYYYMMDD'T'HHMMSS'Z'.", key_id) from None
        if scope_date != amz_date[:8]:
            raise _fail(InvalidSignatureError,
                        f"Date in Credential scope does not match YYYYMMDD from X-Amz-Date: '{scope_date}' != '{amz_date[:8]}'.", key_id)
        now = datetime.fromtimestamp(self.clock(), timezone.utc)
        window = timedelta(seconds=MAX_SKEW_S)
        stamp = now.strftime(_AMZ_DATE)
        if signed_at < now - window:
            raise _fail(InvalidSignatureError,
                        f"Signature expired: {amz_date} is now earlier than {(now - window).strftime(_AMZ_DATE)} ({stamp} - 5 min.)", key_id)
        if signed_at > now + window:
            raise _fail(InvalidSignatureError,
                        f"Signature not yet current: {amz_date} is still later than {(now + window).strftime(_AMZ_DATE)} ({stamp} + 5 min.)", key_id)

    def _signature(self, request: RawRequest, identity: Identity, signed: Sequence[str], amz_date: str) -> str:
        # Only the path and query of the URL enter the canonical request; the scheme is http so that
        # botocore hashes the payload (it always signs payloads over plain HTTP, as boto3 does).
        url = f"http://signed.invalid{request.path}" + (f"?{request.query}" if request.query else "")
        aws_request = AWSRequest(method=request.method, url=url, data=request.body)
        for name, value in request.headers:
            if name.lower() in signed:
                aws_request.headers[name] = value  # HTTPHeaders appends: repeated headers are kept
        aws_request.context["timestamp"] = amz_date
        verifier = _Verifier(Credentials(identity.access_key_id, identity.secret_access_key), self.region, signed)
        canonical = verifier.canonical_request(aws_request)
        return verifier.signature(verifier.string_to_sign(aws_request, canonical), aws_request)
