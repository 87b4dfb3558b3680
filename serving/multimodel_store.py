"""MultiModel model store: fetch a `TargetModel` from a model-store prefix into a bounded disk cache.

A prefix is a local directory, `file:///abs/dir` or `s3://bucket/prefix/` (any S3-compatible
store). A TargetModel is a relative POSIX path under it naming a model, as `list_models` lists them:
an archive, or a folder that holds files (or `code/inference.py`) itself, not only folders (a folder
around a model is not one), neither inside another model nor hidden. A directory is used as is (local prefixes, never
copied) or downloaded (S3); a `.tar.gz`/`.tgz` archive is unpacked with `serving.modelstore`'s
checked extraction. Unpacked and downloaded models live in `cache_dir/<safe-name>/model`, built in
a hidden staging folder and renamed into place, so a crash never leaves a half model that looks whole.

Rules of the disk cache (one ModelStore owns its `cache_dir`; processes must not share one):
- An entry is current while its source is unchanged (same size/mtime/inode locally, same ETag on
  S3); a changed source is fetched again and replaces the entry.
- After each install, least-recently-used entries are evicted until `disk_bytes() <= max_disk_bytes`,
  except entries whose target has a fetch in progress or is inside `hold()`; so one model bigger
  than the bound is still returned. The bound holds between fetches: a fetch in flight may overshoot
  by its archive and its unpacked model.
- A fetch of a directory under a local prefix costs nothing and is never cached.

This module only moves bytes: nothing is unpickled or imported from a model.
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
import unicodedata
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator

from serving.errors import InternalFailureError, ValidationError
from serving.modelstore import ARCHIVE_SUFFIXES, ArtifactError, extract_archive

__all__ = ["MAX_TARGET_LENGTH", "DownloadObserver", "ModelStore", "ModelStoreError", "validate_target"]

MAX_TARGET_LENGTH = 1024
DownloadObserver = Callable[[str, float, int], None]
"""`downloaded(target, seconds, nbytes)`: called once per fetch that was not a disk-cache hit."""

HANDLER = "code/inference.py"  # a folder holding only this is a model too (the python stack's)
_ENTRY_FILE = "entry.json"
_MODEL_DIR = "model"
_STAGING, _TRASH = ".staging-", ".trash-"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")  # also catches Windows drives (C:)
_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_log = logging.getLogger(__name__)


class ModelStoreError(InternalFailureError):
    """The model store itself failed (S3 unreachable, access denied); names the bucket and key."""


def validate_target(target: str) -> str:
    """Return `target` if it is a relative POSIX path that stays under the prefix; else ValidationError."""
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


@dataclass(frozen=True)
class _Located:
    """Where a target's model comes from: a local folder used as is, or bytes to fill a staging folder."""

    directory: Path | None = None
    version: str = ""
    fill: Callable[[Path], int] | None = None  # writes the model into the folder; returns bytes moved


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
    """The models under one MultiModel container's prefix, fetched on demand into a bounded disk cache."""

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
        """Raise the error a fetch of `target` would (bad name, not found) without fetching it (blocking)."""
        validate_target(target)
        self._source.locate(target, self.prefix)

    def fetch(self, target: str) -> Path:
        """A local directory holding `target`'s model, downloaded and unpacked if needed (blocking)."""
        with self.hold(target) as path:
            return path

    @contextmanager
    def hold(self, target: str) -> Iterator[Path]:
        """Fetch `target` and keep its cache entry from eviction until the block ends (load it here)."""
        validate_target(target)
        with self._lock:
            slot = self._slots.setdefault(target, _Slot())
            slot.users += 1
        try:
            with slot.lock:  # single flight: a second fetch of the target waits and then hits the cache
                path = self._fetch(target)
            yield path
        finally:
            with self._lock:
                slot.users -= 1
                if not slot.users:
                    del self._slots[target]

    def list_models(self, limit: int | None = None) -> list[str]:
        """TargetModel names under the prefix, sorted: archives, and folders that directly hold files."""
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
                nbytes = located.fill(staging / _MODEL_DIR)
            except ArtifactError as error:
                message = str(error).replace(str(self.cache_dir), "<cache>")
                raise ValidationError(f"model {_shown(target)} cannot be used: {message}") from None
            size = _tree_bytes(staging / _MODEL_DIR)
            (staging / _ENTRY_FILE).write_text(json.dumps({"target": target, "version": version, "size": size}))
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
        """Move an entry folder out of the way (atomically) so it can be deleted outside the lock."""
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
        """Index the complete entries a previous run left; delete its staging and trash leftovers."""
        found = []
        for child in self.cache_dir.iterdir():
            if child.name.startswith((_STAGING, _TRASH)):
                shutil.rmtree(child, ignore_errors=True)
                continue
            try:
                meta = json.loads((child / _ENTRY_FILE).read_text())
                if _safe_name(meta["target"]) == child.name and (child / _MODEL_DIR).is_dir():
                    stamp = (child / _ENTRY_FILE).stat().st_mtime_ns
                    found.append((stamp, meta["target"], _Entry(child.name, meta["version"], int(meta["size"]))))
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


