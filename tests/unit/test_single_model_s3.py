"""A SingleModel container's model data as SageMaker users have it: one `model.tar.gz` object in S3.

The S3 side is moto's server on loopback (`s3_url` in conftest: no cloud is reachable from the
tests); the download, the archive checks and the unpacking are the container's real code
(`models.artifacts.materialize`).
"""

from __future__ import annotations

import io
import tarfile

import boto3
import pytest

from serving.config.spec import SpecError, parse_spec
from serving.models.artifacts import ArtifactError, materialize

BUCKET = "models"


@pytest.fixture
def s3(s3_url, monkeypatch, tmp_path):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "SERVING_S3_ENDPOINT_URL": s3_url,
        "SERVING_MODEL_CACHE_DIR": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=s3_url)
    client.create_bucket(Bucket=BUCKET)
    return client


def _archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_model_tar_gz_in_s3_is_downloaded_and_unpacked_once_per_version(s3):
    s3.put_object(
        Bucket=BUCKET,
        Key="iris/model.tar.gz",
        Body=_archive({"model.txt": b"v1", "code/inference.py": b""}),
    )
    folder = materialize(f"s3://{BUCKET}/iris/model.tar.gz")
    assert (folder / "model.txt").read_bytes() == b"v1"
    # the same object: no second download
    assert materialize(f"s3://{BUCKET}/iris/model.tar.gz") == folder
    s3.put_object(Bucket=BUCKET, Key="iris/model.tar.gz", Body=_archive({"model.txt": b"v2"}))
    assert (materialize(f"s3://{BUCKET}/iris/model.tar.gz") / "model.txt").read_bytes() == b"v2"


def test_a_missing_object_or_an_unsafe_archive_is_refused_by_name(s3):
    with pytest.raises(ArtifactError, match="does not exist"):
        materialize(f"s3://{BUCKET}/nowhere/model.tar.gz")
    s3.put_object(Bucket=BUCKET, Key="evil/model.tar.gz", Body=_archive({"../escape.txt": b"x"}))
    with pytest.raises(ArtifactError, match="cannot safely extract"):
        materialize(f"s3://{BUCKET}/evil/model.tar.gz")


def test_the_spec_takes_an_s3_object_for_single_model_and_a_prefix_only_for_multi_model():
    spec = parse_spec(
        {
            "EndpointName": "e",
            "Containers": [
                {
                    "ContainerHostname": "c",
                    "Image": "sklearn",
                    "ModelDataUrl": "s3://bucket/iris/model.tar.gz",
                }
            ],
        }
    )
    assert spec.Containers[0].ModelDataUrl == "s3://bucket/iris/model.tar.gz"
    with pytest.raises(SpecError, match="one .tar.gz object"):
        parse_spec(
            {
                "EndpointName": "e",
                "Containers": [
                    {
                        "ContainerHostname": "c",
                        "Image": "sklearn",
                        "ModelDataUrl": "s3://bucket/iris/",
                    }
                ],
            }
        )
