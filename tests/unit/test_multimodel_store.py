"""serving.multimodel_store: TargetModel validation, local and S3 prefixes, the bounded disk cache,
single flight."""

from __future__ import annotations

import io
import os
import tarfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

from serving.errors import ValidationError
from serving.models.store import ModelStore, ModelStoreError, validate_target

KB = 1024


# moto stands in for S3 because no cloud is reachable from the tests; ThreadedMotoServer is a real
# HTTP server on a loopback port speaking the S3 API, so boto3 goes through its whole stack.
@pytest.fixture(scope="module")
def s3_endpoint() -> str:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Credentials through boto3's normal chain (environment), isolated from the host's AWS
    config."""
    for name in (
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "SERVING_S3_ENDPOINT_URL",
        "AWS_SESSION_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def s3_client(endpoint: str, **config):
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(**config) if config else None,
    )


@pytest.fixture
def bucket(s3_endpoint) -> str:
    name = f"models-{uuid.uuid4().hex[:12]}"
    s3_client(s3_endpoint).create_bucket(Bucket=name)
    return name


def archive_bytes(files: dict[str, bytes], extra=None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        if extra:
            extra(tar)
    return buffer.getvalue()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


SAGEMAKER_MODEL = {
    "model.joblib": b"weights",
    "code/inference.py": b"def model_fn(d):\n    return d\n",
}


# --- validate_target ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["customer-17.tar.gz", "team/a/model.tar.gz", "a%2F..%2Fb.tar.gz", "x" * 1024, "héllo/m.tgz"],
)
def test_valid_targets_pass_unchanged(target):
    assert validate_target(target) == target


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("../x", "'..'"),
        ("/etc/passwd", "absolute"),
        ("a/../../b", "'..'"),
        ("a//b", "empty path segment"),
        (".", "'.'"),
        ("a/./b.tar.gz", "'.'"),
        ("a/", "empty path segment"),
        ("", "empty"),
        ("a\\b.tar.gz", "backslash"),
        ("..\\..\\x", "backslash"),
        ("a\x00b", "control character"),
        ("a\nb", "control character"),
        ("s3://other-bucket/x.tar.gz", "URL scheme"),
        ("file:///etc/passwd", "URL scheme"),
        ("C:/x.tar.gz", "URL scheme"),
        ("y" * 1025, "at most 1024"),
    ],
)
def test_escaping_targets_are_refused_naming_target_and_reason(target, why):
    with pytest.raises(ValidationError) as caught:
        validate_target(target)
    assert why in caught.value.message
    assert repr(target[:100]) in caught.value.message


def test_fetch_validates_before_touching_the_store(tmp_path):
    store = ModelStore(str(write(tmp_path / "store" / "m.tar.gz", b"").parent), tmp_path / "cache")
    for target in ("../store/m.tar.gz", "/etc/passwd", "a/../../b", "a//b", ".", "..\\m.tar.gz"):
        with pytest.raises(ValidationError):
            store.fetch(target)
    assert store.cached_targets() == []


# --- local prefixes -------------------------------------------------------------------------------


def test_local_directory_model_is_used_as_is_without_download(tmp_path):
    write(tmp_path / "store" / "english" / "1" / "model.joblib", b"w")
    calls = []
    store = ModelStore(
        str(tmp_path / "store"), tmp_path / "cache", downloaded=lambda *args: calls.append(args)
    )
    path = store.fetch("english/1")
    assert path == (tmp_path / "store" / "english" / "1").resolve()
    assert calls == [("english/1", 0.0, 0)]
    assert list((tmp_path / "cache").iterdir()) == []  # nothing copied


def test_local_archive_with_code_is_extracted_into_the_cache_once(tmp_path):
    archive = write(tmp_path / "store" / "customer-17.tar.gz", archive_bytes(SAGEMAKER_MODEL))
    calls = []
    store = ModelStore(
        str(tmp_path / "store"), tmp_path / "cache", downloaded=lambda *args: calls.append(args)
    )
    path = store.fetch("customer-17.tar.gz")
    assert path.is_relative_to(tmp_path / "cache")
    assert (path / "model.joblib").read_bytes() == b"weights"
    assert (path / "code" / "inference.py").is_file()
    assert [(target, nbytes) for target, _, nbytes in calls] == [
        ("customer-17.tar.gz", archive.stat().st_size)
    ]
    # disk-cache hit: no new download
    assert store.fetch("customer-17.tar.gz") == path and len(calls) == 1
    assert store.cached_targets() == ["customer-17.tar.gz"]
    assert store.disk_bytes() >= len(b"weights")

    time.sleep(0.01)
    # replaced in place: fetched again
    write(archive, archive_bytes({"model.joblib": b"retrained"}))
    path = store.fetch("customer-17.tar.gz")
    assert (path / "model.joblib").read_bytes() == b"retrained" and not (path / "code").exists()
    assert len(calls) == 2


def test_file_url_prefix(tmp_path):
    write(tmp_path / "store" / "team" / "a" / "model.tar.gz", archive_bytes(SAGEMAKER_MODEL))
    store = ModelStore(f"file://{tmp_path / 'store'}", tmp_path / "cache")
    assert (store.fetch("team/a/model.tar.gz") / "code" / "inference.py").is_file()
    with pytest.raises(ValidationError, match="not found"):
        store.fetch("team/b/model.tar.gz")


def test_unknown_model_names_it_and_not_the_server_path(tmp_path):
    # Issue 41, finding 7f: the prefix is an absolute path of the server (a spec's ModelDataUrl is
    # resolved).
    (tmp_path / "store").mkdir()
    store = ModelStore(str(tmp_path / "store"), tmp_path / "cache")
    with pytest.raises(ValidationError) as caught:
        store.fetch("customer-99.tar.gz")
    assert (
        "'customer-99.tar.gz' not found under the container's model store" in caught.value.message
    )
    assert str(tmp_path) not in caught.value.message


def test_symlinks_leaving_the_prefix_are_refused(tmp_path):
    outside = tmp_path / "outside"
    write(outside / "secret" / "model.joblib", b"s")
    write(outside / "stolen.tar.gz", archive_bytes({"model.joblib": b"s"}))
    store_dir = tmp_path / "store"
    write(store_dir / "real" / "model.joblib", b"w")
    (store_dir / "link-dir").symlink_to(outside / "secret")
    (store_dir / "link.tar.gz").symlink_to(outside / "stolen.tar.gz")
    (store_dir / "nested").mkdir()
    (store_dir / "nested" / "up").symlink_to(tmp_path)
    (store_dir / "inside").symlink_to(store_dir / "real")
    store = ModelStore(str(store_dir), tmp_path / "cache")
    for target in ("link-dir", "link.tar.gz", "nested/up/outside/stolen.tar.gz"):
        with pytest.raises(ValidationError, match="outside the container's model store") as caught:
            store.fetch(target)
        assert str(tmp_path) not in caught.value.message
    # a link within the prefix is fine
    assert store.fetch("inside") == (store_dir / "real").resolve()
    assert store.cached_targets() == []


def escaping_member(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("../../escaped.txt")
    info.size = 1
    tar.addfile(info, io.BytesIO(b"x"))


def absolute_link(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("code/passwd")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    tar.addfile(info)


@pytest.mark.parametrize("member", [escaping_member, absolute_link])
def test_crafted_archive_is_refused_and_leaves_no_entry(tmp_path, member):
    write(tmp_path / "store" / "evil.tar.gz", archive_bytes({"model.joblib": b"w"}, extra=member))
    store = ModelStore(str(tmp_path / "store"), tmp_path / "cache")
    with pytest.raises(ValidationError, match="'evil.tar.gz' cannot be used") as caught:
        store.fetch("evil.tar.gz")
    assert str(tmp_path) not in caught.value.message
    assert (
        not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()
    )
    assert store.cached_targets() == [] and list((tmp_path / "cache").iterdir()) == []


def test_a_plain_file_is_not_a_model(tmp_path):
    write(tmp_path / "store" / "model.pkl", b"pickle bytes")
    store = ModelStore(str(tmp_path / "store"), tmp_path / "cache")
    with pytest.raises(ValidationError, match="neither a directory nor"):
        store.fetch("model.pkl")


def test_prefix_must_exist(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        ModelStore(str(tmp_path / "missing"), tmp_path / "cache")


# --- the disk cache -------------------------------------------------------------------------------


def incompressible(size: int) -> bytes:
    return os.urandom(size)


def test_disk_bound_evicts_least_recently_used(tmp_path):
    for name in "abcd":
        write(
            tmp_path / "store" / f"{name}.tar.gz",
            archive_bytes({"weights.bin": incompressible(100 * KB)}),
        )
    store = ModelStore(str(tmp_path / "store"), tmp_path / "cache", max_disk_bytes=250 * KB)
    a = store.fetch("a.tar.gz")
    store.fetch("b.tar.gz")
    store.fetch("a.tar.gz")  # a becomes most recently used
    store.fetch("c.tar.gz")  # over the bound: b goes
    assert store.cached_targets() == ["a.tar.gz", "c.tar.gz"]
    assert 200 * KB <= store.disk_bytes() <= 250 * KB
    assert (a / "weights.bin").is_file()
    assert len([p for p in (tmp_path / "cache").iterdir()]) == 2  # b's folder is gone from disk

    with store.hold("a.tar.gz") as held:  # in use: never evicted, even as least recently used
        store.fetch("c.tar.gz")
        store.fetch("d.tar.gz")
        assert (held / "weights.bin").is_file()
        assert store.cached_targets() == ["a.tar.gz", "d.tar.gz"]

    restarted = ModelStore(str(tmp_path / "store"), tmp_path / "cache", max_disk_bytes=250 * KB)
    assert restarted.cached_targets() == ["a.tar.gz", "d.tar.gz"]  # a restart keeps the LRU order


def test_a_model_bigger_than_the_bound_is_still_returned(tmp_path):
    write(tmp_path / "store" / "small.tar.gz", archive_bytes({"w": incompressible(10 * KB)}))
    write(tmp_path / "store" / "big.tar.gz", archive_bytes({"w": incompressible(100 * KB)}))
    store = ModelStore(str(tmp_path / "store"), tmp_path / "cache", max_disk_bytes=50 * KB)
    store.fetch("small.tar.gz")
    assert (store.fetch("big.tar.gz") / "w").stat().st_size == 100 * KB
    assert store.cached_targets() == ["big.tar.gz"]


def test_cache_names_do_not_collide_and_leftovers_are_cleaned(tmp_path):
    for target in ("a/b.tar.gz", "a_b.tar.gz"):  # same readable part once sanitized
        write(tmp_path / "store" / target, archive_bytes({"name": target.encode()}))
    cache = tmp_path / "cache"
    write(cache / ".staging-crashed" / "model" / "half", b"h")  # what a crash mid-download leaves
    store = ModelStore(str(tmp_path / "store"), cache)
    assert not (cache / ".staging-crashed").exists()
    first, second = store.fetch("a/b.tar.gz"), store.fetch("a_b.tar.gz")
    assert first != second
    assert (first / "name").read_bytes() == b"a/b.tar.gz" and (
        second / "name"
    ).read_bytes() == b"a_b.tar.gz"


def test_list_models_local(tmp_path):
    store_dir = tmp_path / "store"
    write(store_dir / "a.tar.gz", b"")
    write(store_dir / "team" / "a" / "model.tar.gz", b"")
    write(store_dir / "sk" / "model.joblib", b"")
    write(store_dir / "sk" / "code" / "inference.py", b"")  # part of sk, not a model of its own
    write(store_dir / "sk" / "inner.tar.gz", b"")  # likewise
    write(store_dir / "notes.txt", b"")  # a file at the top is no model
    write(store_dir / ".git" / "config", b"")
    (store_dir / "empty").mkdir()
    store = ModelStore(str(store_dir), tmp_path / "cache")
    assert store.list_models() == ["a.tar.gz", "sk", "team/a/model.tar.gz"]
    assert store.list_models(limit=2) == ["a.tar.gz", "sk"]


# --- S3 prefixes ----------------------------------------------------------------------------------


def test_s3_prefix_with_endpoint_url_and_credentials_chain(s3_endpoint, bucket, aws_env, tmp_path):
    client = s3_client(s3_endpoint)
    body = archive_bytes(SAGEMAKER_MODEL)
    client.put_object(Bucket=bucket, Key="mme/team/a/model.tar.gz", Body=body)
    client.put_object(Bucket=bucket, Key="mme/sk/model.joblib", Body=b"dir-weights")
    client.put_object(Bucket=bucket, Key="mme/sk/code/inference.py", Body=b"# hooks")
    client.put_object(Bucket=bucket, Key="other/x.tar.gz", Body=b"")  # outside the prefix
    calls = []
    store = ModelStore(
        f"s3://{bucket}/mme",
        tmp_path / "cache",
        s3_endpoint_url=s3_endpoint,
        downloaded=lambda *args: calls.append(args),
    )
    path = store.fetch("team/a/model.tar.gz")
    assert (path / "model.joblib").read_bytes() == b"weights" and (
        path / "code" / "inference.py"
    ).is_file()
    assert not (path.parent / "download").exists()  # the archive itself is not kept
    folder = store.fetch("sk")
    assert (folder / "model.joblib").read_bytes() == b"dir-weights" and (
        folder / "code" / "inference.py"
    ).is_file()
    assert [(target, nbytes) for target, _, nbytes in calls] == [
        ("team/a/model.tar.gz", len(body)),
        ("sk", 18),
    ]
    assert store.list_models() == ["sk", "team/a/model.tar.gz"]
    assert store.list_models(limit=1) == ["sk"]
    with pytest.raises(ValidationError, match=rf"'nope.tar.gz' not found under s3://{bucket}/mme"):
        store.fetch("nope.tar.gz")
    with pytest.raises(ValidationError, match="'missing-dir' not found"):
        store.fetch("missing-dir")


def test_s3_endpoint_from_environment(s3_endpoint, bucket, aws_env, monkeypatch, tmp_path):
    s3_client(s3_endpoint).put_object(Bucket=bucket, Key="m.tgz", Body=archive_bytes({"w": b"1"}))
    monkeypatch.setenv("SERVING_S3_ENDPOINT_URL", s3_endpoint)
    store = ModelStore(f"s3://{bucket}/", tmp_path / "cache")
    assert (store.fetch("m.tgz") / "w").read_bytes() == b"1"


def test_s3_object_escaping_its_folder_is_refused(s3_endpoint, bucket, tmp_path):
    client = s3_client(s3_endpoint)
    client.put_object(Bucket=bucket, Key="evil/model.joblib", Body=b"w")
    client.put_object(Bucket=bucket, Key="evil/a/../../../x", Body=b"x")
    store = ModelStore(f"s3://{bucket}", tmp_path / "cache", s3_client=client)
    with pytest.raises(ValidationError, match="leaves its folder"):
        store.fetch("evil")
    assert store.cached_targets() == []


def test_s3_target_must_be_a_model(s3_endpoint, bucket, tmp_path):
    # As list_models: a folder around a model, a part of a model or a hidden folder is no
    # TargetModel.
    client = s3_client(s3_endpoint)
    for key in (
        "secret/inner/model.joblib",
        "sk/model.joblib",
        "sk/code/inference.py",
        "sk/extra.tar.gz",
        ".hidden/model.joblib",
        "only-archives/a.tar.gz",
        "marker/",
        "echo/code/inference.py",
    ):
        client.put_object(
            Bucket=bucket, Key=key, Body=archive_bytes({"w": b"1"}) if key.endswith(".gz") else b"x"
        )
    client.put_object(Bucket=bucket, Key="marker/inner/model.joblib", Body=b"x")
    store = ModelStore(f"s3://{bucket}", tmp_path / "cache", s3_client=client)
    for target, why in [
        ("secret", "holds only folders or archives"),
        ("only-archives", "holds only folders"),
        ("marker", "holds only folders"),
        ("sk/code", "inside model 'sk'"),
        ("sk/extra.tar.gz", "inside model 'sk'"),
        (".hidden", "hidden"),
        ("echo/code", "inside model 'echo'"),
    ]:
        with pytest.raises(ValidationError, match=why) as caught:
            store.check(target)
        assert f"model {target!r}" in caught.value.message
    # echo: a handler only
    for target in ("secret/inner", "sk", "only-archives/a.tar.gz", "marker/inner", "echo"):
        store.check(target)
    assert store.list_models() == [
        "echo",
        "marker/inner",
        "only-archives/a.tar.gz",
        "secret/inner",
        "sk",
    ]


def test_s3_failures_name_bucket_and_key(s3_endpoint, tmp_path):
    unreachable = s3_client("http://127.0.0.1:9", retries={"max_attempts": 1}, connect_timeout=1)
    store = ModelStore("s3://models-down/mme/", tmp_path / "cache", s3_client=unreachable)
    with pytest.raises(ModelStoreError, match="s3://models-down/mme/m.tar.gz"):
        store.fetch("m.tar.gz")
    missing_bucket = ModelStore(
        "s3://no-such-bucket-here/", tmp_path / "cache", s3_client=s3_client(s3_endpoint)
    )
    with pytest.raises(ModelStoreError, match="NoSuchBucket"):
        missing_bucket.list_models()


def test_concurrent_fetch_of_one_s3_target_downloads_once(s3_endpoint, bucket, tmp_path):
    client = s3_client(s3_endpoint)
    client.put_object(
        Bucket=bucket, Key="hot.tar.gz", Body=archive_bytes({"w": incompressible(64 * KB)})
    )
    downloads = []

    def count_and_stall(**_):
        downloads.append(threading.get_ident())
        time.sleep(0.2)  # widen the window in which a second download would start

    client.meta.events.register("before-call.s3.GetObject", count_and_stall)
    store = ModelStore(f"s3://{bucket}", tmp_path / "cache", s3_client=client)
    start = threading.Barrier(8)

    def fetch(_):
        start.wait()
        return store.fetch("hot.tar.gz")

    with ThreadPoolExecutor(8) as pool:
        paths = set(pool.map(fetch, range(8)))
    assert len(downloads) == 1
    assert len(paths) == 1 and (paths.pop() / "w").stat().st_size == 64 * KB
