"""An IAM-style access-policy document as written: its vocabulary (actions, condition keys and
operators, versions) and its validation (pydantic). `policies` evaluates what this accepts.

A document is `{"Version", "Statement": [...]}` with `Effect`, `Action`/`NotAction`,
`Resource`/`NotResource` and an optional `Condition`, as in AWS IAM.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from serving.documents import Document

__all__ = [
    "ACTION_INVOKE",
    "ACTION_INVOKE_ASYNC",
    "CONDITION_KEYS",
    "KEY_TARGET_CONTAINER",
    "KEY_TARGET_MODEL",
    "OPERATORS",
    "SET_PREFIXES",
    "PolicyDocument",
    "PolicyStatement",
]

ACTION_INVOKE = "sagemaker:InvokeEndpoint"
ACTION_INVOKE_ASYNC = "sagemaker:InvokeEndpointAsync"
KEY_TARGET_CONTAINER = "sagemaker:TargetContainerHostname"
KEY_TARGET_MODEL = "sagemaker:TargetModel"
# Condition keys are matched case-insensitively, as IAM does.
CONDITION_KEYS = {key.lower(): key for key in (KEY_TARGET_CONTAINER, KEY_TARGET_MODEL)}
OPERATORS = ("StringEquals", "StringNotEquals", "StringLike", "StringNotLike")
SET_PREFIXES = ("ForAnyValue:", "ForAllValues:")
VERSIONS = ("2012-10-17", "2008-10-17")


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class PolicyStatement(Document):
    """One IAM statement; there is no Principal: the identity the document is attached to is the
    caller."""

    Sid: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,128}$",
        description="Optional statement id, shown in audit logs.",
    )
    Effect: Literal["Allow", "Deny"]
    Action: list[str] | None = Field(
        None, min_length=1, description="Actions this statement applies to."
    )
    NotAction: list[str] | None = Field(
        None, min_length=1, description="Applies to every action except these."
    )
    Resource: list[str] | None = Field(
        None, min_length=1, description="Endpoint ARNs (wildcards * and ?)."
    )
    NotResource: list[str] | None = Field(
        None, min_length=1, description="Applies to every resource except these."
    )
    Condition: dict[str, dict[str, list[str]]] | None = Field(
        None, description="Operator -> condition key -> values."
    )

    @field_validator("Action", "NotAction", "Resource", "NotResource", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("Condition", mode="before")
    @classmethod
    def _condition_values(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                op: {key: _as_list(v) for key, v in keys.items()}
                if isinstance(keys, dict)
                else keys
                for op, keys in value.items()
            }
        return value

    @field_validator("Action", "NotAction")
    @classmethod
    def _action_names(cls, actions: list[str] | None) -> list[str] | None:
        for action in actions or ():
            if action != "*" and not re.fullmatch(r"[A-Za-z0-9*?-]+:[A-Za-z0-9*?]+", action):
                raise ValueError(
                    f"{action!r} is not an action: use '*' or 'service:Action', e.g. {ACTION_INVOKE!r}"
                )
        return actions

    @field_validator("Resource", "NotResource")
    @classmethod
    def _resource_arns(cls, resources: list[str] | None) -> list[str] | None:
        for resource in resources or ():
            if resource != "*" and not (resource.startswith("arn:") and resource.count(":") >= 5):
                raise ValueError(
                    f"{resource!r} is not a resource: use '*' or an ARN such as "
                    "'arn:aws:sagemaker:us-east-1:000000000000:endpoint/my-endpoint'"
                )
        return resources

    @field_validator("Condition")
    @classmethod
    def _known_conditions(
        cls, condition: dict[str, dict[str, list[str]]] | None
    ) -> dict[str, dict[str, list[str]]] | None:
        for operator, keys in (condition or {}).items():
            base = next(
                (operator[len(p) :] for p in SET_PREFIXES if operator.startswith(p)), operator
            )
            if base not in OPERATORS:
                raise ValueError(
                    f"unsupported condition operator {operator!r}; supported: {', '.join(OPERATORS)} "
                    f"(optionally prefixed with {' or '.join(SET_PREFIXES)})"
                )
            if not keys:
                raise ValueError(f"{operator} names no condition key")
            for key, values in keys.items():
                if key.lower() not in CONDITION_KEYS:
                    raise ValueError(
                        f"{operator}: unsupported condition key {key!r}; supported: {', '.join(CONDITION_KEYS.values())}"
                    )
                if not values:
                    raise ValueError(f"{operator}.{key} lists no values")
        return condition

    @model_validator(mode="after")
    def _exactly_one(self) -> PolicyStatement:
        for name, negated in (("Action", "NotAction"), ("Resource", "NotResource")):
            if (getattr(self, name) is None) == (getattr(self, negated) is None):
                raise ValueError(f"exactly one of {name} or {negated} is required")
        return self


class PolicyDocument(Document):
    """An IAM-style identity policy document."""

    Version: Literal["2012-10-17", "2008-10-17"] = Field(
        "2012-10-17", description="Policy language version."
    )
    Id: str | None = Field(None, description="Optional document id.")
    Statement: list[PolicyStatement] = Field(
        min_length=1, description="One statement or a list of them."
    )

    @field_validator("Statement", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _unique_sids(self) -> PolicyDocument:
        seen: dict[str, int] = {}
        for index, statement in enumerate(self.Statement):
            if statement.Sid is not None:
                if statement.Sid in seen:
                    raise ValueError(
                        f"Statement[{index}].Sid {statement.Sid!r} duplicates Statement[{seen[statement.Sid]}]"
                    )
                seen[statement.Sid] = index
        return self
