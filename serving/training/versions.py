"""The model store `serving train` writes: STORE/NAME/VERSION/ (model.tar.gz + model.json),
STORE/NAME/latest.

A version is built in a hidden staging folder (`.VERSION.partial`) and renamed into place when
complete, then `latest` is re-pointed (a symlink replaced atomically), so a reader never sees half a
model and a killed run leaves only its staging folder, which `--resume` continues. Archives are
packed as SageMaker packs `model.tar.gz`: the model's files at the root, regular files only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from serving.models.artifacts import TRAINED_ARCHIVE, TRAINED_MANIFEST
from serving.training.recipe import RecipeError
from serving.training.run_records import TrainingRecord

__all__ = ["LATEST", "Version", "code_version", "open_version", "pack", "publish"]

LATEST = "latest"
RUNS = ".ray-train"  # Ray Train's storage (checkpoints) inside the store
_PARTIAL = re.compile(r"^\.(\d+)\.partial$")


@dataclass(frozen=True)
class Version:
    """One version being written: its number, its staging folder, and its Ray Train run's name and
    storage."""

    store: Path
    name: str
    number: int

    @property
    def staging(self) -> Path:
        return self.store / self.name / f".{self.number}.partial"

    @property
    def final(self) -> Path:
        return self.store / self.name / str(self.number)

    @property
    def run_name(self) -> str:
        return f"{self.name}-{self.number}"

    @property
    def runs(self) -> Path:
        return self.store / RUNS


def open_version(store: Path, name: str, resume: bool) -> Version:
    """The next version of `name` (or, with resume, the newest unfinished one)."""
    folder = store / name
    folder.mkdir(parents=True, exist_ok=True)
    numbers = [int(p.name) for p in folder.iterdir() if p.name.isdigit()]
    partial = [int(m.group(1)) for p in folder.iterdir() if (m := _PARTIAL.match(p.name))]
    if resume:
        if not partial:
            raise RecipeError(
                f"--resume: no unfinished run of {name} in {store} (nothing to resume)"
            )
        version = Version(store, name, max(partial))
        return version
    number = max(numbers + partial, default=0) + 1
    version = Version(store, name, number)
    version.staging.mkdir()
    return version


def pack(files: Path, archive: Path) -> None:
    """`files`' contents as a gzip tar with the files at its root (sorted, regular files and folders
    only)."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(files.rglob("*")):
            if path.is_symlink():
                continue
            tar.add(path, arcname=str(path.relative_to(files)), recursive=False)


def publish(version: Version, record: TrainingRecord) -> Path:
    """Write model.json, move the staging folder into place and point `latest` at it."""
    (version.staging / TRAINED_MANIFEST).write_text(
        json.dumps(record, indent=2, default=str) + "\n"
    )
    version.staging.rename(version.final)
    link = version.store / version.name / LATEST
    temporary = link.with_name(f".{LATEST}.{os.getpid()}")
    if temporary.is_symlink() or temporary.exists():
        temporary.unlink()
    temporary.symlink_to(str(version.number))
    os.replace(temporary, link)
    return version.final


def archive_path(version: Version, group: str | None = None) -> Path:
    return version.staging / (TRAINED_ARCHIVE if group is None else f"{group}.tar.gz")


def code_version() -> str:
    """The serving package's version, and the git commit when it runs from a checkout."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        shown = package_version("serving")
    except PackageNotFoundError:
        shown = "unknown"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{shown}+{commit}" if commit else shown
