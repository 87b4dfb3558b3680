"""The control-plane API on a loopback server over a faked Deployer, for test_sagemaker_api.py and
test_sagemaker_autoscaling_api.py.

The Deployer (what the API drives: apply a spec, delete a served endpoint, the served endpoints'
descriptions, the variant routing table, the cluster's capacity) is faked in memory because those
tests are about the protocol layer: a test says when a served variant is InService or Failed and
calls `api.tick()` itself. Real Ray Serve under the same API runs in
tests/integration/test_sagemaker_api.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from serving.config.spec import EndpointSpec
from serving.gateway.variants import Front
from serving.http.responses import serving_app
from serving.http.server import BackgroundServer
from serving.sagemaker_api.service import build_api
from serving.settings import ServerSettings

KEY, SECRET = "AKIAAPIUNITBUILDER01", "builder-secret-for-the-api-unit-tests"
API_KEY = "builder-api-key-for-the-api-unit-tests"
READER_KEY, READER_SECRET = "AKIAAPIUNITREADER002", "reader-secret-for-the-api-unit-tests"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"


class FakeDeployer:
    """The runtime under the API, in memory (see the module docstring): what was applied, deleted,
    routed."""

    def __init__(self, cpus: float = 8.0) -> None:
        self.applied: list[EndpointSpec] = []
        self.generations: dict[str, int] = {}
        self.served: dict[str, dict[str, Any]] = {}  # DescribeEndpoint-shaped, by served name
        self.deleted: list[str] = []
        self.fronts: dict[str, Front] | None = None
        self.cpus = cpus

    # --- the Deployer protocol ---
    def apply(self, spec: EndpointSpec) -> int:
        name = spec.EndpointName
        self.applied.append(spec)
        generation = self.generations[name] = self.generations.get(name, 0) + 1
        document = spec.model_dump(mode="json", exclude_none=True)
        desired = document["AutoScaling"]["MinCapacity"]
        current = self.served.get(name, {}).get("Containers", [{}])[0].get("CurrentReplicas", 0)
        self.served[name] = {
            "EndpointName": name,
            "EndpointStatus": "Updating" if current else "Creating",
            "LastUpdate": {"Generation": generation, "Status": "InProgress"},
            "Containers": [
                {**container, "CurrentReplicas": current, "DesiredReplicas": desired}
                for container in document["Containers"]
            ],
        }
        return generation

    def delete(self, name: str) -> bool:
        self.deleted.append(name)
        return self.served.pop(name, None) is not None

    def descriptions(self) -> dict[str, dict[str, Any]]:
        return self.served

    def set_fronts(self, fronts: dict[str, Front]) -> None:
        self.fronts = fronts

    def capacity(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": 0.0}

    # --- what a test says happened ---
    def ready(self, *names: str) -> None:
        for name in names:
            described = self.served[name]
            described["EndpointStatus"] = "InService"
            described["LastUpdate"]["Status"] = "Succeeded"
            for container in described["Containers"]:
                container["CurrentReplicas"] = container["DesiredReplicas"]

    def fail(self, name: str, reason: str) -> None:
        described = self.served[name]
        described["EndpointStatus"] = "Failed"
        described["LastUpdate"].update(Status="Failed", FailureReason=reason)

    def spec(self, name: str) -> dict[str, Any]:
        """The last spec applied under served name `name`, as JSON."""
        return next(s for s in reversed(self.applied) if s.EndpointName == name).model_dump(
            mode="json", exclude_none=True
        )

    def routes(self, endpoint: str) -> list[tuple[str, str, float]]:
        assert self.fronts is not None
        front = self.fronts[endpoint]
        return [(v.name, v.endpoint, v.weight) for v in front.variants]


class Clock:
    """The API's clock: real time to start with, a little later at each reading, moved on by
    `advance`."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        self.now += 0.001
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Harness:
    """The API on a loopback server over a FakeDeployer; boto3 clients for it."""

    def __init__(self, root: Path, deployer: FakeDeployer | None = None, **settings: Any) -> None:
        self.root = root
        self.models = root / "models"
        (self.models / "iris").mkdir(parents=True, exist_ok=True)
        self.deployer = deployer or FakeDeployer()
        # Anonymous calls, as `--allow-anonymous-api` allows them, unless the test signs its calls.
        settings.setdefault("allow_anonymous_api", "api_identities" not in settings)
        self.settings = ServerSettings(model_roots=str(self.models), **settings)
        self.control, routes = build_api(self.settings, self.deployer)
        self.api = self.control.sagemaker
        self.clock = Clock()
        self.api.context.clock = self.control.cloudwatch.clock = self.clock
        self.server = BackgroundServer(serving_app(routes), "127.0.0.1", 0)
        assert self.server.wait_started(), "API server did not start"
        self.url = self.server.url
        self.sm = self.client()

    def client(self, service: str = "sagemaker", key: str = KEY, secret: str = SECRET) -> Any:
        return boto3.client(
            service,  # type: ignore[call-overload]  # boto3's overloads name each service
            endpoint_url=self.url,
            region_name=self.settings.region,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            config=Config(retries={"max_attempts": 1}),
        )

    def model(self, name: str = "m1", image: str = "sklearn", **container: Any) -> None:
        self.sm.create_model(
            ModelName=name,
            PrimaryContainer={
                "Image": image,
                "ModelDataUrl": str(self.models / "iris"),
                **container,
            },
        )

    def config(
        self, name: str, *variants: tuple[str, str], instance: str = "ml.m5.large", count: int = 1
    ) -> None:
        """An endpoint config of (variant, model) pairs, each variant weighted 1."""
        self.sm.create_endpoint_config(
            EndpointConfigName=name,
            ProductionVariants=[
                {
                    "VariantName": v,
                    "ModelName": m,
                    "InstanceType": instance,
                    "InitialInstanceCount": count,
                }
                for v, m in variants
            ],
        )

    def status(self, endpoint: str) -> str:
        return self.sm.describe_endpoint(EndpointName=endpoint)["EndpointStatus"]

    def in_service(
        self, endpoint: str = "e1", config: str = "c1", variants: tuple[str, ...] = ("A",)
    ) -> None:
        """Model m1, `config` with `variants` of it, endpoint `endpoint` created and brought
        InService."""
        if not self.sm.list_models(NameContains="m1")["Models"]:
            self.model("m1")
        self.config(config, *((v, "m1") for v in variants))
        self.sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=config)
        self.deployer.ready(*(f"{endpoint}@{v}@1" for v in variants))
        self.api.tick()
        assert self.status(endpoint) == "InService"

    def stop(self) -> None:
        self.server.stop()
        self.api.state.close()


def refused(call: Callable[[], Any], code: str, *fragments: str) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    error = raised.value.response["Error"]
    assert error["Code"] == code, error
    for fragment in fragments:
        assert fragment in error["Message"], error["Message"]
    return error["Message"]
