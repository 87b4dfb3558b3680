"""Secret values of a model's container `Environment`: sealed in the API's state, never described
back.

CreateModel callers put credentials in `Environment` (a MultiModel container's
`AWS_SECRET_ACCESS_KEY`, an API token for a feature store). The state must keep them (a restarted
server deploys the model again), but a copy of the state file, or a caller allowed only
DescribeModel, should not yield them. So a value whose variable's name says it is secret (`SECRET`,
`TOKEN`, `PASSWORD`, `CREDENTIAL`, `PRIVATE`, `API_KEY` ...) is stored encrypted (Fernet:
AES-128-CBC with HMAC-SHA256) under a key kept in its own private file beside the state, opened only
where a spec is built, and DescribeModel shows it as `MASK` (SageMaker shows it: a documented
difference).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

from serving.documents import ApiJson
from serving.private_files import PrivateFileError, open_private

__all__ = ["MASK", "Sealer", "is_secret"]

MASK = "********"
_SEALED = "sealed:v1:"
_SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY", re.IGNORECASE
)


def is_secret(name: str) -> bool:
    """Whether an Environment variable's name says its value is a secret."""
    return bool(_SECRET_NAME.search(name))


def _environments(document: Any) -> Iterator[dict[str, str]]:
    """Every container `Environment` mapping in a CreateModel request or a stored model (in
    place)."""
    if isinstance(document, dict):
        for key, value in document.items():
            if key == "Environment" and isinstance(value, dict):
                yield value
            else:
                yield from _environments(value)
    elif isinstance(document, list):
        for item in document:
            yield from _environments(item)


class Sealer:
    """Seals and opens secret Environment values with one key: the file `key_file` (made 0600 when
    missing), or a key of this process only when None (state in memory)."""

    def __init__(self, key_file: str | Path | None) -> None:
        self._fernet = Fernet(
            self._key(Path(key_file)) if key_file is not None else Fernet.generate_key()
        )

    @staticmethod
    def _key(path: Path) -> bytes:
        try:
            descriptor = open_private(path, os.O_RDWR | os.O_CREAT)
        except PrivateFileError as error:
            raise RuntimeError(f"the API's state key: {error}") from None
        with os.fdopen(descriptor, "r+b") as file:
            key = file.read().strip()
            if not key:
                key = Fernet.generate_key()
                file.write(key)
        return key

    def seal(self, document: Any) -> Any:
        """`document` (a request or model, JSON-like) with each secret value sealed, in place;
        returned."""
        for environment in _environments(document):
            for name, value in environment.items():
                if is_secret(name) and not value.startswith(_SEALED):
                    environment[name] = _SEALED + self._fernet.encrypt(value.encode()).decode()
        return document

    def opened(self, document: Mapping[str, Any]) -> ApiJson:
        """A deep copy of `document` with its sealed values in clear (what a container's spec
        needs)."""
        copy = _copy(document)
        for environment in _environments(copy):
            for name, value in environment.items():
                if value.startswith(_SEALED):
                    try:
                        environment[name] = self._fernet.decrypt(
                            value[len(_SEALED) :].encode()
                        ).decode()
                    except InvalidToken:
                        raise RuntimeError(
                            f"Environment.{name} was sealed with another key than this state's: the state's .key "
                            "file is missing or was replaced"
                        ) from None
        return copy


def masked(document: Mapping[str, Any]) -> ApiJson:
    """A deep copy of `document` with each sealed value shown as MASK (DescribeModel's answer)."""
    copy = _copy(document)
    for environment in _environments(copy):
        for name, value in environment.items():
            if value.startswith(_SEALED):
                environment[name] = MASK
    return copy


def _copy(document: Any) -> Any:
    if isinstance(document, dict):
        return {key: _copy(value) for key, value in document.items()}
    if isinstance(document, list):
        return [_copy(item) for item in document]
    return document
