"""`SAGEMAKER_SUBMIT_DIRECTORY` as SageMaker's toolkits take it: a folder, or a `sourcedir.tar.gz`.

The SageMaker Python SDK uploads a script's folder as `sourcedir.tar.gz` and names it here; the
toolkits' `files.download_and_extract` unpacks it as the code folder (its members at the top, the
script among them). Here a local archive is unpacked for one load of one model into a private
folder of its own, by `serving.archives`' rules (no links, devices, absolute names or `..`; at most
`MAX_BYTES`), and removed when the model unloads. An `s3://` object is fetched and unpacked by the
container's supervisor before its process starts (that process has no network:
`models.sources.fetch_submit_directory`), which then names the unpacked folder instead.

Where a value points: `/opt/ml/model/...` maps to the model's folder, a relative path is relative to
it (MultiModel: each model's own), an absolute path is shared by every model (`file://` is a local
path).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from serving.archives import ArtifactError, extract_archive
from serving.private_files import private_folder

__all__ = ["MAX_BYTES", "SAGEMAKER_MODEL_DIR", "CodeFolder", "code_folder"]

# where SageMaker unpacks the model; a submit directory below it is the model's
SAGEMAKER_MODEL_DIR = "/opt/ml/model"
CODE_FOLDER = "code"
# What a script's archive may unpack to: code and the odd vendored package, not a model.
MAX_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class CodeFolder:
    """The folder a model's handler script is looked for in, and the private folder it was
    unpacked into (None: a folder used as it is)."""

    path: Path
    unpacked: Path | None = None

    def remove(self) -> None:
        """Delete what was unpacked for this load (nothing for a folder used as it is)."""
        if self.unpacked is not None:
            shutil.rmtree(self.unpacked, ignore_errors=True)


def code_folder(model_dir: Path | None, submit_directory: str | None) -> CodeFolder | None:
    """Where the handler script lies: the model's `code/` by default, else SAGEMAKER_SUBMIT_DIRECTORY
    (an archive unpacked). None when there is neither. ValueError naming the variable for a value
    that cannot be used."""
    if not submit_directory:
        return CodeFolder(model_dir / CODE_FOLDER) if model_dir is not None else None
    path = _local_path(model_dir, submit_directory)
    if not path.is_file():
        # a folder; one that does not exist is refused with the script it should hold
        return CodeFolder(path)
    unpacked = Path(tempfile.mkdtemp(prefix="sourcedir-", dir=_private_root()))
    try:
        folder = extract_archive(path, unpacked / CODE_FOLDER, max_bytes=MAX_BYTES)
    except ArtifactError as error:
        shutil.rmtree(unpacked, ignore_errors=True)
        raise ValueError(f"SAGEMAKER_SUBMIT_DIRECTORY {submit_directory!r}: {error}") from None
    return CodeFolder(folder, unpacked)


def _local_path(model_dir: Path | None, submit_directory: str) -> Path:
    value = submit_directory.removeprefix("file://")
    if value.startswith("s3://"):
        raise ValueError(
            f"SAGEMAKER_SUBMIT_DIRECTORY {submit_directory!r}: an s3:// sourcedir.tar.gz is fetched by the "
            "container's supervisor before its process starts, and this process was given no copy"
        )
    if "://" in value:
        raise ValueError(
            f"SAGEMAKER_SUBMIT_DIRECTORY {submit_directory!r}: only a local folder or .tar.gz, or an s3:// "
            "object, is supported"
        )
    if value == SAGEMAKER_MODEL_DIR or value.startswith(SAGEMAKER_MODEL_DIR + "/"):
        if model_dir is None:
            raise ValueError(
                f"SAGEMAKER_SUBMIT_DIRECTORY {submit_directory!r} is inside a model this container lacks"
            )
        return model_dir / value[len(SAGEMAKER_MODEL_DIR) :].lstrip("/")
    path = Path(value)
    if not path.is_absolute():
        if model_dir is None:
            raise ValueError(
                f"SAGEMAKER_SUBMIT_DIRECTORY {submit_directory!r} is relative to a model this container lacks"
            )
        path = model_dir / path
    return path


def _private_root() -> Path:
    """This user's folder of unpacked scripts, in the temporary folder (a container process's: its
    scratch folder), which no other user may write."""
    return private_folder(Path(tempfile.gettempdir()) / f"serving-sourcedir-{os.getuid()}")
