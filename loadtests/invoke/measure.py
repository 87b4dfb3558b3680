"""bench_invoke's own measurements: the request bodies, our two endpoints on an embedded server,
in-process timings of the work around the model, the router's HTTP client alone, and the registry's
status poll."""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from loadtests.harness.processes import BenchError, http, install_interrupts

ROOT = Path(__file__).resolve().parents[2]
IRIS_ROW = [5.1, 3.5, 1.4, 0.2]  # a setosa: every server must answer class 0
OUR_BODY = json.dumps([IRIS_ROW])
MLSERVER_BODY = json.dumps(
    {"inputs": [{"name": "predict", "shape": [1, 4], "datatype": "FP64", "data": IRIS_ROW}]}
)
JSON_HEADERS = {"Content-Type": "application/json"}
DIRECT = "bench-direct"
SERIAL = "bench-serial"


def inprocess_timings(paths: dict[str, Path]) -> dict[str, float]:
    """µs per call (best of 7 repeats of 500) of the work each server does around the same fitted
    model."""
    import joblib
    import numpy as np

    from serving.runtimes import InvocationContext, runtime_for

    model = joblib.load(paths["joblib"])
    rows = np.asarray([IRIS_ROW])
    body = OUR_BODY.encode()
    runtime = runtime_for("sklearn", paths["skops_dir"], {})
    runtime.load()

    def floor_handler():
        out = json.dumps(
            model.predict(np.asarray(json.loads(body))).tolist(), separators=(",", ":")
        )
        return out

    calls = {
        "predict (1 row, in-process)": lambda: model.predict(rows),
        "floor handler: json.loads + predict + json.dumps": floor_handler,
        "our sklearn runtime: invoke (decode, predict, encode)": lambda: runtime.invoke(
            body, "application/json", None, InvocationContext()
        ),
    }
    result = {}
    for name, call in calls.items():
        for _ in range(200):
            call()
        samples = []
        for _ in range(7):
            start = time.perf_counter_ns()
            for _ in range(500):
                call()
            samples.append((time.perf_counter_ns() - start) / 500 / 1000)
        result[name] = round(min(samples), 1)  # the least disturbed repeat, as timeit recommends
    return result


def endpoint_specs(models: Path):
    import yaml

    from serving.config.spec import parse_spec

    direct = parse_spec(
        {
            "EndpointName": DIRECT,
            "InferenceExecutionConfig": {"Mode": "Direct"},
            "Containers": [
                {
                    "ContainerHostname": "iris",
                    "Image": "sklearn",
                    "ModelDataUrl": str(models / "iris"),
                }
            ],
        }
    )
    document = yaml.safe_load((ROOT / "examples" / "serial.yaml").read_text())
    document["EndpointName"] = SERIAL
    serial = parse_spec(document, base_dir=models)
    return direct, serial


def start_ours(paths: dict[str, Path]):
    """Embedded Ray, the gateway and both endpoints, InService and routable (an entered
    EmbeddedServer), and {"base": URL, "ports": {"endpoint/container": data-port URL},
    "serial_hostnames": [...]}."""
    from serving.ray_wing import EmbeddedServer, EndpointsNotReady
    from serving.settings import ServerSettings

    direct, serial = endpoint_specs(paths["models"])
    # keep Serve's INFO lines out of the bench output
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    server = EmbeddedServer(
        [direct, serial],
        ServerSettings(host="127.0.0.1", port=0),
        ready_timeout_s=240,
        after_ray_start=install_interrupts,
    )  # ray.init installs its own handlers
    try:
        server.__enter__()
    except EndpointsNotReady as error:
        raise BenchError(str(error)) from None
    ports = {
        f"{endpoint}/{container}": urls[0]
        for (endpoint, container), urls in server.snapshot()["replicas"].items()
    }
    return server, {
        "base": server.url,
        "ports": ports,
        "serial_hostnames": [c.ContainerHostname for c in serial.Containers],
    }


def hop_headers(endpoint: str, container: str, body: str) -> Callable[[], dict[str, str]]:
    """Headers for calling a container's data port directly, signed as the gateway signs its hops
    (the port refuses anything else); a function, so that each wrk attempt gets a fresh signature
    (valid for a minute). Accept is set (and signed) so that no client adds its own."""
    from serving import protocol
    from serving.ray_wing.cluster import cluster_secret
    from serving.trust import hops, keys

    key = keys.hop_key(cluster_secret(), endpoint, container)

    def headers() -> dict[str, str]:
        plain = {"content-type": "application/json", "accept": "application/json"}
        return plain | hops.sign(key, "POST", protocol.INVOCATIONS_PATH, body.encode(), plain)

    return headers


def inline_counts(url: str, endpoint: str, container: str) -> Callable[[], tuple[int, int]]:
    """A reader of a container's (invocations, predictions run on its event loop) so far, from its
    signed `GET /_serving/stats` (`model_server.inline`: the gate that spares a fast model the
    hand-off to a thread)."""
    from serving import protocol
    from serving.ray_wing.cluster import cluster_secret
    from serving.trust import hops, keys

    key = keys.hop_key(cluster_secret(), endpoint, container)

    def read() -> tuple[int, int]:
        status, body = http(
            "GET",
            url + protocol.STATS_PATH,
            None,
            hops.sign(key, "GET", protocol.STATS_PATH, b"", {}),
        )
        if status != 200:
            raise BenchError(f"{endpoint}/{container} stats answered {status}")
        stats = json.loads(body)
        return stats["invocations"], stats["inline"]

    return read


def router_hop(url: str, body: str, seconds: float, headers: dict[str, str]) -> dict[str, float]:
    """Sequential POSTs with the router's hop client (serving.gateway.hop_client on uvloop), from a
    fresh process."""
    args = [
        sys.executable,
        "-m",
        "loadtests.harness.hop_client",
        url,
        body,
        str(seconds),
        json.dumps(headers),
    ]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 60, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise BenchError("the router hop measurement did not finish") from None
    if done.returncode != 0:
        raise BenchError(f"the router hop measurement failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_serve_status(calls: int = 7) -> dict[str, float]:
    """What the registry's status poll pays once per second: serving.ray_wing.serve_status() (the
    controller's instance details, parsed by hand), and for comparison Serve's public status API,
    which the gateway itself used to call (and which then held the gateway's GIL). Nothing when no
    container Serve runs has started Serve's controller (hosted containers need none)."""
    from serving.ray_wing.serve_status import serve_running, serve_status

    if not serve_running():
        return {}
    from ray import serve

    def timed(function) -> tuple[float, float]:
        walls, cpus = [], []
        for _ in range(calls):
            wall, cpu = time.perf_counter(), time.thread_time()
            function()
            walls.append((time.perf_counter() - wall) * 1000)
            cpus.append((time.thread_time() - cpu) * 1000)
        return round(statistics.median(walls), 1), round(statistics.median(cpus), 1)

    result: dict[str, float] = {"calls": calls}
    result["wall_ms_p50"], result["thread_cpu_ms_p50"] = timed(serve_status)
    result["public_wall_ms_p50"], result["public_thread_cpu_ms_p50"] = timed(serve.status)
    return result
