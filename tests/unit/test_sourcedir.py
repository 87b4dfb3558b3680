"""SAGEMAKER_SUBMIT_DIRECTORY as a `sourcedir.tar.gz`, the archive the SageMaker Python SDK uploads
(its members at the top, as `files.download_and_extract` of AWS's toolkits expects): a local one
unpacked for each load and removed with it, an `s3://` one fetched and unpacked by the container's
supervisor (moto's S3 server on loopback: no cloud is reachable from the tests), each model's own in
a MultiModel container, and hostile archives refused with an error naming the variable.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import tarfile
import tempfile
from pathlib import Path

import boto3
import pytest

from serving.model_server.container_config import ContainerConfig, ContainerStartError
from serving.model_server.supervisor import ContainerProcess
from serving.models.multimodel import MultiModelHandler
from serving.runtimes import InvocationContext

ENTRY = """
import os
from helper import factor
def model_fn(model_dir):
    return float(open(os.path.join(model_dir, 'weight.txt')).read())
def predict_fn(data, model):
    return [x * model * factor for x in data]
"""


def script(factor: int) -> dict[str, bytes]:
    return {"entry.py": ENTRY.encode(), "helper.py": f"factor = {factor}\n".encode()}


def pack(path: Path, files: dict[str, bytes], *special: tarfile.TarInfo) -> Path:
    """A `sourcedir.tar.gz` of `files` (regular members) and any `special` members as given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for info in special:
            tar.addfile(info)
    return path


def model(folder: Path, weight: str, files: dict[str, bytes] | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "weight.txt").write_text(weight)
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)
    return folder


