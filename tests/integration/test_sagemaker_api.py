"""A SageMaker user's deployment code, unchanged, against `serving server` (real Ray Serve, real
HTTP).

The boto3 `sagemaker`, `sagemaker-runtime` and `application-autoscaling` clients are pointed at the
server with `endpoint_url=`; everything else is written as AWS's own walkthroughs write it:
create_model -> create_endpoint_config -> create_endpoint -> the `endpoint_in_service` waiter ->
invoke_endpoint (with and without TargetContainerHostname) -> register_scalable_target ->
put_scaling_policy -> describe_scaling_activities -> update_endpoint under load -> delete_endpoint
-> the `endpoint_deleted` waiter. Load for the update is counted with plain HTTP (no SDK retries),
so a single failed call shows.

The servers are this module's own `serving` processes (own_ray: they run before the session's Ray
starts, see tests/suite/services.py; beside a session server of ~60 replicas the walkthrough's took
the node past Ray's memory threshold), each stopped with SIGINT by its PID and waited for, bounded.
The first test restarts one on the same state file: every endpoint, config, model and scaling policy
comes back, beside an endpoint from a spec given to `serving up`, which DescribeEndpoint and
ListEndpoints show too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import psutil
import pytest
import yaml
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

pytestmark = [pytest.mark.integration, pytest.mark.own_ray]

WAIT = {"Delay": 2, "MaxAttempts": 90}  # the waiters' 30 s default would only slow the test
SKLEARN_IMAGE = "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"
ROW = json.dumps([[6.7, 3.0, 5.2, 2.3]])

SERVING = [sys.executable, "-c", "import sys; from serving.cli import main; sys.exit(main())"]
START_TIMEOUT_S = 180
CHROMIUM = "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Served:
    """One `serving` process on a port: started, waited for, stopped by its PID."""

    def __init__(
        self,
        arguments: list[str],
        port: int,
        folder: Path,
        log: Path,
        *,
        ready_by_ping: bool = False,
    ) -> None:
        """`ready_by_ping`: started once GET /ping first answers 200, polled as a load balancer
        would (else once the console says so)."""
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        environment = {**os.environ, "SERVING_STATE_DIR": str(folder)}
        self.process = subprocess.Popen(
            [*SERVING, *arguments, "--port", str(port), "--num-cpus", "2"],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=folder,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"serving exited: {log.read_text()[-3000:]}"
            if ready_by_ping:
                try:
                    if httpx.get(f"{self.url}/ping", timeout=5).status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                time.sleep(0.05)
            elif "Serving. Press Ctrl-C" in log.read_text():
                return
            else:
                time.sleep(1)
        self.stop()
        raise AssertionError(
            f"serving did not start within {START_TIMEOUT_S} s: {log.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                # the group this test started, by its leader's PID
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)

    def clients(self):
        options = dict(
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
            config=Config(retries={"max_attempts": 1}),
        )
        return (
            boto3.client("sagemaker", **options),
            boto3.client("application-autoscaling", **options),
        )


def test_endpoints_configs_and_policies_survive_a_restart(
    tmp_path, handler_models, api_instance_types
):
    state = tmp_path / "state.db"
    port = _free_port()
    flags = [
        "--state",
        str(state),
        "--instance-types",
        str(api_instance_types),
        "--allow-anonymous-api",
        "--model-root",
        str(handler_models["echo"].parent),
    ]
    spec = tmp_path / "from-spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "EndpointName": "from-spec",
                "Containers": [
                    {
                        "ContainerHostname": "only",
                        "Image": "python",
                        "ModelDataUrl": str(handler_models["echo"]),
                        "Resources": {"Cpus": 0.02},
                    }
                ],
            }
        )
    )
    resource = "endpoint/kept/variant/AllTraffic"

    first = Served(["server", *flags], port, tmp_path, tmp_path / "first.log")
    try:
        sm, autoscaling = first.clients()
        sm.create_model(
            ModelName="kept",
            PrimaryContainer={"Image": "python", "ModelDataUrl": str(handler_models["echo"])},
        )
        sm.create_endpoint_config(
            EndpointConfigName="kept",
            ProductionVariants=[
                {
                    "VariantName": "AllTraffic",
                    "ModelName": "kept",
                    "InitialInstanceCount": 1,
                    "InstanceType": "ml.m5.large",
                }
            ],
        )
        sm.create_endpoint(EndpointName="kept", EndpointConfigName="kept")
        sm.get_waiter("endpoint_in_service").wait(EndpointName="kept", WaiterConfig=WAIT)
        autoscaling.register_scalable_target(
            ServiceNamespace="sagemaker",
            ResourceId=resource,
            ScalableDimension="sagemaker:variant:DesiredInstanceCount",
            MinCapacity=1,
            MaxCapacity=2,
        )
        autoscaling.put_scaling_policy(
            PolicyName="kept-policy",
            ServiceNamespace="sagemaker",
            ResourceId=resource,
            ScalableDimension="sagemaker:variant:DesiredInstanceCount",
            PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={
                "TargetValue": 100.0,
                "PredefinedMetricSpecification": {
                    "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
                },
            },
        )
    finally:
        first.stop()
    assert first.process.returncode == 0, first.log.read_text()[-3000:]
    assert oct(state.stat().st_mode & 0o777) == "0o600"

    # Started again on the same state, this time by `serving up` with a spec of its own beside it,
    # and taken into service the way a load balancer or a Kubernetes readiness probe does: at the
    # first 200 from GET /ping. Issue 43: /ping answered 200 before the spec's endpoint was deployed
    # and before the API had restored its own, and the first calls got "not found".
    second = Served(
        ["up", str(spec), *flags], port, tmp_path, tmp_path / "second.log", ready_by_ping=True
    )
    try:
        sm, autoscaling = second.clients()
        for name in ("kept", "from-spec"):
            answer = httpx.post(
                f"{second.url}/endpoints/{name}/invocations",
                content=b'{"back": true}',
                headers={"Content-Type": "application/json"},
                timeout=30,
            )
            assert answer.status_code == 200, (
                f"{name}, right after the first 200 from /ping: {answer.text}"
            )
            assert json.loads(json.loads(answer.content)["body"]) == {"back": True}
        sm.get_waiter("endpoint_in_service").wait(EndpointName="kept", WaiterConfig=WAIT)
        assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["kept"]
        assert (
            sm.describe_endpoint_config(EndpointConfigName="kept")["ProductionVariants"][0][
                "ModelName"
            ]
            == "kept"
        )
        policies = autoscaling.describe_scaling_policies(
            ServiceNamespace="sagemaker", ResourceId=resource
        )
        assert [p["PolicyName"] for p in policies["ScalingPolicies"]] == ["kept-policy"]
        listed = {e["EndpointName"]: e["EndpointStatus"] for e in sm.list_endpoints()["Endpoints"]}
        assert listed == {"kept": "InService", "from-spec": "InService"}
        assert (
            sm.describe_endpoint(EndpointName="from-spec")["ProductionVariants"][0]["VariantName"]
            == "AllTraffic"
        )
        sm.delete_endpoint(EndpointName="kept")
        sm.get_waiter("endpoint_deleted").wait(EndpointName="kept", WaiterConfig=WAIT)
    finally:
        second.stop()


@pytest.fixture(scope="module")
def api_server(tmp_path_factory, api_instance_types):
    """`serving server` of this module's own: models from this session's folders."""
    # outside the model root: a root may not hold the state
    folder = Path(tempfile.mkdtemp(prefix="api-server-"))
    served = Served(
        [
            "server",
            "--state",
            str(folder / "state.db"),
            "--instance-types",
            str(api_instance_types),
            "--allow-anonymous-api",
            "--model-root",
            str(tmp_path_factory.getbasetemp()),
        ],
        _free_port(),
        folder,
        folder / "server.log",
    )
    yield served
    served.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def clients(api_server):
    options = dict(
        endpoint_url=api_server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )
    return (
        boto3.client("sagemaker", **options),
        boto3.client("sagemaker-runtime", **options),
        boto3.client("application-autoscaling", **options),
    )


class Load:
    """InvokeEndpoint at a steady pace on a thread, over plain HTTP: every answer's status kept
    (and, with `ping`, every GET /ping answer that was not 200, as a load balancer's health check
    would see it)."""

    def __init__(
        self,
        url: str,
        endpoint: str,
        headers: dict[str, str],
        body: str,
        ping: bool = False,
        paused: bool = False,
    ) -> None:
        self.url, self.endpoint, self.headers, self.body, self.ping = (
            url,
            endpoint,
            headers,
            body,
            ping,
        )
        self.statuses: list[int] = []
        self.failures: list[str] = []
        self.pings = 0
        self.unhealthy: list[str] = []
        self._stop = threading.Event()
        self._going = threading.Event()  # `paused`: no call until `resume`
        if not paused:
            self._going.set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def resume(self) -> None:
        self._going.set()

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._going.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        self._going.wait()
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    response = client.post(
                        f"/endpoints/{self.endpoint}/invocations",
                        content=self.body,
                        headers={"Content-Type": "application/json", **self.headers},
                    )
                    self.statuses.append(response.status_code)
                    if response.status_code != 200:
                        self.failures.append(f"{response.status_code} {response.text[:300]}")
                    if self.ping:
                        health = client.get("/ping")
                        self.pings += 1
                        if health.status_code != 200:
                            self.unhealthy.append(f"{health.status_code} {health.text[:300]}")
                except httpx.HTTPError as error:
                    self.failures.append(repr(error))
                self._stop.wait(0.1)


def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def test_two_container_direct_walkthrough(api_server, clients, demo_models):
    sm, runtime, autoscaling = clients
    sm.create_model(
        ModelName="api-iris-wine",
        ExecutionRoleArn="arn:aws:iam::000000000000:role/SageMakerRole",
        Containers=[
            {
                "ContainerHostname": "iris",
                "Image": SKLEARN_IMAGE,
                "ModelDataUrl": str(demo_models / "iris-classifier"),
            },
            {
                "ContainerHostname": "wine",
                "Image": "sklearn",
                "ModelDataUrl": str(demo_models / "wine-classifier"),
                "Environment": {"SERVING_SKLEARN_METHOD": "predict_proba"},
            },
        ],
        InferenceExecutionConfig={"Mode": "Direct"},
    )
    sm.create_endpoint_config(
        EndpointConfigName="api-direct-1",
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": "api-iris-wine",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.m5.large",
                "InitialVariantWeight": 1.0,
            }
        ],
    )
    arn = sm.create_endpoint(EndpointName="api-direct", EndpointConfigName="api-direct-1")[
        "EndpointArn"
    ]
    assert arn == "arn:aws:sagemaker:us-east-1:000000000000:endpoint/api-direct"
    assert sm.describe_endpoint(EndpointName="api-direct")["EndpointStatus"] == "Creating"
    sm.get_waiter("endpoint_in_service").wait(EndpointName="api-direct", WaiterConfig=WAIT)
    described = sm.describe_endpoint(EndpointName="api-direct")
    variant = described["ProductionVariants"][0]
    assert (variant["VariantName"], variant["CurrentInstanceCount"], variant["CurrentWeight"]) == (
        "AllTraffic",
        1,
        1.0,
    )
    assert variant["DeployedImages"][0] == {
        "SpecifiedImage": SKLEARN_IMAGE,
        "ResolvedImage": "sklearn",
    }

    answer = runtime.invoke_endpoint(
        EndpointName="api-direct",
        TargetContainerHostname="iris",
        ContentType="application/json",
        Body=ROW,
    )
    assert json.loads(answer["Body"].read()) == [2]
    assert answer["InvokedProductionVariant"] == "AllTraffic"
    # Without TargetContainerHostname a Direct endpoint of two containers refuses, naming them.
    with pytest.raises(ClientError) as refused:
        runtime.invoke_endpoint(EndpointName="api-direct", ContentType="application/json", Body=ROW)
    assert refused.value.response["Error"]["Code"] == "ValidationError"
    assert "iris" in refused.value.response["Error"]["Message"]

    # Autoscaling, as the AWS docs write it: a target of 2 invocations per instance per minute.
    resource = "endpoint/api-direct/variant/AllTraffic"
    autoscaling.register_scalable_target(
        ServiceNamespace="sagemaker",
        ResourceId=resource,
        ScalableDimension="sagemaker:variant:DesiredInstanceCount",
        MinCapacity=1,
        MaxCapacity=2,
    )
    policy = autoscaling.put_scaling_policy(
        PolicyName="invocations",
        ServiceNamespace="sagemaker",
        ResourceId=resource,
        ScalableDimension="sagemaker:variant:DesiredInstanceCount",
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": 2.0,
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
            },
            "ScaleOutCooldown": 0,
            "ScaleInCooldown": 600,
        },
    )
    assert policy["PolicyARN"].endswith(":policyName/invocations")
    assert (
        autoscaling.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource)[
            "ScalingPolicies"
        ][0]["TargetTrackingScalingPolicyConfiguration"]["TargetValue"]
        == 2.0
    )
    with Load(
        api_server.url, "api-direct", {"X-Amzn-SageMaker-Target-Container-Hostname": "iris"}, ROW
    ) as load:
        activities = _until(
            lambda: autoscaling.describe_scaling_activities(
                ServiceNamespace="sagemaker", ResourceId=resource
            )["ScalingActivities"],
            180,
            "a scale-out activity",
        )
        assert activities[0]["StatusCode"] == "Successful"
        assert "desired instance count to 2" in activities[0]["Description"]
        _until(
            lambda: (
                sm.describe_endpoint(EndpointName="api-direct")["ProductionVariants"][0][
                    "CurrentInstanceCount"
                ]
                == 2
            ),
            120,
            "the second instance",
        )
    assert not load.failures, load.failures[:5]

    # UpdateEndpoint under constant load: the new generation comes up beside the old; no call fails.
    sm.create_endpoint_config(
        EndpointConfigName="api-direct-2",
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": "api-iris-wine",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.c5.large",
            }
        ],
    )
    with Load(
        api_server.url,
        "api-direct",
        {"X-Amzn-SageMaker-Target-Container-Hostname": "iris"},
        ROW,
        ping=True,
    ) as load:
        time.sleep(1)
        sm.update_endpoint(EndpointName="api-direct", EndpointConfigName="api-direct-2")
        assert sm.describe_endpoint(EndpointName="api-direct")["EndpointStatus"] == "Updating"
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-direct", WaiterConfig=WAIT)
        time.sleep(12)  # past the old generation's drain and deletion
    assert len(load.statuses) > 50, len(load.statuses)
    assert not load.failures, load.failures[:5]
    # the standby generation is not counted
    assert load.pings > 50 and not load.unhealthy, load.unhealthy[:5]
    described = sm.describe_endpoint(EndpointName="api-direct")
    assert described["EndpointConfigName"] == "api-direct-2"
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] >= 1
    assert "FailureReason" not in described

    sm.delete_endpoint(EndpointName="api-direct")
    sm.get_waiter("endpoint_deleted").wait(EndpointName="api-direct", WaiterConfig=WAIT)
    with pytest.raises(ClientError) as gone:
        runtime.invoke_endpoint(
            EndpointName="api-direct",
            TargetContainerHostname="iris",
            ContentType="application/json",
            Body=ROW,
        )
    assert gone.value.response["Error"]["Code"] == "ValidationError"
    assert (
        autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[resource])[
            "ScalableTargets"
        ]
        == []
    )
    sm.delete_endpoint_config(EndpointConfigName="api-direct-1")
    sm.delete_endpoint_config(EndpointConfigName="api-direct-2")
    sm.delete_model(ModelName="api-iris-wine")


def test_four_container_serial_pipeline(api_server, clients, demo_models, handler_models):
    sm, runtime, _ = clients
    sm.create_model(
        ModelName="api-pipeline",
        Containers=[
            {
                "ContainerHostname": "preprocess",
                "Image": "sklearn",
                "ModelDataUrl": str(demo_models / "iris-preprocess"),
            },
            {
                "ContainerHostname": "classifier",
                "Image": "sklearn",
                "ModelDataUrl": str(demo_models / "iris-on-features"),
            },
            {
                "ContainerHostname": "labels",
                "Image": "python",
                "ModelDataUrl": str(demo_models / "iris-labels.tar.gz"),
            },
            {
                "ContainerHostname": "echo",
                "Image": "python",
                "ModelDataUrl": str(handler_models["echo"]),
            },
        ],
        InferenceExecutionConfig={"Mode": "Serial"},
    )
    sm.create_endpoint_config(
        EndpointConfigName="api-pipeline",
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": "api-pipeline",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.m5.large",
            }
        ],
    )
    sm.create_endpoint(EndpointName="api-pipeline", EndpointConfigName="api-pipeline")
    try:
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-pipeline", WaiterConfig=WAIT)
        answer = runtime.invoke_endpoint(
            EndpointName="api-pipeline",
            ContentType="text/csv",
            Body="5.1,3.5,1.4,0.2\n6.7,3.0,5.2,2.3\n",
        )
        # the fourth container echoes what the third answered
        echoed = json.loads(answer["Body"].read())
        assert json.loads(echoed["body"]) == {"labels": ["setosa", "virginica"]}
        with pytest.raises(ClientError) as refused:  # a Serial endpoint takes no target container
            runtime.invoke_endpoint(
                EndpointName="api-pipeline",
                TargetContainerHostname="echo",
                ContentType="text/csv",
                Body="5.1,3.5,1.4,0.2\n",
            )
        assert "Serial" in refused.value.response["Error"]["Message"]
        listed = {
            e["EndpointName"]: e["EndpointStatus"]
            for e in sm.list_endpoints(MaxResults=100)["Endpoints"]
        }
        assert listed["api-pipeline"] == "InService"
    finally:
        sm.delete_endpoint(EndpointName="api-pipeline")
    sm.get_waiter("endpoint_deleted").wait(EndpointName="api-pipeline", WaiterConfig=WAIT)


def test_variant_weights_split_traffic_and_target_variant_pins(api_server, clients, handler_models):
    sm, runtime, _ = clients
    sm.create_model(
        ModelName="api-echo",
        PrimaryContainer={"Image": "python", "ModelDataUrl": str(handler_models["echo"])},
    )
    sm.create_endpoint_config(
        EndpointConfigName="api-ab",
        ProductionVariants=[
            {
                "VariantName": "blue",
                "ModelName": "api-echo",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.m5.large",
                "InitialVariantWeight": 3.0,
            },
            {
                "VariantName": "green",
                "ModelName": "api-echo",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.m5.large",
                "InitialVariantWeight": 1.0,
            },
        ],
    )
    sm.create_endpoint(EndpointName="api-ab", EndpointConfigName="api-ab")
    try:
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-ab", WaiterConfig=WAIT)
        calls = 400
        with httpx.Client(base_url=api_server.url, timeout=30) as client:

            def variants(count: int, headers: dict | None = None) -> Counter:
                seen: Counter = Counter()
                for _ in range(count):
                    response = client.post(
                        "/endpoints/api-ab/invocations",
                        content=b'{"x": 1}',
                        headers={"Content-Type": "application/json", **(headers or {})},
                    )
                    assert response.status_code == 200, response.text
                    seen[response.headers["x-Amzn-Invoked-Production-Variant"]] += 1
                return seen

            seen = variants(calls)
            # 3:1 -> 75 % blue; the binomial standard deviation over 400 calls is 2.2 %: allow 3 of
            # them.
            assert abs(seen["blue"] / calls - 0.75) < 0.066, seen
            assert variants(20, {"X-Amzn-SageMaker-Target-Variant": "green"}) == Counter(
                {"green": 20}
            )
            sm.update_endpoint_weights_and_capacities(
                EndpointName="api-ab",
                DesiredWeightsAndCapacities=[{"VariantName": "blue", "DesiredWeight": 0.0}],
            )
            assert variants(30) == Counter({"green": 30})  # weights move traffic at once
        pinned = runtime.invoke_endpoint(
            EndpointName="api-ab",
            TargetVariant="blue",
            ContentType="application/json",
            Body=b'{"x": 1}',
        )
        assert pinned["InvokedProductionVariant"] == "blue"
        with pytest.raises(ClientError) as unknown:
            runtime.invoke_endpoint(
                EndpointName="api-ab",
                TargetVariant="red",
                ContentType="application/json",
                Body=b'{"x": 1}',
            )
        assert "blue, green" in unknown.value.response["Error"]["Message"]
        weights = {
            v["VariantName"]: v["CurrentWeight"]
            for v in sm.describe_endpoint(EndpointName="api-ab")["ProductionVariants"]
        }
        assert weights == {"blue": 0.0, "green": 1.0}
        # A variant's own served endpoint is not reachable by its internal name.
        direct = httpx.post(
            f"{api_server.url}/endpoints/api-ab@blue@1/invocations",
            content=b"{}",
            headers={"Content-Type": "application/json"},
        )
        assert direct.status_code == 400
    finally:
        sm.delete_endpoint(EndpointName="api-ab")
    sm.get_waiter("endpoint_deleted").wait(EndpointName="api-ab", WaiterConfig=WAIT)


def test_unsupported_fields_are_refused_by_name(clients, demo_models):
    sm, _, _ = clients
    with pytest.raises(ClientError) as refused:
        sm.create_model(
            ModelName="api-refused",
            PrimaryContainer={
                "Image": "sklearn",
                "ModelDataUrl": str(demo_models / "iris-classifier"),
            },
            VpcConfig={"SecurityGroupIds": ["sg-12345678"], "Subnets": ["subnet-12345678"]},
        )
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "VpcConfig" in refused.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as outside:
        sm.create_model(
            ModelName="api-outside", PrimaryContainer={"Image": "sklearn", "ModelDataUrl": "/etc"}
        )
    assert "model roots" in outside.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as image:
        sm.create_model(
            ModelName="api-image",
            PrimaryContainer={
                "Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-own:latest",
                "ModelDataUrl": str(demo_models / "iris-classifier"),
            },
        )
    assert "PrimaryContainer.Image" in image.value.response["Error"]["Message"]


def test_single_model_data_from_an_s3_model_tar_gz(api_server, clients, s3_models):
    # SageMaker users' artifacts: one model.tar.gz object in S3 (here moto's server on loopback).
    # The replica's supervisor fetches it before the container starts, with the container's AWS
    # settings when it has them.
    sm, runtime, _ = clients
    sm.create_model(
        ModelName="api-s3",
        PrimaryContainer={
            "Image": SKLEARN_IMAGE,
            "ModelDataUrl": "s3://it-models/team-a/iris-0.tar.gz",
            "Environment": {
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
                "SERVING_S3_ENDPOINT_URL": s3_models,
            },
        },
    )
    sm.create_endpoint_config(
        EndpointConfigName="api-s3",
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": "api-s3",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.m5.large",
            }
        ],
    )
    sm.create_endpoint(EndpointName="api-s3", EndpointConfigName="api-s3")
    try:
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-s3", WaiterConfig=WAIT)
        answer = runtime.invoke_endpoint(
            EndpointName="api-s3", ContentType="application/json", Body=ROW
        )
        assert json.loads(answer["Body"].read()) == [2]
    finally:
        sm.delete_endpoint(EndpointName="api-s3")


def test_a_failed_update_rolls_back_and_keeps_serving(api_server, clients, handler_models):
    # As SageMaker does: the new config's model cannot load, so the endpoint stays on the old one,
    # InService, with the failure in DescribeEndpoint; nothing sent meanwhile fails.
    sm, _, _ = clients
    for name in ("echo", "broken"):
        sm.create_model(
            ModelName=f"api-{name}-model",
            PrimaryContainer={"Image": "python", "ModelDataUrl": str(handler_models[name])},
        )
        sm.create_endpoint_config(
            EndpointConfigName=f"api-{name}-config",
            ProductionVariants=[
                {
                    "VariantName": "AllTraffic",
                    "ModelName": f"api-{name}-model",
                    "InitialInstanceCount": 1,
                    "InstanceType": "ml.m5.large",
                }
            ],
        )
    sm.create_endpoint(EndpointName="api-rollback", EndpointConfigName="api-echo-config")
    try:
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-rollback", WaiterConfig=WAIT)
        with Load(api_server.url, "api-rollback", {}, '{"x": 1}') as load:
            sm.update_endpoint(EndpointName="api-rollback", EndpointConfigName="api-broken-config")
            described = _until(
                lambda: (lambda d: d if d["EndpointStatus"] != "Updating" else None)(
                    sm.describe_endpoint(EndpointName="api-rollback")
                ),
                240,
                "the update to fail",
            )
        assert described["EndpointStatus"] == "InService", described
        assert described["EndpointConfigName"] == "api-echo-config"
        assert (
            "rolled back" in described["FailureReason"]
            and "weights file is corrupt" in described["FailureReason"]
        )
        assert len(load.statuses) > 20 and not load.failures, load.failures[:5]
    finally:
        sm.delete_endpoint(EndpointName="api-rollback")


def test_cloudwatch_counts_every_call_and_an_alarm_fires_on_model_errors(
    api_server, clients, handler_models
):
    # Issue 45, item 1: an unmodified boto3 `cloudwatch` client reads SageMaker's metrics of an API
    # endpoint and alarms on them; the metric store is fed by the control plane's sampler from the
    # gateway's real counters.
    sm, runtime, _ = clients
    cw = boto3.client(
        "cloudwatch",
        endpoint_url=api_server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )
    sm.create_model(
        ModelName="api-cw-model",
        InferenceExecutionConfig={"Mode": "Direct"},
        Containers=[
            {
                "ContainerHostname": name,
                "Image": "python",
                "ModelDataUrl": str(handler_models[name]),
            }
            for name in ("echo", "faulty")
        ],
    )
    sm.create_endpoint_config(
        EndpointConfigName="api-cw-config",
        ProductionVariants=[
            {
                "VariantName": "Blue",
                "ModelName": "api-cw-model",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.m5.large",
            }
        ],
    )
    sm.create_endpoint(EndpointName="api-cw", EndpointConfigName="api-cw-config")
    variant = [
        {"Name": "EndpointName", "Value": "api-cw"},
        {"Name": "VariantName", "Value": "Blue"},
    ]
    try:
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-cw", WaiterConfig=WAIT)
        cw.put_metric_alarm(
            AlarmName="api-cw-5xx",
            Namespace="AWS/SageMaker",
            MetricName="Invocation5XXErrors",
            Dimensions=variant,
            Statistic="Sum",
            Period=10,
            EvaluationPeriods=1,
            Threshold=0,
            ComparisonOperator="GreaterThanThreshold",
            TreatMissingData="notBreaching",
        )
        started = time.time()
        for _ in range(30):
            runtime.invoke_endpoint(
                EndpointName="api-cw",
                TargetContainerHostname="echo",
                ContentType="application/json",
                Body='{"x": 1}',
            )
        for _ in range(3):  # ModelError to the caller; a 5XX of the model to SageMaker's metrics
            with pytest.raises(ClientError, match="ModelError"):
                runtime.invoke_endpoint(
                    EndpointName="api-cw",
                    TargetContainerHostname="faulty",
                    ContentType="application/json",
                    Body='{"x": 1}',
                )

        def total(metric: str, dimensions: list, statistic: str = "Sum") -> float:
            points = cw.get_metric_statistics(
                Namespace="AWS/SageMaker",
                MetricName=metric,
                Dimensions=dimensions,
                StartTime=started - 120,
                EndTime=time.time() + 60,
                Period=60,
                Statistics=[statistic],
            )["Datapoints"]
            return sum(point[statistic] for point in points)

        # The gateway publishes its counters every 5 s and the sampler reads them every 10 s:
        # bounded waits.
        _until(
            lambda: total("Invocations", variant) == 33,
            60,
            "Invocations to sum to the 33 calls sent",
        )
        faulty = [*variant, {"Name": "ContainerName", "Value": "faulty"}]
        assert (
            total("Invocation5XXErrors", faulty) == 3 and total("Invocation4XXErrors", variant) == 0
        )
        assert total("Invocations", [*variant, {"Name": "ContainerName", "Value": "echo"}]) == 30
        history = lambda: [
            item["HistorySummary"]
            for item in cw.describe_alarm_history(  # noqa: E731
                AlarmName="api-cw-5xx", HistoryItemType="StateUpdate"
            )["AlarmHistoryItems"]
        ]
        # From OK, or straight from INSUFFICIENT_DATA if its first evaluation already saw the
        # errors.
        _until(
            lambda: any(item.endswith(" to ALARM") for item in history()),
            60,
            "the 5XX alarm to fire",
        )
        latency = _until(
            lambda: total("ModelLatency", variant, "SampleCount"), 60, "ModelLatency datapoints"
        )
        assert latency >= 30
        listed = cw.list_metrics(
            Namespace="AWS/SageMaker", Dimensions=[{"Name": "EndpointName", "Value": "api-cw"}]
        )
        assert {"Invocations", "Invocation5XXErrors", "ModelLatency"} <= {
            m["MetricName"] for m in listed["Metrics"]
        }
        assert total("Invocations", variant) == 33  # sampled again since: nothing counted twice
    finally:
        cw.delete_alarms(AlarmNames=["api-cw-5xx"])
        sm.delete_endpoint(EndpointName="api-cw")


class ConsolePage:
    """The operator console open in a real headless Chromium, its console errors kept."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda error: self.errors.append(str(error)))


