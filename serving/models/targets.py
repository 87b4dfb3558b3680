"""What a TargetModel may be: a relative path under the prefix that names a model, as
`list_models` lists them (an archive, or a folder that holds the model's files itself)."""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Iterable

from serving.errors import ValidationError
from serving.models.artifacts import ARCHIVE_SUFFIXES

MAX_TARGET_LENGTH = 1024


HANDLER = "code/inference.py"  # a folder holding only this is a model too (the python stack's)


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")  # also catches Windows drives (C:)


def validate_target(target: str) -> str:
    """Return `target` if it is a relative POSIX path that stays under the prefix; else
    ValidationError."""
    why = None
    if not isinstance(target, str) or not target:
        why = "it is empty"
    elif len(target) > MAX_TARGET_LENGTH:
        why = f"it is {len(target)} characters long (at most {MAX_TARGET_LENGTH})"
    elif any(unicodedata.category(char) in ("Cc", "Cs") for char in target):
        why = "it contains a control character or invalid Unicode"
    elif "\\" in target:
        why = "it contains a backslash"
    elif target.startswith("/"):
        why = "it is an absolute path"
    elif _SCHEME.match(target):
        why = "it starts with a URL scheme or drive"
    elif "" in (parts := target.split("/")):
        why = "it has an empty path segment"
    elif "." in parts or ".." in parts:
        why = "it has a '.' or '..' path segment"
    if why:
        raise ValidationError(f"TargetModel {_shown(target)} is invalid: {why}")
    return target


def _models_from_files(paths: Iterable[str]) -> list[str]:
    """TargetModels among relative file paths: folders directly holding files, and archives outside
    them."""
    files = []
    for path in paths:
        parts = path.split("/")
        if any(part.startswith(".") for part in parts):
            continue  # hidden files and folders (.git, .DS_Store) are never models
        try:
            files.append(validate_target(path))
        except ValidationError:
            continue
    holders = {path.rpartition("/")[0] for path in files if not path.endswith(ARCHIVE_SUFFIXES)}
    # a handler-only model
    holders |= {path[: -len(HANDLER) - 1] for path in files if path.endswith("/" + HANDLER)}
    holders -= {""}

    def within_model(path: str) -> bool:
        parts = path.split("/")
        return any("/".join(parts[:depth]) in holders for depth in range(1, len(parts)))

    folders = {folder for folder in holders if not within_model(folder)}
    archives = {
        path for path in files if path.endswith(ARCHIVE_SUFFIXES) and not within_model(path)
    }
    return sorted(folders | archives)


def _check_model(target: str, model_folder: bool | None, holder: Callable[[str], bool]) -> None:
    """Refuse a TargetModel that `list_models` would not list: hidden, a folder that is no model
    folder (`model_folder` None: an archive), or inside another model (a model folder up the
    path)."""
    parts = target.split("/")
    why = None
    if any(part.startswith(".") for part in parts):
        why = "hidden files and folders never are"
    elif model_folder is False:
        why = (
            "a folder TargetModel must hold the model's files itself (or its code/inference.py), and this one "
            "holds only folders or archives"
        )
    if why:
        raise ValidationError(f"model {_shown(target)} is not a model: {why}")
    for depth in range(1, len(parts)):
        ancestor = "/".join(parts[:depth])
        if holder(ancestor):
            raise ValidationError(
                f"model {_shown(target)} is inside model {_shown(ancestor)}: name that model"
            )


def _model_folder(names: Iterable[str], has_handler: bool) -> bool:
    """Whether a folder directly holding files `names` (and `code/inference.py` or not) is a model
    folder.

    Archives beside each other are models of their own, not files of their folder's model.
    """
    return has_handler or any(
        name and not name.startswith(".") and not name.endswith(ARCHIVE_SUFFIXES) for name in names
    )  # "": an S3 folder marker


def _file_names(folder: str) -> list[str]:
    with os.scandir(folder) as entries:
        return [entry.name for entry in entries if entry.is_file()]


def _not_found(target: str, prefix: str) -> ValidationError:
    return ValidationError(f"model {_shown(target)} not found under {shown_prefix(prefix)}")


def shown_prefix(prefix: str) -> str:
    """The model store as a caller may see it: an s3:// prefix is the spec's; a folder is a path of
    the server."""
    return prefix if prefix.startswith("s3://") else "the container's model store"


def _shown(target: object) -> str:
    if not isinstance(target, str) or len(target) <= 100:
        return repr(target)
    return repr(target[:100]) + "..."


def _inside(path: str, root: str) -> bool:
    return path != root and os.path.commonpath([path, root]) == root