def answer(runtime, body: bytes = b"[1, 2]") -> list:
    out, _ = runtime.invoke(body, "application/json", None, InvocationContext.for_request({}))
    return json.loads(out)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch) -> Path:
    """This test's own temporary folder, as a container process's is its scratch folder."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def unpacked_folders(private_tmp: Path) -> list[Path]:
    root = next(private_tmp.glob("serving-sourcedir-*"), None)
    return sorted(root.iterdir()) if root is not None else []


def test_a_local_sourcedir_answers_as_its_folder_would_unpacked_once_per_load(
    tmp_path: Path, private_tmp: Path, loaded
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    for name, data in script(10).items():
        (shared / name).write_bytes(data)
    archive = pack(tmp_path / "sourcedir.tar.gz", script(10))
    weights = model(tmp_path / "model", "0.5")
    program = {"SAGEMAKER_PROGRAM": "entry.py"}
    as_folder = loaded("python", weights, {**program, "SAGEMAKER_SUBMIT_DIRECTORY": str(shared)})
    as_archive = loaded(
        "python", weights, {**program, "SAGEMAKER_SUBMIT_DIRECTORY": f"file://{archive}"}
    )
    assert answer(as_archive) == answer(as_folder) == [5.0, 10.0]
    # unpacked into a private folder of its own (0700), kept while the model is loaded
    [first] = unpacked_folders(private_tmp)
    assert first.stat().st_mode & 0o077 == 0
    again = loaded("python", weights, {**program, "SAGEMAKER_SUBMIT_DIRECTORY": str(archive)})
    assert len(unpacked_folders(private_tmp)) == 2
    as_archive.unload()
    again.unload()
    assert unpacked_folders(private_tmp) == []


def test_a_relative_sourcedir_is_the_models_own(tmp_path: Path, private_tmp: Path, loaded) -> None:
    weights = model(tmp_path / "model", "2")
    pack(weights / "sourcedir.tar.gz", script(3))
    for value in ("sourcedir.tar.gz", "/opt/ml/model/sourcedir.tar.gz"):
        environment = {"SAGEMAKER_PROGRAM": "entry", "SAGEMAKER_SUBMIT_DIRECTORY": value}
        assert answer(loaded("python", weights, environment)) == [6.0, 12.0]


def test_each_multimodel_model_loads_its_own_sourcedir(tmp_path: Path, private_tmp: Path) -> None:
    prefix = tmp_path / "prefix"
    for name, weight, factor in (("a", "1", 2), ("b", "1", 3)):
        pack(model(prefix / name, weight) / "sourcedir.tar.gz", script(factor))
    environment = {
        "SAGEMAKER_PROGRAM": "entry.py",
        "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/sourcedir.tar.gz",
    }
    handler = MultiModelHandler("python", str(prefix), environment, hostname="mm", max_models=1)

    async def invoke(target: str) -> list:
        out, _ = await handler.ainvoke(
            b"[1]", "application/json", None, InvocationContext(target_model=target)
        )
        return json.loads(out)

    async def scenario() -> None:
        # each model's helper.py, never the other's; with room for one, b's load evicts a
        assert await invoke("a") == [2.0]
        assert await invoke("b") == [3.0]
        assert await invoke("a") == [2.0]

    try:
        asyncio.run(scenario())
        # an evicted model's unpacked script went with it
        assert len(unpacked_folders(private_tmp)) == 1
    finally:
        handler.close()


def _member(name: str, kind: bytes, linkname: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, size
    return info


@pytest.mark.parametrize(
    ("special", "reason"),
    [
        (_member("../escape.py", tarfile.REGTYPE), r"member '\.\./escape\.py' climbs out"),
        (_member("/tmp/absolute.py", tarfile.REGTYPE), "a member has an absolute name"),
        (_member("helper2.py", tarfile.SYMTYPE, "/etc/passwd"), "is a symbolic link"),
        (_member("inside.py", tarfile.SYMTYPE, "../../outside"), "is a symbolic link"),
        (_member("hard.py", tarfile.LNKTYPE, "/etc/passwd"), "is a hard link"),
        (_member("tty", tarfile.CHRTYPE), "is a character device"),
    ],
    ids=["dot-dot", "absolute", "symlink-out", "symlink-up", "hardlink", "device"],
)
def test_a_hostile_sourcedir_is_refused_naming_the_variable(
    tmp_path: Path, private_tmp: Path, loaded, special: tarfile.TarInfo, reason: str
) -> None:
    archive = pack(tmp_path / "in" / "sourcedir.tar.gz", script(1), special)
    environment = {"SAGEMAKER_PROGRAM": "entry.py", "SAGEMAKER_SUBMIT_DIRECTORY": str(archive)}
    with pytest.raises(ValueError) as refused:
        loaded("python", model(tmp_path / "model", "1"), environment)
    message = str(refused.value)
    assert message.startswith(f"SAGEMAKER_SUBMIT_DIRECTORY {str(archive)!r}: ")
    assert "cannot safely extract sourcedir.tar.gz" in message
    assert re.search(reason, message), message
    # nothing written, outside or in
    assert not (tmp_path / "escape.py").exists() and not Path("/tmp/absolute.py").exists()
    assert unpacked_folders(private_tmp) == []


def test_a_sourcedir_over_the_size_cap_is_refused(
    tmp_path: Path, private_tmp: Path, loaded, monkeypatch
) -> None:
    monkeypatch.setattr("serving.runtimes.sourcedir.MAX_BYTES", 64 * 1024)
    files = {**script(1), "vendored.bin": b"\0" * (64 * 1024)}  # compresses to almost nothing
    archive = pack(tmp_path / "sourcedir.tar.gz", files)
    assert archive.stat().st_size < 4096
    environment = {"SAGEMAKER_PROGRAM": "entry.py", "SAGEMAKER_SUBMIT_DIRECTORY": str(archive)}
    with pytest.raises(ValueError, match="SAGEMAKER_SUBMIT_DIRECTORY .*unpacks to more than 65536"):
        loaded("python", model(tmp_path / "model", "1"), environment)
    assert unpacked_folders(private_tmp) == []


# --- s3:// -----------------------------------------------------------------------------------------
BUCKET = "sourcedirs"


@pytest.fixture
def s3_environment(s3_url: str) -> dict[str, str]:
    """A container's Environment bringing its own credentials for moto's S3, and a bucket there."""
    environment = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "SERVING_S3_ENDPOINT_URL": s3_url,
    }
    boto3.client(
        "s3",
        endpoint_url=s3_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=BUCKET)
    return environment


def _container(environment: dict[str, str], model_data: Path) -> ContainerProcess:
    config = ContainerConfig(
        endpoint="e",
        hostname="c",
        image="python",
        model_data=str(model_data),
        environment=environment,
        hop_key=b"k" * 32,
    )
    return ContainerProcess(config, "127.0.0.1")


def test_an_s3_sourcedir_is_fetched_by_the_supervisor_and_loads(
    tmp_path: Path, s3_environment: dict[str, str], loaded
) -> None:
    body = pack(tmp_path / "upload" / "sourcedir.tar.gz", script(4)).read_bytes()
    boto3.client(
        "s3",
        endpoint_url=s3_environment["SERVING_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).put_object(Bucket=BUCKET, Key="job-1/source/sourcedir.tar.gz", Body=body)
    url = f"s3://{BUCKET}/job-1/source/sourcedir.tar.gz"
    weights = model(tmp_path / "model", "0.5")
    container = _container(
        {**s3_environment, "SAGEMAKER_PROGRAM": "entry.py", "SAGEMAKER_SUBMIT_DIRECTORY": url},
        weights,
    )
    try:
        environment = container._fetch_submit_directory(url)
        folder = Path(environment["SAGEMAKER_SUBMIT_DIRECTORY"])
        # unpacked in the container's scratch folder, which its process may read
        assert folder.is_relative_to(container.scratch) and (folder / "entry.py").is_file()
        assert answer(loaded("python", weights, environment)) == [2.0, 4.0]
        with pytest.raises(
            ContainerStartError, match="SAGEMAKER_SUBMIT_DIRECTORY .*does not exist"
        ):
            container._fetch_submit_directory(f"s3://{BUCKET}/job-2/sourcedir.tar.gz")
    finally:
        container.stop()


def test_a_hostile_s3_sourcedir_is_refused_before_the_process_starts(
    tmp_path: Path, s3_environment: dict[str, str]
) -> None:
    body = pack(
        tmp_path / "sourcedir.tar.gz", script(1), _member("x", tarfile.SYMTYPE, "/etc/shadow")
    ).read_bytes()
    boto3.client(
        "s3",
        endpoint_url=s3_environment["SERVING_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).put_object(Bucket=BUCKET, Key="evil/sourcedir.tar.gz", Body=body)
    url = f"s3://{BUCKET}/evil/sourcedir.tar.gz"
    container = _container(
        {**s3_environment, "SAGEMAKER_SUBMIT_DIRECTORY": url}, model(tmp_path / "m", "1")
    )
    try:
        with pytest.raises(ContainerStartError) as refused:
            container.start(timeout=10)
        assert f"SAGEMAKER_SUBMIT_DIRECTORY {url!r}: cannot safely extract" in str(refused.value)
        assert "is a symbolic link" in str(refused.value)
        assert container.process is None  # refused before any process was started
    finally:
        container.stop()
