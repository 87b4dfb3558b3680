"""MultiModel model store: fetch a `TargetModel` from a model-store prefix into a bounded disk
cache.

A prefix is a local directory, `file:///abs/dir` or `s3://bucket/prefix/` (`sources`); what a
TargetModel may name is `targets`' rule. A directory is used as is (local) or downloaded (S3); an
archive is unpacked with `serving.models.artifacts`' checked extraction. This module only moves
bytes: nothing is unpickled or imported from a model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.errors import ValidationError
from serving.models.artifacts import ArtifactError
from serving.models.sources import ModelStoreError, _LocalSource, _S3Source
from serving.models.targets import (
    MAX_TARGET_LENGTH,
    _models_from_files,
    _shown,
    validate_target,
)

__all__ = [
    "MAX_TARGET_LENGTH",
    "DownloadObserver",
    "ModelStore",
    "ModelStoreError",
    "validate_target",
]

# `downloaded(target, seconds, nbytes)`: called once per fetch that was not a disk-cache hit.
DownloadObserver = Callable[[str, float, int], None]


_ENTRY_FILE = "entry.json"


_MODEL_DIR = "model"


_STAGING, _TRASH = ".staging-", ".trash-"


_log = logging.getLogger(__name__)


@dataclass
class _Entry:
    name: str
    version: str
    size: int


@dataclass
class _Slot:
    """Per-target single-flight lock and the number of fetches/holds using the target."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class ModelStore:
    """The models under one MultiModel container's prefix, fetched on demand into a bounded disk
    cache.

    Models live in `cache_dir/<safe-name>/model`, built in a hidden staging folder and renamed into
    place, so a crash never leaves a half model that looks whole. One ModelStore owns its
    `cache_dir`; processes must not share one.
    - An entry is current while its source is unchanged (same size/mtime/inode locally, same ETag on
      S3); a changed source is fetched again and replaces the entry.
    - After each install, least recently used entries are evicted until `disk_bytes() <=
      max_disk_bytes`, except entries whose target has a fetch in progress or is inside `hold()`; so
      a model bigger than the bound is still returned. A fetch in flight may overshoot the bound by
      its archive and its unpacked model.
    - A directory under a local prefix costs nothing to fetch and is never cached.
    """

    def __init__(
        self,
        prefix: str,
        cache_dir: Path,
        *,
        max_disk_bytes: int | None = None,
        s3_endpoint_url: str | None = None,
        s3_client: Any = None,
        downloaded: DownloadObserver | None = None,
    ) -> None:
        self.prefix = prefix
        self.cache_dir = Path(cache_dir)
        self.max_disk_bytes = max_disk_bytes
        self._downloaded = downloaded
        if prefix.startswith("s3://"):
            self._source: _LocalSource | _S3Source = _S3Source(prefix, s3_endpoint_url, s3_client)
        else:
            self._source = _LocalSource(prefix, self.cache_dir)
        self._lock = threading.Lock()  # guards _index and _slots
        self._index: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._slots: dict[str, _Slot] = {}
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._adopt_cache()

    def check(self, target: str) -> None:
        """Raise the error a fetch of `target` would (bad name, not found) without fetching it
        (blocking)."""
        validate_target(target)
        self._source.locate(target, self.prefix)

    def fetch(self, target: str) -> Path:
        """A local directory holding `target`'s model, downloaded and unpacked if needed
        (blocking)."""
        with self.hold(target) as path:
            return path

    @contextmanager
    def hold(self, target: str) -> Iterator[Path]:
        """Fetch `target` and keep its cache entry from eviction until the block ends (load it
        here)."""
        validate_target(target)
        with self._lock:
            slot = self._slots.setdefault(target, _Slot())
            slot.users += 1
        try:
            # single flight: a second fetch of the target waits and then hits the cache
            with slot.lock:
                path = self._fetch(target)
            yield path
        finally:
            with self._lock:
                slot.users -= 1
                if not slot.users:
                    del self._slots[target]

    def list_models(self, limit: int | None = None) -> list[str]:
        """TargetModel names under the prefix, sorted: archives, and folders that directly hold
        files."""
        models = _models_from_files(self._source.files())
        return models if limit is None else models[: max(limit, 0)]

    def disk_bytes(self) -> int:
        """Bytes the cached models take on disk."""
        with self._lock:
            return sum(entry.size for entry in self._index.values())

    def cached_targets(self) -> list[str]:
        """Targets in the disk cache, least recently used first."""
        with self._lock:
            return list(self._index)

    def _fetch(self, target: str) -> Path:
        located = self._source.locate(target, self.prefix)
        if located.directory is not None:
            self._report(target, 0.0, 0)
            return located.directory
        version = f"{self.prefix}|{located.version}"
        name = _safe_name(target)
        with self._lock:
            entry = self._index.get(target)
            if entry is not None and entry.version == version:
                self._index.move_to_end(target)
                _touch(self.cache_dir / name / _ENTRY_FILE)
                return self.cache_dir / name / _MODEL_DIR
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=_STAGING, dir=self.cache_dir))
        try:
            try:
                assert located.fill is not None  # a source gives a directory or a way to fill one
                nbytes = located.fill(staging / _MODEL_DIR)
            except ArtifactError as error:
                message = str(error).replace(str(self.cache_dir), "<cache>")
                raise ValidationError(f"model {_shown(target)} cannot be used: {message}") from None
            size = _tree_bytes(staging / _MODEL_DIR)
            (staging / _ENTRY_FILE).write_text(
                json.dumps({"target": target, "version": version, "size": size})
            )
            with self._lock:
                trash = [self._retire(name)]
                staging.rename(self.cache_dir / name)
                self._index[target] = _Entry(name, version, size)
                self._index.move_to_end(target)
                trash += self._evict()
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        for path in trash:
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
        self._report(target, time.monotonic() - started, nbytes)
        return self.cache_dir / name / _MODEL_DIR

    def _retire(self, name: str) -> Path | None:
        """Move an entry folder out of the way (atomically) so it can be deleted outside the
        lock."""
        current = self.cache_dir / name
        if not current.exists():
            return None
        trash = Path(tempfile.mkdtemp(prefix=_TRASH, dir=self.cache_dir))
        current.rename(trash / name)
        return trash

    def _evict(self) -> list[Path | None]:
        """Retire least-recently-used entries, skipping targets in use, until under the bound."""
        if self.max_disk_bytes is None:
            return []
        retired = []
        total = sum(entry.size for entry in self._index.values())
        for target, entry in list(self._index.items()):
            if total <= self.max_disk_bytes:
                break
            if target in self._slots:
                continue
            retired.append(self._retire(entry.name))
            del self._index[target]
            total -= entry.size
        return retired

    def _adopt_cache(self) -> None:
        """Index the complete entries a previous run left; delete its staging and trash
        leftovers."""
        found = []
        for child in self.cache_dir.iterdir():
            if child.name.startswith((_STAGING, _TRASH)):
                shutil.rmtree(child, ignore_errors=True)
                continue
            try:
                meta = json.loads((child / _ENTRY_FILE).read_text())
                if _safe_name(meta["target"]) == child.name and (child / _MODEL_DIR).is_dir():
                    stamp = (child / _ENTRY_FILE).stat().st_mtime_ns
                    found.append(
                        (
                            stamp,
                            meta["target"],
                            _Entry(child.name, meta["version"], int(meta["size"])),
                        )
                    )
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not ours: leave it alone
        for _, target, entry in sorted(found, key=lambda item: item[0]):
            self._index[target] = entry
        for path in self._evict():
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)

    def _report(self, target: str, seconds: float, nbytes: int) -> None:
        if self._downloaded is None:
            return
        try:
            self._downloaded(target, seconds, nbytes)
        except Exception:  # a metrics hook must not fail a fetch
            _log.exception("model download observer failed for %s", target)


def _safe_name(target: str) -> str:
    """A cache folder name unique per target: a readable part plus a hash of the exact target."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", target)[:64].strip("._-") or "model"
    return f"{readable}-{hashlib.sha256(target.encode('utf-8', 'surrogatepass')).hexdigest()[:24]}"


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, dirs, files in os.walk(root):
        total += sum(os.lstat(os.path.join(folder, name)).st_size for name in files)
    return total


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # only the restart order of the LRU depends on it
