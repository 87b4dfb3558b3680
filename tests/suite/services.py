"""What the Ray tiers' endpoints reach beside their models, made once per session: the S3-compatible
server (moto, on loopback) holding a copy of the MultiModel prefix, it-secure's identities file and
callers, and the instance types of endpoints created through the SageMaker API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


# Callers of it-secure, the one endpoint with AccessControl: SageMaker's documented example
# (team-a may invoke customIps* and common* containers only, team-b everything but special*).
ACCESS_CALLERS = {
    "team-a": {
        "AccessKeyId": "AKIAINTEGTEAMA0001",
        "SecretAccessKey": "team-a-integration-secret",
        "PolicyDocuments": ["customips-and-common.json"],
    },
    "team-b": {
        "AccessKeyId": "AKIAINTEGTEAMB0002",
        "SecretAccessKey": "team-b-integration-secret",
        "PolicyDocuments": ["all-but-special.json"],
    },
    "batch-job": {
        "ApiKey": "batch-job-integration-api-key",
        "PolicyDocuments": ["all-but-special.json"],
    },
}


@pytest.fixture(scope="session")
def access_callers() -> dict[str, dict]:
    """Principal -> its credentials (and policy file names) in it-secure's identities file."""
    return ACCESS_CALLERS


@pytest.fixture(scope="session")
def identities_file(tmp_path_factory) -> Path:
    """it-secure's identities file, attaching the example policies shipped in policies/."""
    policies = ROOT / "policies"
    entries = [
        {
            "Principal": name,
            **fields,
            "PolicyDocuments": [str(policies / p) for p in fields["PolicyDocuments"]],
        }
        for name, fields in ACCESS_CALLERS.items()
    ]
    path = tmp_path_factory.mktemp("access") / "identities.yaml"
    path.write_text(yaml.safe_dump({"Identities": entries}))
    return path


# InstanceType -> what one instance reserves, for endpoints created through the SageMaker API in
# tests (tests/integration/test_sagemaker_api.py, whose servers are its own: beside a session server
# of ~60 replicas, a walkthrough's replicas took the node past Ray's memory threshold).
API_INSTANCE_TYPES = {"ml.m5.large": {"Cpus": 0.02}, "ml.c5.large": {"Cpus": 0.04}}


@pytest.fixture(scope="session")
def api_instance_types(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("api") / "instance-types.json"
    path.write_text(json.dumps({"InstanceTypes": API_INSTANCE_TYPES}))
    return path


S3_BUCKET = "it-models"

AWS_TEST_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_models(multi_model_prefix) -> str:
    """An S3-compatible server on loopback (moto: no cloud is reachable from the tests) holding the
    prefix's models under s3://it-models/team-a/; returns its URL. Stopped at the end of the
    session."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per S3 request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        s3 = boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        s3.create_bucket(Bucket=S3_BUCKET)
        for path in sorted(multi_model_prefix.rglob("*")):
            if path.is_file():
                s3.upload_file(
                    str(path),
                    S3_BUCKET,
                    f"team-a/{path.relative_to(multi_model_prefix).as_posix()}",
                )
        yield url
    finally:
        server.stop()
