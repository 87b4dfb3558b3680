"""IAM-style access policies: loading and evaluation (a document's validation: `policy_documents`).

Evaluation follows IAM: an explicit Deny wins, otherwise an Allow must match, otherwise the request
is denied. Case rules follow IAM too: action names are case-insensitive, resource ARNs and condition
values case-sensitive, condition keys case-insensitive.
No web framework and no Ray here: this module is pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypedDict

from pydantic import ValidationError as PydanticValidationError

from serving.access.policy_documents import (
    ACTION_INVOKE,
    ACTION_INVOKE_ASYNC,
    KEY_TARGET_CONTAINER,
    KEY_TARGET_MODEL,
    SET_PREFIXES,
    PolicyDocument,
    PolicyStatement,
)
from serving.documents import ApiJson, describe

__all__ = [
    "ACTION_INVOKE",
    "ACTION_INVOKE_ASYNC",
    "KEY_TARGET_CONTAINER",
    "KEY_TARGET_MODEL",
    "Decision",
    "Policy",
    "PolicyError",
    "RequestContext",
    "endpoint_arn",
    "evaluate",
    "glob_match",
    "load_policy",
    "parse_policy",
]


class PolicyError(ValueError):
    """A policy document that cannot be used; each line names the statement and field at fault."""


def endpoint_arn(region: str, account_id: str, endpoint: str) -> str:
    """The ARN policies match an endpoint by; SageMaker lower-cases endpoint names in ARNs."""
    return f"arn:aws:sagemaker:{region}:{account_id}:endpoint/{endpoint.lower()}"


# --- evaluation -------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _glob(pattern: str, ignore_case: bool = False) -> re.Pattern[str]:
    """`*` any run of characters, `?` exactly one; everything else literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(regex, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def glob_match(pattern: str, value: str, ignore_case: bool = False) -> bool:
    """Whether `value` matches the IAM wildcard `pattern` as a whole."""
    return _glob(pattern, ignore_case).fullmatch(value) is not None


def _arn_match(pattern: str, arn: str) -> bool:
    # ARNs match segment by segment (partition, service, region, account), then the
    # resource part as a whole, so a wildcard never spills across a segment boundary.
    if pattern == "*":
        return True
    want, have = pattern.split(":", 5), arn.split(":", 5)
    return len(want) == len(have) == 6 and all(glob_match(w, h) for w, h in zip(want, have))


@dataclass(frozen=True)
class RequestContext:
    """What one authorization question is about: an action on a resource, with condition keys."""

    action: str
    resource: str
    keys: Mapping[str, str]  # condition key -> value; a key that is absent is "missing"

    def value(self, key: str) -> str | None:
        wanted = key.lower()
        return next((v for k, v in self.keys.items() if k.lower() == wanted), None)


def _condition_holds(operator: str, values: list[str], present: str | None) -> bool:
    prefix = next((p for p in SET_PREFIXES if operator.startswith(p)), "")
    base = operator[len(prefix) :]
    negated = "Not" in base
    like = base.endswith("Like")

    def matches(value: str) -> bool:
        return any(glob_match(v, value) if like else v == value for v in values)

    if present is None:
        # IAM: a missing key fails positive operators and satisfies negated ones; ForAnyValue
        # over an empty set is false and ForAllValues over an empty set is (vacuously) true.
        if prefix == "ForAnyValue:":
            return False
        if prefix == "ForAllValues:":
            return True
        return negated
    # Our keys are single-valued, so the set forms reduce to the plain operator.
    return not matches(present) if negated else matches(present)


@dataclass(frozen=True)
class _Compiled:
    label: str
    effect: str
    statement: PolicyStatement

    def applies(self, request: RequestContext) -> bool:
        s = self.statement
        if s.Action is not None:
            action_ok = any(glob_match(p, request.action, ignore_case=True) for p in s.Action)
        else:
            action_ok = not any(
                glob_match(p, request.action, ignore_case=True) for p in s.NotAction or ()
            )
        if not action_ok:
            return False
        if s.Resource is not None:
            resource_ok = any(_arn_match(p, request.resource) for p in s.Resource)
        else:
            resource_ok = not any(_arn_match(p, request.resource) for p in s.NotResource or ())
        if not resource_ok:
            return False
        for operator, keys in (s.Condition or {}).items():
            for key, values in keys.items():
                if not _condition_holds(operator, values, request.value(key)):
                    return False
        return True


class Policy:
    """A validated policy document, ready to evaluate; `name` identifies it in audit logs."""

    def __init__(self, name: str, document: PolicyDocument) -> None:
        self.name = name
        self.document = document
        self._statements = tuple(
            _Compiled(f"{name}#{s.Sid or f'Statement[{i}]'}", s.Effect, s)
            for i, s in enumerate(document.Statement)
        )

    def matching(self, request: RequestContext) -> Iterable[_Compiled]:
        return (s for s in self._statements if s.applies(request))

    def to_record(self) -> PolicyRecord:
        """Plain data (name and document) to hand to another process."""
        return {"Name": self.name, "Document": self.document.model_dump(exclude_none=True)}

    def __repr__(self) -> str:
        return f"Policy({self.name!r}, {len(self._statements)} statements)"


class PolicyRecord(TypedDict):
    Name: str
    Document: ApiJson  # the IAM policy document, as PolicyDocument dumps it


@dataclass(frozen=True)
class Decision:
    """The outcome: allowed or not, and the statement that decided (None: no statement matched)."""

    allowed: bool
    statement: str | None

    @property
    def explicit(self) -> bool:
        return self.statement is not None


def evaluate(policies: Sequence[Policy], request: RequestContext) -> Decision:
    """IAM's rule: any matching Deny wins; else the first matching Allow; else an implicit deny."""
    allow = None
    for policy in policies:
        for statement in policy.matching(request):
            if statement.effect == "Deny":
                return Decision(False, statement.label)
            allow = allow or statement.label
    return Decision(allow is not None, allow)


# --- loading ----------------------------------------------------------------------------


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, object]:  # any JSON object
    keys = [key for key, _ in pairs]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise PolicyError(
            f"duplicate key {duplicates[0]!r} in one JSON object (a later value would hide an earlier one)"
        )
    return dict(pairs)


def parse_policy(document: Any, name: str = "policy") -> Policy:
    """Validate an already-parsed document; raises PolicyError naming each statement and field at
    fault."""
    if not isinstance(document, dict):
        raise PolicyError(
            "(document): a policy document must be a JSON object with Version and Statement"
        )
    try:
        return Policy(name, PolicyDocument.model_validate(document))
    except PydanticValidationError as error:
        raise PolicyError("\n".join(describe(error, "an identity policy"))) from None


def load_policy(path: str | Path, name: str | None = None) -> Policy:
    """Read and validate a JSON policy document."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise PolicyError(f"cannot read policy {path}: {error.strerror}") from None
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ValueError as error:
        if isinstance(error, PolicyError):
            raise
        raise PolicyError(f"not valid JSON: {error}") from None
    return parse_policy(document, name or path.name)
