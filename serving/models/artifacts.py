"""Model artifacts: a directory or a SageMaker-style `model.tar.gz`, extracted safely (the rules
are `serving.archives`', shared with a script's `sourcedir.tar.gz`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from serving import protocol
from serving.archives import ARCHIVE_SUFFIXES, ArtifactError, extract_archive

__all__ = [
    "ARCHIVE_SUFFIXES",
    "TRAINED_ARCHIVE",
    "TRAINED_MANIFEST",
    "ArtifactError",
    "extract_archive",
    "materialize",
]

# A model version written by `serving train`: STORE/NAME/VERSION/ holds the archive and its
# description.
TRAINED_ARCHIVE = "model.tar.gz"
TRAINED_MANIFEST = "model.json"


def _cache_root() -> Path:
    return Path(
        os.environ.get(protocol.MODEL_CACHE_DIR_ENV)
        or Path(tempfile.gettempdir()) / "serving-models"
    )


def materialize(model_data: str | None) -> Path | None:
    """A local directory holding the model: the directory itself, or the archive (local or one S3
    object) unpacked."""
    if model_data is None:
        return None
    # SageMaker's usual model.tar.gz, fetched once per node and version
    if model_data.startswith("s3://"):
        from serving.models.sources import fetch_archive

        return fetch_archive(model_data, _cache_root())
    path = Path(model_data.removeprefix("file://"))
    if path.is_dir() and (path / TRAINED_ARCHIVE).is_file() and (path / TRAINED_MANIFEST).is_file():
        # a version of `serving train`'s store (or `latest`)
        path = Path(os.path.realpath(path / TRAINED_ARCHIVE))
    if path.is_dir():
        return path
    if not path.is_file():
        raise ArtifactError(f"model data {model_data} does not exist")
    if not path.name.endswith(ARCHIVE_SUFFIXES):
        raise ArtifactError(f"model data {model_data} is neither a directory nor a .tar.gz archive")
    stat = path.stat()
    key = hashlib.sha256(
        f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]
    target = _cache_root() / key
    if target.is_dir():
        return target
    return extract_archive(path, target)