@contextlib.contextmanager
def console_page(url: str) -> Iterator[ConsolePage]:
    """`url` in Debian's chromium (`make test` installs it), driven by Playwright; this module's
    server binds loopback with an anonymous API, so the console needs no sign-in."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            watched = ConsolePage(browser.new_page())
            answer = watched.page.goto(url)
            assert answer is not None and answer.status == 200, answer
            yield watched
        finally:
            browser.close()


def test_a_canary_that_fails_is_rolled_back_by_its_alarm_and_a_linear_update_loses_nothing(
    api_server, clients, handler_models
):
    # Issue 45, item 2, as a SageMaker pipeline runs it: a CANARY update whose new model raises on
    # every call is rolled back by an Invocation5XXErrors alarm, only the canary's share of calls
    # failing; then a LINEAR update of a healthy model completes step by step under load with no
    # failed call.
    sm, _, _ = clients
    cw = boto3.client(
        "cloudwatch",
        endpoint_url=api_server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )
    for model, handler in (("api-good", "echo"), ("api-bad", "faulty")):
        sm.create_model(
            ModelName=model,
            PrimaryContainer={"Image": "python", "ModelDataUrl": str(handler_models[handler])},
        )
    for config, model in (
        ("api-good-1", "api-good"),
        ("api-bad-1", "api-bad"),
        ("api-good-2", "api-good"),
    ):
        sm.create_endpoint_config(
            EndpointConfigName=config,
            ProductionVariants=[
                {
                    "VariantName": "AllTraffic",
                    "ModelName": model,
                    "InitialInstanceCount": 1,
                    "InstanceType": "ml.m5.large",
                }
            ],
        )
    sm.create_endpoint(EndpointName="api-canary", EndpointConfigName="api-good-1")
    try:
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-canary", WaiterConfig=WAIT)
        cw.put_metric_alarm(
            AlarmName="api-canary-5xx",
            Namespace="AWS/SageMaker",
            MetricName="Invocation5XXErrors",
            Dimensions=[
                {"Name": "EndpointName", "Value": "api-canary"},
                {"Name": "VariantName", "Value": "AllTraffic"},
            ],
            Statistic="Sum",
            Period=10,
            EvaluationPeriods=1,
            Threshold=0,
            ComparisonOperator="GreaterThanThreshold",
            TreatMissingData="notBreaching",
        )
        canary = {
            "BlueGreenUpdatePolicy": {
                "TrafficRoutingConfiguration": {
                    "Type": "CANARY",
                    "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 20},
                    "WaitIntervalInSeconds": 600,
                }
            },
            "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "api-canary-5xx"}]},
        }
        with (
            # paused until the console has shown the bake: without calls the canary fails none
            # and its alarm cannot end the bake before the page (read every 5 s) shows it
            Load(api_server.url, "api-canary", {}, '{"x": 1}', paused=True) as load,
            console_page(f"{api_server.url}/console#/endpoints/api-canary") as console,
        ):
            sm.update_endpoint(
                EndpointName="api-canary", EndpointConfigName="api-bad-1", DeploymentConfig=canary
            )
            # the operator console shows the canary's step as it bakes
            console.page.locator("#update", has_text="Baking").wait_for(timeout=120_000)
            canary_step = console.page.locator("#update").inner_text()
            load.resume()
            described = _until(
                lambda: (lambda d: d if d["EndpointStatus"] != "Updating" else None)(
                    sm.describe_endpoint(EndpointName="api-canary")
                ),
                240,
                "the alarm to roll the canary back",
            )
            rolled_back_at = len(load.statuses)
            # and then the rollback, with the alarm that caused it
            console.page.locator("body", has_text="alarm api-canary-5xx went to ALARM").wait_for(
                timeout=30_000
            )
            time.sleep(2)
        assert "step 1 of 2: " in canary_step and "Baking" in canary_step, canary_step
        assert console.errors == [], console.errors
        assert (
            described["EndpointStatus"] == "InService"
            and described["EndpointConfigName"] == "api-good-1"
        )
        assert "alarm api-canary-5xx went to ALARM" in described["FailureReason"], described[
            "FailureReason"
        ]
        failed = [index for index, status in enumerate(load.statuses) if status != 200]
        assert failed and {load.statuses[index] for index in failed} == {424}, [
            failure for failure in load.failures if not failure.startswith("424")
        ][:3]
        # the canary's window: it took about 20% of the calls
        during = load.statuses[failed[0] : failed[-1] + 1]
        assert len(failed) / len(during) < 0.45, (len(failed), len(during))
        # all back on the old fleet
        assert all(status == 200 for status in load.statuses[rolled_back_at:])

        linear = {
            "BlueGreenUpdatePolicy": {
                "TrafficRoutingConfiguration": {
                    "Type": "LINEAR",
                    "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 50},
                    "WaitIntervalInSeconds": 5,
                }
            }
        }
        steps = set()
        with Load(api_server.url, "api-canary", {}, '{"x": 1}') as load:
            sm.update_endpoint(
                EndpointName="api-canary", EndpointConfigName="api-good-2", DeploymentConfig=linear
            )

            def finished():
                described = sm.describe_endpoint(EndpointName="api-canary")
                for variant in (described.get("PendingDeploymentSummary") or {}).get(
                    "ProductionVariants", []
                ):
                    steps.update(
                        status.get("StatusMessage", "")
                        for status in variant.get("VariantStatus", [])
                    )
                return described if described["EndpointStatus"] != "Updating" else None

            described = _until(finished, 240, "the linear update to finish")
        assert described["EndpointConfigName"] == "api-good-2" and "FailureReason" not in described
        assert {
            "step 1 of 2: 50% of traffic on the new fleet",
            "step 2 of 2: 100% of traffic on the new fleet",
        } <= steps
        assert len(load.statuses) > 50 and not load.failures, load.failures[:5]
    finally:
        cw.delete_alarms(AlarmNames=["api-canary-5xx"])
        sm.delete_endpoint(EndpointName="api-canary")


def test_a_shadow_gets_its_sampled_copies_and_its_failures_cost_callers_nothing(
    api_server, clients, handler_models
):
    # Issue 45, item 3: a shadow variant whose model raises on every call gets about its weight's
    # share of copies, off the callers' path; every caller is answered by production; the shadow's
    # failures are counted as its own. Then the shadow's (fixed) model is promoted by an
    # UpdateEndpoint.
    sm, runtime, _ = clients
    cw = boto3.client(
        "cloudwatch",
        endpoint_url=api_server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )
    for model, handler in (("api-live", "echo"), ("api-shadow-bad", "faulty")):
        sm.create_model(
            ModelName=model,
            PrimaryContainer={"Image": "python", "ModelDataUrl": str(handler_models[handler])},
        )
    sm.create_endpoint_config(
        EndpointConfigName="api-shadowed",
        ProductionVariants=[
            {
                "VariantName": "Live",
                "ModelName": "api-live",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.m5.large",
            }
        ],
        ShadowProductionVariants=[
            {
                "VariantName": "Shadow",
                "ModelName": "api-shadow-bad",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.m5.large",
                "InitialVariantWeight": 0.5,
            }
        ],
    )
    sm.create_endpoint(EndpointName="api-shadow", EndpointConfigName="api-shadowed")
    try:
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-shadow", WaiterConfig=WAIT)
        started, calls = time.time(), 200
        for n in range(calls):  # every answer is production's, whatever the shadow does
            answer = runtime.invoke_endpoint(
                EndpointName="api-shadow", ContentType="application/json", Body=json.dumps({"n": n})
            )
            assert answer["InvokedProductionVariant"] == "Live"
            assert json.loads(answer["Body"].read())["body"] == json.dumps({"n": n})

        def total(metric: str, variant: str) -> float:
            return sum(
                point["Sum"]
                for point in cw.get_metric_statistics(
                    Namespace="AWS/SageMaker",
                    MetricName=metric,
                    StartTime=started - 120,
                    EndTime=time.time() + 60,
                    Period=60,
                    Statistics=["Sum"],
                    Dimensions=[
                        {"Name": "EndpointName", "Value": "api-shadow"},
                        {"Name": "VariantName", "Value": variant},
                    ],
                )["Datapoints"]
            )

        def copies_counted():
            text = httpx.get(f"{api_server.url}/metrics", timeout=30).text
            counted = {
                line.split('outcome="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("serving_shadow_copies_total")
                and 'endpoint="api-shadow"' in line
            }
            shadow = total("Invocations", "Shadow")
            done = (
                total("Invocations", "Live") == calls
                and shadow
                and shadow == total("Invocation5XXErrors", "Shadow")
            )
            return (counted, shadow) if done and sum(counted.values()) == shadow else None

        counted, shadow = _until(copies_counted, 90, "the shadow's copies to be counted")
        # 50% +- 3 standard deviations
        assert abs(shadow - calls * 0.5) <= 3 * (calls * 0.25) ** 0.5, shadow
        assert counted == {"failed": shadow}  # each one the shadow's failure, none dropped
        assert (
            total("Invocation5XXErrors", "Live") == 0 and total("Invocation4XXErrors", "Live") == 0
        )

        sm.create_model(
            ModelName="api-shadow-fixed",
            PrimaryContainer={"Image": "python", "ModelDataUrl": str(handler_models["echo"])},
        )
        sm.create_endpoint_config(
            EndpointConfigName="api-promoted",
            ProductionVariants=[
                {
                    "VariantName": "Live",
                    "ModelName": "api-shadow-fixed",
                    "InitialInstanceCount": 1,
                    "InstanceType": "ml.m5.large",
                }
            ],
        )
        sm.update_endpoint(EndpointName="api-shadow", EndpointConfigName="api-promoted")
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-shadow", WaiterConfig=WAIT)
        described = sm.describe_endpoint(EndpointName="api-shadow")
        assert (
            described["EndpointConfigName"] == "api-promoted"
            and "ShadowProductionVariants" not in described
        )
        answer = runtime.invoke_endpoint(
            EndpointName="api-shadow", ContentType="application/json", Body='{"n": 1}'
        )
        # the promoted model, which answers
        assert json.loads(answer["Body"].read())["body"] == '{"n": 1}'
    finally:
        sm.delete_endpoint(EndpointName="api-shadow")


def _control_plane(server: Served) -> psutil.Process:
    """The control plane's process: the registry's Ray worker of this module's own server."""
    found = [
        p
        for p in psutil.Process(server.process.pid).children(recursive=True)
        if " ".join(p.cmdline()).startswith("ray::Registry")
    ]
    assert len(found) == 1, found
    return found[0]


