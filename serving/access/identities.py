"""The identities file: who may call, with which credentials and policies (secrets stay in the
file)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import yaml
from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError

from serving.access.policies import Policy, PolicyError, load_policy
from serving.documents import Document, describe, document_path


class AccessReference(TypedDict):
    """Where a gateway finds an endpoint's identities: the file and the fingerprint validated at
    deploy (no secret)."""

    IdentitiesFile: str
    Fingerprint: str


class IdentitiesError(ValueError):
    """An identities file that cannot be used; each line names the entry and field at fault."""


class IdentityEntry(Document):
    """One caller: a principal name, its credentials and the policy documents attached to it.

    Its patterns run on Python's `re`: pydantic's default engine compiles a Unicode `\\w` repeated
    up to 128 times into ~20 MiB, paid by every process that imports this module (each gateway and
    replica).
    """

    model_config = ConfigDict(regex_engine="python-re")

    # `\Z`, not `$`: Python's `$` also matches before a trailing newline
    Principal: str = Field(pattern=r"^[\w+=,.@-]{1,64}\Z", description="Name shown in audit logs.")
    AccessKeyId: str | None = Field(
        None, pattern=r"^\w{16,128}\Z", description="Key id of a SigV4 caller (boto3)."
    )
    SecretAccessKey: SecretStr | None = Field(None, description="Secret of that key id.")
    ApiKey: SecretStr | None = Field(None, description="Bearer key of a caller that cannot sign.")
    PolicyDocuments: list[str] = Field(
        min_length=1,
        description="Policy JSON files, relative to the identities file (`~` expanded).",
    )

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


class IdentitiesDocument(Document):
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
                    raise ValueError(
                        f"Identities[{index}].{attribute} duplicates Identities[{seen[value]}]"
                    )
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

    def __init__(
        self, identities: Sequence[Identity], source: str = "", fingerprint: str = ""
    ) -> None:
        self.identities = tuple(identities)
        self.source = source
        # SHA-256 over the file and every policy it attaches, as read
        self.fingerprint = fingerprint
        self._by_key_id = {i.access_key_id: i for i in self.identities if i.access_key_id}

    def by_access_key_id(self, key_id: str) -> Identity | None:
        return self._by_key_id.get(key_id)

    def by_api_key(self, api_key: str) -> Identity | None:
        """The identity holding this bearer key; every stored digest is compared, in constant
        time."""
        presented, found = _digest(api_key), None
        for identity in self.identities:
            if identity.api_key_sha256 is not None and hmac.compare_digest(
                presented, identity.api_key_sha256
            ):
                found = identity
        return found

    def reference(self) -> AccessReference:
        """Where the gateway loads these identities itself: the file, and a fingerprint of what was
        validated.

        Never the identities themselves: secrets stay in the file, out of Ray's object store and
        actor state.
        """
        return {"IdentitiesFile": self.source, "Fingerprint": self.fingerprint}

    def __repr__(self) -> str:
        return f"Identities({[i.principal for i in self.identities]!r} from {self.source!r})"


def load_identities(path: str | Path) -> Identities:
    """Read an identities file and every policy it attaches; raises IdentitiesError naming what is
    wrong."""
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
        raise IdentitiesError("\n".join(describe(error, "an identities file"))) from None
    problems, identities, policies = [], [], {}
    fingerprint = hashlib.sha256(raw)
    for index, entry in enumerate(parsed.Identities):
        attached = []
        for position, reference in enumerate(entry.PolicyDocuments):
            location = document_path(reference, path.parent).resolve()
            try:
                if location not in policies:
                    policies[location] = load_policy(location, name=Path(reference).name)
                    fingerprint.update(
                        b"\0" + str(location).encode() + b"\0" + _read_quietly(location)
                    )
                attached.append(policies[location])
            except PolicyError as error:
                for line in str(error).splitlines():
                    problems.append(
                        f"Identities[{index}].PolicyDocuments[{position}] ({reference}): {line}"
                    )
        secret, api_key = entry.SecretAccessKey, entry.ApiKey
        identities.append(
            Identity(
                principal=entry.Principal,
                access_key_id=entry.AccessKeyId,
                secret_access_key=secret.get_secret_value() if secret else None,
                api_key_sha256=_digest(api_key.get_secret_value()) if api_key else None,
                policies=tuple(attached),
            )
        )
    if problems:
        raise IdentitiesError("\n".join(problems))
    return Identities(identities, str(path.resolve()), fingerprint.hexdigest())


def load_reference(reference: AccessReference) -> Identities:
    """Load identities the control plane validated (`Identities.reference`); refuse a file that
    changed since."""
    identities = load_identities(reference["IdentitiesFile"])
    if not hmac.compare_digest(identities.fingerprint, reference["Fingerprint"]):
        raise IdentitiesError(
            f"{Path(reference['IdentitiesFile']).name} or a policy it attaches changed after the "
            "endpoint was deployed; deploy the endpoint again to use the new version"
        )
    return identities


def _read_quietly(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


MIN_SECRET_CHARS = 16
