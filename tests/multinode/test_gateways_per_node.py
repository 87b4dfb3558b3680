"""`serving up --gateways-per-node 2` on an embedded Ray: two gateway processes share the port.

Issue 43: a load balancer or a client that polls `GET /ping` from the moment `serving up` starts may
call at the first 200, on a connection either gateway accepts; and a gateway SIGKILLed under a
steady load of boto3 clients (botocore's default retry configuration) costs no call, since the other
gateway keeps the port. Runs in the multinode session (`make test`), since it starts a Ray of its
own; every process here is this test's own, stopped by its PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from processes import echo_model, free_port, listeners, stop, wait_for

pytestmark = pytest.mark.multinode

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONTAINERS = {"gw-direct": ("first", "second"), "gw-serial": ("head", "tail")}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`serving up` with both specs; yields its port and when the first GET /ping answered 200,
    after which every container of every spec was called at once (the calls' statuses)."""
    root = tmp_path_factory.mktemp("gateways")
    model = echo_model(root)
    specs = []
    for name, hosts in CONTAINERS.items():
        spec = root / f"{name}.json"
        spec.write_text(
            json.dumps(
                {
                    "EndpointName": name,
                    "InferenceExecutionConfig": {
                        "Mode": "Serial" if name == "gw-serial" else "Direct"
                    },
                    "Containers": [
                        {"ContainerHostname": host, "Image": "python", "ModelDataUrl": str(model)}
                        for host in hosts
                    ],
                }
            )
        )
        specs.append(str(spec))
    port = free_port()
    environment = {
        **os.environ,
        "SERVING_STATE_DIR": str(root / "state"),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    environment.pop("RAY_ADDRESS", None)
    log = open(root / "serving-up.log", "w")
    process = subprocess.Popen(
        [
            str(BIN / "serving"),
            "up",
            *specs,
            "--port",
            str(port),
            "--gateways-per-node",
            "2",
            "--wait-timeout",
            "300",
        ],
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: httpx.get(f"{url}/ping", timeout=5).status_code == 200,
            "GET /ping 200",
            timeout=300,
            every=0.05,
        )
        yield url, port, _first_calls(url)
    finally:
        stop(process)
        log.close()
        print((root / "serving-up.log").read_text()[-3000:])


def _first_calls(url: str) -> Counter:
    """Every container of every endpoint, each on 8 fresh connections (so both gateways take
    some)."""

    def call(target: tuple[str, str | None]) -> int | str:
        name, host = target
        headers = {"X-Amzn-SageMaker-Target-Container-Hostname": host} if host else {}
        try:
            return httpx.post(
                f"{url}/endpoints/{name}/invocations", json={"x": 1}, headers=headers, timeout=30
            ).status_code
        except httpx.HTTPError as error:
            return type(error).__name__

    targets = [("gw-direct", host) for host in CONTAINERS["gw-direct"]] + [("gw-serial", None)]
    with ThreadPoolExecutor(8) as pool:
        return Counter(pool.map(call, targets * 8))


def test_the_first_calls_after_the_first_ping_200_are_served(server) -> None:
    _, port, first = server
    assert first == Counter({200: 24}), first
    # Two gateway processes share the one port. /ping is 200 once one of them serves, and the other
    # may still be binding (hosted containers now serve before it): connections go only to gateways
    # that listen, so the calls above cannot fail on it; it binds within the bound.
    wait_for(lambda: len(listeners(port)) == 2, "two gateways listening", timeout=60)


def test_a_gateway_killed_under_boto3_load_costs_no_call(server) -> None:
    import boto3

    url, port, _ = server
    local = threading.local()  # a client per thread, with botocore's default retry configuration
    statuses: list[int | str] = []
    running = threading.Event()
    running.set()

    def caller() -> None:
        local.client = boto3.client(
            "sagemaker-runtime",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
        )
        while running.is_set():
            try:
                answer = local.client.invoke_endpoint(
                    EndpointName="gw-direct",
                    TargetContainerHostname="first",
                    ContentType="application/json",
                    Body=b'{"x": 1}',
                )
                statuses.append(answer["ResponseMetadata"]["HTTPStatusCode"])
            except Exception as error:  # what boto3 raised after its retries
                statuses.append(type(error).__name__)
            time.sleep(0.02)

    gateways = listeners(port)
    victim = min(gateways)
    threads = [threading.Thread(target=caller, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        os.kill(victim, signal.SIGKILL)  # one of this test's own server's gateways
        took = wait_for(
            lambda: len(listeners(port) - {victim}) == 2,
            "the gateway replaced",
            timeout=120,
            every=0.2,
        )
        print(f"a new gateway listened {took:.1f} s after the kill")
        time.sleep(2)
    finally:
        running.clear()
        for thread in threads:
            thread.join(30)
    failures = Counter(status for status in statuses if status != 200)
    assert failures == Counter(), failures
    assert len(statuses) > 50