def test_the_control_plane_killed_under_load_interrupts_no_invocation(
    api_server, clients, handler_models
):
    # Issue 43: the SageMaker API, its state and its update step ran inside the gateway, on the data
    # path. They now run in the registry's process (a Serve replica of their own until issue 60):
    # killing it costs no invocation, and once Ray has restarted it the API answers with every
    # endpoint as it was (restored from its state file).
    sm, _, _ = clients
    sm.create_model(
        ModelName="api-kept-model",
        PrimaryContainer={"Image": "python", "ModelDataUrl": str(handler_models["echo"])},
    )
    sm.create_endpoint_config(
        EndpointConfigName="api-kept-config",
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": "api-kept-model",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.m5.large",
            }
        ],
    )
    sm.create_endpoint(EndpointName="api-kept", EndpointConfigName="api-kept-config")
    try:
        sm.get_waiter("endpoint_in_service").wait(EndpointName="api-kept", WaiterConfig=WAIT)
        control = _control_plane(api_server)
        with Load(api_server.url, "api-kept", {}, '{"x": 1}') as load:
            time.sleep(1)
            control.send_signal(signal.SIGKILL)
            # An API call made at once, by a client with botocore's default retries, succeeds: it
            # waits in the gateway for the restarted process (at most 60 s), or botocore retries
            # what failed.
            patient = boto3.client(
                "sagemaker",
                endpoint_url=api_server.url,
                region_name="us-east-1",
                aws_access_key_id="x",
                aws_secret_access_key="x",
            )
            assert (
                patient.describe_endpoint(EndpointName="api-kept")["EndpointStatus"] == "InService"
            )
            _until(
                lambda: (_listed(sm) or {}).get("api-kept") == "InService",
                120,
                "the API to answer again",
            )
            time.sleep(1)
        assert len(load.statuses) > 10 and not load.failures, load.failures[:5]
        assert _control_plane(api_server).pid != control.pid
    finally:
        sm.delete_endpoint(EndpointName="api-kept")


def _listed(sm) -> dict[str, str] | None:
    try:
        return {e["EndpointName"]: e["EndpointStatus"] for e in sm.list_endpoints()["Endpoints"]}
    except (ClientError, BotoCoreError):
        return None
