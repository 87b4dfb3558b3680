"""What every config document users write shares: the endpoint spec, the identities file, the policy
documents.

- One strict pydantic base (`Document`): unknown fields are refused, a validated document is
  immutable.
- One message shape (`describe`): a line `path: message` per problem, the path spelled as in the
  document (`Containers[1].ContainerHostname`, `Statement[0].Effect`), an unknown field said to be
  no part of that document.
- One path rule (`document_path`): a path written in a document has `~` expanded and is relative to
  the document's folder, which the loader passes as validation context (`context={"base_dir":
  folder}`).
- Names for JSON whose shape a model elsewhere owns: `ApiJson` (an AWS JSON-protocol request before
  its input model checks it, an answer, a request kept as sent) and `SpecJson` (a spec document
  before it is parsed).

Pure and light: loading a spec must not pay for the request path (no botocore, no NumPy, no Ray).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo

__all__ = [
    "BASE_DIR",
    "ApiJson",
    "Document",
    "SpecJson",
    "Rewrite",
    "describe",
    "document_path",
    "field_path",
    "folder_of",
]

# the validation-context key holding the folder of the document being validated
BASE_DIR = "base_dir"

# An operation's request body or answer on an AWS JSON protocol (SageMaker, Application Auto
# Scaling, CloudWatch), or one of their request shapes kept as sent: open by design, its shape is
# AWS's, checked by an input model.
ApiJson = dict[str, Any]
# An endpoint spec, or part of one, as JSON before `config.spec.parse_spec` validates it (the API
# builds them).
SpecJson = dict[str, Any]


class Document(BaseModel):
    """Base of every document model: unknown fields are refused and a validated document is
    frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# Given one of pydantic's error items, the message to show instead of pydantic's own (None: keep
# it).
Rewrite = Callable[[Mapping[str, Any]], "str | None"]


def field_path(loc: Sequence[Any], root: str = "(document)") -> str:
    """`('Statement', 1, 'Effect')` -> `Statement[1].Effect` (pydantic's internal steps left out);
    `root` when the problem is with the document as a whole."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif str(part).startswith(("function-", "constrained-")):
            continue
        else:
            path += f".{part}" if path else str(part)
    return path or root


def describe(
    error: ValidationError,
    document: str,
    *,
    root: str = "(document)",
    rewrite: Rewrite | None = None,
) -> list[str]:
    """One `path: message` line per problem (a message of several lines gives a line each, all with
    its path).

    `document` names the document in the message for an unknown field ("the endpoint spec"). Input
    values are never echoed (they may be secrets) unless `rewrite` puts one in a message of its own.
    """
    lines: list[str] = []
    for item in error.errors(include_url=False):
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = f"unknown field (not part of {document})"
        elif rewrite is not None:
            message = rewrite(item) or message
        lines.extend(f"{field_path(item['loc'], root)}: {line}" for line in message.splitlines())
    return lines


def document_path(value: str | Path, base_dir: str | Path | None) -> Path:
    """A path written in a document: `~` expanded, then relative to the document's folder `base_dir`
    (None: left relative, to the working directory). Not resolved: callers check existence and
    resolve as they need."""
    path = Path(value).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path


def folder_of(info: ValidationInfo) -> str | None:
    """The folder of the document a validator is looking at, as its loader passed it (`BASE_DIR`),
    or None."""
    return (info.context or {}).get(BASE_DIR)
