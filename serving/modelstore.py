"""Model artifacts: a directory or a SageMaker-style `model.tar.gz`, extracted safely.

Every member is checked first (no absolute paths, no `..`, no links leaving the
archive's folder, only files, folders and links), then extraction runs with
tarfile's `data` filter as a second line of defence, so a crafted archive cannot
write outside its own folder even on a Python whose filter has known bypasses.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

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
            for member in tar.getmembers():
                _check_member(member)
            tar.extractall(staging, filter="data")
    except (tarfile.TarError, OSError, ArtifactError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise ArtifactError(f"cannot safely extract {archive.name}: {error}") from None
    try:
        staging.rename(target)
    except OSError:  # another replica on this node won the race; use its copy
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _escapes(path: PurePosixPath) -> bool:
    return path.is_absolute() or ".." in path.parts


def _check_member(member: tarfile.TarInfo) -> None:
    """Refuse a member that could write or point outside the extraction folder."""
    name = PurePosixPath(member.name)
    if _escapes(PurePosixPath(*_normalize(name.parts))) or name.is_absolute():
        raise ArtifactError(f"member {member.name!r} leaves the archive's folder")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise ArtifactError(f"member {member.name!r} is not a regular file, folder or link")
    if member.issym():
        target = name.parent / member.linkname
        if PurePosixPath(member.linkname).is_absolute() or _escapes(PurePosixPath(*_normalize(target.parts))):
            raise ArtifactError(f"link {member.name!r} points outside the archive ({member.linkname})")
    if member.islnk() and _escapes(PurePosixPath(member.linkname)):
        raise ArtifactError(f"hard link {member.name!r} points outside the archive ({member.linkname})")


def _normalize(parts: tuple[str, ...]) -> list[str]:
    """Resolve `.` and `..` lexically; a `..` that climbs above the root stays, marking an escape."""
    out: list[str] = []
    for part in parts:
        if part in ("", "."):
            continue
        if part == ".." and out and out[-1] != "..":
            out.pop()
        else:
            out.append(part)
    return out or ["."]
