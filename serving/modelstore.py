"""Model artifacts: a directory or a SageMaker-style `model.tar.gz`, extracted safely.

Archives are unpacked with tarfile's `data` filter, which refuses absolute paths,
`..` components, links that point outside the target and device files, so a
crafted archive cannot write outside its own folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


class ArtifactError(ValueError):
    """A model artifact that cannot be used; the message says which and why."""


def _cache_root() -> Path:
    return Path(os.environ.get("SERVING_MODEL_CACHE_DIR") or Path(tempfile.gettempdir()) / "serving-models")


def materialize(model_data: str | None) -> Path | None:
    """A local directory holding the model: the directory itself, or the archive unpacked."""
    if model_data is None:
        return None
    path = Path(model_data.removeprefix("file://"))
    if path.is_dir():
        return path
    if not path.is_file():
        raise ArtifactError(f"model data {model_data} does not exist")
    if not path.name.endswith(ARCHIVE_SUFFIXES):
        raise ArtifactError(f"model data {model_data} is neither a directory nor a .tar.gz archive")
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = _cache_root() / key
    if target.is_dir():
        return target
    return extract_archive(path, target)


def extract_archive(archive: Path, target: Path) -> Path:
    """Unpack `archive` into `target` (atomically: a half-written folder is never used)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise ArtifactError(f"cannot safely extract {archive.name}: {error}") from None
    try:
        staging.rename(target)
    except OSError:  # another replica on this node won the race; use its copy
        shutil.rmtree(staging, ignore_errors=True)
    return target
