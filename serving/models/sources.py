"""Where a MultiModel prefix's models come from: a local directory or an S3-compatible bucket."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from serving import s3
from serving.errors import InternalFailureError, ValidationError
from serving.models.artifacts import ARCHIVE_SUFFIXES, ArtifactError, extract_archive
from serving.models.targets import (
    HANDLER,
    _check_model,
    _file_names,
    _inside,
    _model_folder,
    _not_found,
    _shown,
    shown_prefix,
    validate_target,
)
from serving.protocol import SUBMIT_DIRECTORY_ENV
from serving.runtimes import sourcedir

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


class ModelStoreError(InternalFailureError):
    """The model store itself failed (S3 unreachable, access denied); names the bucket and key."""


@dataclass(frozen=True)
class _Located:
    """Where a target's model comes from: a local folder used as is, or bytes to fill a staging
    folder."""

    directory: Path | None = None
    version: str = ""
    # writes the model into the folder; returns bytes moved
    fill: Callable[[Path], int] | None = None


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
            raise ValidationError(
                f"TargetModel {_shown(target)} resolves outside {shown_prefix(prefix)}"
            )
        if os.path.isdir(real):
            _check_model(target, self._holder(target), self._holder)
            return _Located(directory=Path(real))
        if not os.path.isfile(real):
            raise _not_found(target, prefix)
        if not target.endswith(ARCHIVE_SUFFIXES):
            raise ValidationError(
                f"model {_shown(target)} is neither a directory nor a .tar.gz/.tgz archive"
            )
        _check_model(target, None, self._holder)
        stat = os.stat(real)

        def fill(folder: Path) -> int:
            extract_archive(Path(real), folder)
            return stat.st_size

        return _Located(
            version=f"file:{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}", fill=fill
        )

    def _real(self, relative: str) -> str:
        return os.path.realpath(os.path.join(self.real_root, *relative.split("/")))

    def _holder(self, folder: str) -> bool:
        real = self._real(folder)
        if not (_inside(real, self.real_root) and os.path.isdir(real)):
            return False
        return _model_folder(
            _file_names(real), os.path.isfile(os.path.join(real, *HANDLER.split("/")))
        )

    def files(self) -> Iterator[str]:
        for folder, dirs, files in os.walk(self.real_root):
            dirs[:] = [d for d in dirs if os.path.join(folder, d) != self.real_cache]
            for name in files:
                path = os.path.join(folder, name)
                if os.path.isfile(path) and _inside(os.path.realpath(path), self.real_root):
                    yield PurePosixPath(Path(path).relative_to(self.real_root)).as_posix()


def fetch_archive(
    url: str,
    cache_root: Path,
    client: Any = None,
    what: str = "model data",
    max_bytes: int | None = None,
) -> Path:
    """A SingleModel's `s3://bucket/key.tar.gz` (`what`), downloaded and unpacked under
    `cache_root` (a folder per object version: its ETag; at most `max_bytes` unpacked), with the S3
    client of `s3.client_for` (credentials and endpoint from the container's environment). Raises
    ArtifactError / ModelStoreError saying which object and why."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    source = _S3Source(f"s3://{bucket}/", None, client)
    head = source._call("read", key, source.client.head_object, Bucket=bucket, Key=key)
    if head is None:
        raise ArtifactError(f"{what} {url} does not exist")
    version = hashlib.sha256(
        f"{url}|{head.get('ETag')}|{head.get('ContentLength')}".encode()
    ).hexdigest()[:16]
    target = cache_root / version
    if target.is_dir():
        return target
    download = cache_root / f"{version}.download" / PurePosixPath(key).name
    try:
        source._download(key, download)
        return extract_archive(download, target, max_bytes)
    finally:
        shutil.rmtree(download.parent, ignore_errors=True)


def fetch_submit_directory(url: str, cache_root: Path, client: Any = None) -> Path:
    """SAGEMAKER_SUBMIT_DIRECTORY's `s3://.../sourcedir.tar.gz`, downloaded and unpacked by its
    supervisor as a model's archive is, within `sourcedir.MAX_BYTES`: the folder its container
    process then loads the script from. ArtifactError naming the variable, the object and why."""
    try:
        s3.parse_s3_uri(url, SUBMIT_DIRECTORY_ENV)
        return fetch_archive(url, cache_root, client, "object", sourcedir.MAX_BYTES)
    except ValueError as error:  # a bad URI, or ArtifactError
        message = str(error)
    except ModelStoreError as error:
        message = error.message
    raise ArtifactError(
        message
        if message.startswith(SUBMIT_DIRECTORY_ENV)
        else f"{SUBMIT_DIRECTORY_ENV} {url!r}: {message}"
    )


class _S3Source:
    """An `s3://bucket/prefix/` on S3 or any S3-compatible store."""

    def __init__(self, prefix: str, endpoint_url: str | None, client: Any) -> None:
        bucket, _, key = prefix.removeprefix("s3://").partition("/")
        if not bucket:
            raise ArtifactError(f"model-store prefix {prefix} names no bucket")
        self.bucket = bucket
        self.key_prefix = key if not key or key.endswith("/") else key + "/"
        self.client = client if client is not None else s3.client(endpoint_url)

    def locate(self, target: str, prefix: str) -> _Located:
        key = self.key_prefix + target
        if target.endswith(ARCHIVE_SUFFIXES):
            head = self._call("read", key, self.client.head_object, Bucket=self.bucket, Key=key)
            if head is None:
                raise _not_found(target, prefix)
            _check_model(target, None, self._holder)

            def fill_archive(folder: Path) -> int:
                download = folder.parent / "download" / PurePosixPath(target).name
                nbytes = self._download(key, download)
                extract_archive(download, folder)
                shutil.rmtree(download.parent)
                return nbytes

            return _Located(
                version=f"s3:{head.get('ETag')}:{head.get('ContentLength')}", fill=fill_archive
            )
        objects = [
            (obj["Key"][len(key) + 1 :], obj)
            for obj in self._list(key + "/")
            if not obj["Key"].endswith("/")
        ]
        if not objects:
            raise _not_found(target, prefix)
        relatives = [relative for relative, _ in objects]
        _check_model(
            target,
            _model_folder([r for r in relatives if "/" not in r], HANDLER in relatives),
            self._holder,
        )
        for relative, _ in objects:
            try:
                validate_target(relative)
            except ValidationError:
                raise ValidationError(
                    f"model {_shown(target)} holds an object that leaves its folder: {_shown(relative)}"
                ) from None
        digest = hashlib.sha256(
            json.dumps([(rel, obj.get("ETag"), obj.get("Size")) for rel, obj in objects]).encode()
        )

        def fill_folder(folder: Path) -> int:
            return sum(
                self._download(key + "/" + relative, folder.joinpath(*relative.split("/")))
                for relative, _ in objects
            )

        return _Located(version=f"s3dir:{digest.hexdigest()}", fill=fill_folder)

    def _holder(self, folder: str) -> bool:
        key = self.key_prefix + folder + "/"
        if _model_folder((obj["Key"][len(key) :] for obj in self._list(key, delimiter="/")), False):
            return True
        handler = key + HANDLER
        return (
            self._call("read", handler, self.client.head_object, Bucket=self.bucket, Key=handler)
            is not None
        )

    def files(self) -> Iterator[str]:
        for obj in self._list(self.key_prefix):
            if not obj["Key"].endswith("/"):
                yield obj["Key"][len(self.key_prefix) :]

    def _list(self, key_prefix: str, delimiter: str | None = None) -> Iterator[dict]:
        """Objects under `key_prefix`; with delimiter="/" only those directly in that folder."""
        token: dict[str, str] = {"Delimiter": delimiter} if delimiter else {}
        while True:
            page = self._call(
                "list",
                key_prefix,
                self.client.list_objects_v2,
                Bucket=self.bucket,
                Prefix=key_prefix,
                **token,
            )
            yield from (page or {}).get("Contents", [])
            if page is None or not page.get("IsTruncated"):
                return
            token["ContinuationToken"] = page["NextContinuationToken"]

    def _download(self, key: str, path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        response = self._call("download", key, self.client.get_object, Bucket=self.bucket, Key=key)
        if response is None:
            raise ModelStoreError(
                f"s3://{self.bucket}/{key} disappeared while it was being fetched"
            )
        from botocore.exceptions import BotoCoreError

        try:
            with response["Body"] as body, open(path, "wb") as out:
                shutil.copyfileobj(body, out, 1 << 20)
        except (BotoCoreError, OSError) as error:
            raise ModelStoreError(f"cannot download s3://{self.bucket}/{key}: {error}") from None
        return path.stat().st_size

    def _call(
        self, what: str, key: str, method: Callable[..., dict], **arguments: Any
    ) -> dict | None:
        """One S3 request; None when the key does not exist, ModelStoreError on any other
        failure."""
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