class _LocalSource:
    """A local directory prefix (plain path or file:// URL)."""

    def __init__(self, prefix: str, cache_dir: Path) -> None:
        root = prefix.removeprefix("file://")
        if prefix.startswith("file://") and not root.startswith("/"):
            raise ArtifactError(f"model-store prefix {prefix} is not a file:///absolute/path URL")
        if not os.path.isdir(root):
            raise ArtifactError(f"model-store prefix {prefix} is not a directory")
        self.real_root = os.path.realpath(root)
        self.real_cache = os.path.realpath(cache_dir)

    def locate(self, target: str, prefix: str) -> _Located:
        real = self._real(target)
        if not _inside(real, self.real_root):
            raise ValidationError(f"TargetModel {_shown(target)} resolves outside the model-store prefix {prefix}")
        if os.path.isdir(real):
            _check_model(target, self._holder(target), self._holder)
            return _Located(directory=Path(real))
        if not os.path.isfile(real):
            raise _not_found(target, prefix)
        if not target.endswith(ARCHIVE_SUFFIXES):
            raise ValidationError(f"model {_shown(target)} is neither a directory nor a .tar.gz/.tgz archive")
        _check_model(target, None, self._holder)
        stat = os.stat(real)

        def fill(folder: Path) -> int:
            extract_archive(Path(real), folder)
            return stat.st_size

        return _Located(version=f"file:{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}", fill=fill)

    def _real(self, relative: str) -> str:
        return os.path.realpath(os.path.join(self.real_root, *relative.split("/")))

    def _holder(self, folder: str) -> bool:
        real = self._real(folder)
        if not (_inside(real, self.real_root) and os.path.isdir(real)):
            return False
        return _model_folder(_file_names(real), os.path.isfile(os.path.join(real, *HANDLER.split("/"))))

    def files(self) -> Iterator[str]:
        for folder, dirs, files in os.walk(self.real_root):
            dirs[:] = [d for d in dirs if os.path.join(folder, d) != self.real_cache]
            for name in files:
                path = os.path.join(folder, name)
                if os.path.isfile(path) and _inside(os.path.realpath(path), self.real_root):
                    yield PurePosixPath(Path(path).relative_to(self.real_root)).as_posix()


class _S3Source:
    """An `s3://bucket/prefix/` on S3 or any S3-compatible store."""

    def __init__(self, prefix: str, endpoint_url: str | None, client: Any) -> None:
        bucket, _, key = prefix.removeprefix("s3://").partition("/")
        if not bucket:
            raise ArtifactError(f"model-store prefix {prefix} names no bucket")
        self.bucket = bucket
        self.key_prefix = key if not key or key.endswith("/") else key + "/"
        if client is None:
            import boto3  # only S3 prefixes need it

            # None lets boto3 apply AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 and its config files itself.
            endpoint_url = endpoint_url or os.environ.get("SERVING_S3_ENDPOINT_URL") or None
            client = boto3.session.Session().client("s3", endpoint_url=endpoint_url)
        self.client = client

    def locate(self, target: str, prefix: str) -> _Located:
        key = self.key_prefix + target
        if target.endswith(ARCHIVE_SUFFIXES):
            head = self._call("read", key, self.client.head_object, Bucket=self.bucket, Key=key)
            if head is None:
                raise _not_found(target, prefix)
            _check_model(target, None, self._holder)

            def fill(folder: Path) -> int:
                download = folder.parent / "download" / PurePosixPath(target).name
                nbytes = self._download(key, download)
                extract_archive(download, folder)
                shutil.rmtree(download.parent)
                return nbytes

            return _Located(version=f"s3:{head.get('ETag')}:{head.get('ContentLength')}", fill=fill)
        objects = [(obj["Key"][len(key) + 1 :], obj) for obj in self._list(key + "/") if not obj["Key"].endswith("/")]
        if not objects:
            raise _not_found(target, prefix)
        relatives = [relative for relative, _ in objects]
        _check_model(target, _model_folder([r for r in relatives if "/" not in r], HANDLER in relatives), self._holder)
        for relative, _ in objects:
            try:
                validate_target(relative)
            except ValidationError:
                raise ValidationError(f"model {_shown(target)} holds an object that leaves its folder: {_shown(relative)}") from None
        digest = hashlib.sha256(json.dumps([(rel, obj.get("ETag"), obj.get("Size")) for rel, obj in objects]).encode())

        def fill(folder: Path) -> int:
            return sum(self._download(key + "/" + relative, folder.joinpath(*relative.split("/"))) for relative, _ in objects)

        return _Located(version=f"s3dir:{digest.hexdigest()}", fill=fill)

    def _holder(self, folder: str) -> bool:
        key = self.key_prefix + folder + "/"
        if _model_folder((obj["Key"][len(key) :] for obj in self._list(key, delimiter="/")), False):
            return True
        handler = key + HANDLER
        return self._call("read", handler, self.client.head_object, Bucket=self.bucket, Key=handler) is not None

    def files(self) -> Iterator[str]:
        for obj in self._list(self.key_prefix):
            if not obj["Key"].endswith("/"):
                yield obj["Key"][len(self.key_prefix) :]

    def _list(self, key_prefix: str, delimiter: str | None = None) -> Iterator[dict]:
        """Objects under `key_prefix`; with delimiter="/" only those directly in that folder."""
        token: dict[str, str] = {"Delimiter": delimiter} if delimiter else {}
        while True:
            page = self._call("list", key_prefix, self.client.list_objects_v2, Bucket=self.bucket, Prefix=key_prefix,
                              **token)
            yield from (page or {}).get("Contents", [])
            if not (page or {}).get("IsTruncated"):
                return
            token["ContinuationToken"] = page["NextContinuationToken"]

    def _download(self, key: str, path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        response = self._call("download", key, self.client.get_object, Bucket=self.bucket, Key=key)
        if response is None:
            raise ModelStoreError(f"s3://{self.bucket}/{key} disappeared while it was being fetched")
        from botocore.exceptions import BotoCoreError

        try:
            with response["Body"] as body, open(path, "wb") as out:
                shutil.copyfileobj(body, out, 1 << 20)
        except (BotoCoreError, OSError) as error:
            raise ModelStoreError(f"cannot download s3://{self.bucket}/{key}: {error}") from None
        return path.stat().st_size

    def _call(self, what: str, key: str, method: Callable[..., dict], **arguments: Any) -> dict | None:
        """One S3 request; None when the key does not exist, ModelStoreError on any other failure."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return method(**arguments)
        except ClientError as error:
            info = error.response.get("Error", {})
            if info.get("Code") in _NOT_FOUND_CODES:
                return None
            detail = f"{info.get('Code')}: {info.get('Message')}"
        except BotoCoreError as error:
            detail = str(error)
        raise ModelStoreError(f"cannot {what} s3://{self.bucket}/{key}: {detail}")


def _models_from_files(paths: Iterable[str]) -> list[str]:
    """TargetModels among relative file paths: folders directly holding files, and archives outside them."""
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
    holders |= {path[: -len(HANDLER) - 1] for path in files if path.endswith("/" + HANDLER)}  # a handler-only model
    holders -= {""}

    def within_model(path: str) -> bool:
        parts = path.split("/")
        return any("/".join(parts[:depth]) in holders for depth in range(1, len(parts)))

    folders = {folder for folder in holders if not within_model(folder)}
    archives = {path for path in files if path.endswith(ARCHIVE_SUFFIXES) and not within_model(path)}
    return sorted(folders | archives)


def _check_model(target: str, model_folder: bool | None, holder: Callable[[str], bool]) -> None:
    """Refuse a TargetModel that `list_models` would not list: hidden, a folder that is no model folder
    (`model_folder` None: an archive), or inside another model (a model folder up the path)."""
    parts = target.split("/")
    why = None
    if any(part.startswith(".") for part in parts):
        why = "hidden files and folders never are"
    elif model_folder is False:
        why = ("a folder TargetModel must hold the model's files itself (or its code/inference.py), and this one "
               "holds only folders or archives")
    if why:
        raise ValidationError(f"model {_shown(target)} is not a model: {why}")
    for depth in range(1, len(parts)):
        ancestor = "/".join(parts[:depth])
        if holder(ancestor):
            raise ValidationError(f"model {_shown(target)} is inside model {_shown(ancestor)}: name that model")


def _model_folder(names: Iterable[str], has_handler: bool) -> bool:
    """Whether a folder directly holding files `names` (and `code/inference.py` or not) is a model folder.

    Archives beside each other are models of their own, not files of their folder's model.
    """
    return has_handler or any(name and not name.startswith(".") and not name.endswith(ARCHIVE_SUFFIXES)
                              for name in names)  # "": an S3 folder marker


def _file_names(folder: str) -> list[str]:
    with os.scandir(folder) as entries:
        return [entry.name for entry in entries if entry.is_file()]


def _safe_name(target: str) -> str:
    """A cache folder name unique per target: a readable part plus a hash of the exact target."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", target)[:64].strip("._-") or "model"
    return f"{readable}-{hashlib.sha256(target.encode('utf-8', 'surrogatepass')).hexdigest()[:24]}"


def _not_found(target: str, prefix: str) -> ValidationError:
    return ValidationError(f"model {_shown(target)} not found under {prefix}")


def _shown(target: object) -> str:
    if not isinstance(target, str) or len(target) <= 100:
        return repr(target)
    return repr(target[:100]) + "..."


def _inside(path: str, root: str) -> bool:
    return path != root and os.path.commonpath([path, root]) == root


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
