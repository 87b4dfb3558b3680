"""`serving loadtest` end to end against a tiny fake endpoint server, both in subprocesses.

Locust monkey-patches the process with gevent on import, so it never enters the pytest process:
the harness runs as `python -m serving.cli loadtest ...` and is judged by what it writes
(report.json) against what the fake server counted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A stand-in for `serving up`: the invocation, describe and /metrics routes, plus a floor route
# (POST /invocations) for --baseline and GET /counts for the test. Container "slow" sleeps 20 ms,
# "sleepy" 300 ms (counting how many it holds at once); "busy" answers every other request with
# ModelNotReadyException 429, as an overloaded replica does. Replicas of "a" grow by one per
# describe call, so the poll is visible. A request with an Authorization header is checked by the
# server's own verifier (serving.access.sigv4) against one identity: SigV4 keys AKIDLOADTEST/secret,
# API key "lt-key"; one without is let through (an endpoint without AccessControl).
FAKE_SERVER = textwrap.dedent("""
    import asyncio, hashlib, json, socket, sys
    from collections import Counter
    import uvicorn
    from prometheus_client import CollectorRegistry, Counter as Metric, generate_latest
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from serving.access.identities import Identities, Identity
    from serving.access.sigv4 import Authenticator, RawRequest
    from serving.errors import ServingError

    CONTAINERS = ["a", "b", "slow", "busy", "sleepy"]
    registry = CollectorRegistry()
    invocations = Metric("serving_invocations", "invocations", ["endpoint", "container", "model"], registry=registry)
    counts, floor, describes, sleepy = Counter(), Counter(), Counter(), Counter()

    auth = Authenticator(Identities([Identity("tester", "AKIDLOADTEST", "secret", hashlib.sha256(b"lt-key").hexdigest(), ())]), "us-east-1")

    def error(status, code, message):
        return JSONResponse({"__type": code, "message": message}, status_code=status,
                            headers={"x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/com.amazon.sagemaker/"})

    async def invoke(request):
        name = request.path_params["name"]
        body = await request.body()
        if "authorization" in request.headers:
            raw = RawRequest(request.method, request.scope["raw_path"].decode(), "",
                             tuple((k.decode(), v.decode()) for k, v in request.headers.raw), body)
            try:
                auth.authenticate(raw)
            except ServingError as failure:
                counts[("denied", "")] += 1
                return error(403, failure.code, failure.message)
        if name != "fake":
            return error(400, "ValidationError", f"Endpoint {name} not found.")
        container = request.headers.get("x-amzn-sagemaker-target-container-hostname", "")
        model = request.headers.get("x-amzn-sagemaker-target-model", "")
        if container and container not in CONTAINERS:
            return error(400, "ValidationError", f"no container {container}")
        counts[(container, model)] += 1
        invocations.labels(name, container, model).inc()
        if container == "slow":
            await asyncio.sleep(0.02)
        if container == "sleepy":
            sleepy["now"] += 1
            sleepy["peak"] = max(sleepy["peak"], sleepy["now"])
            await asyncio.sleep(0.3)
            sleepy["now"] -= 1
        if container == "busy" and counts[(container, model)] % 2 == 0:
            return error(429, "ModelNotReadyException", "busy")
        return JSONResponse([0])

    async def describe(request):
        name = request.path_params["name"]
        if name != "fake":
            return error(400, "ValidationError", f"Could not find endpoint {name}.")
        describes[name] += 1
        return JSONResponse({"EndpointName": name, "EndpointStatus": "InService",
                             "InferenceExecutionConfig": {"Mode": "Direct"},
                             "Containers": [{"ContainerHostname": c, "Mode": "SingleModel",
                                             "CurrentReplicas": 1 + (describes[name] if c == "a" else 0)}
                                            for c in CONTAINERS]})

    async def metrics(request):
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    async def floor_invoke(request):
        await request.body()
        floor["requests"] += 1
        return JSONResponse([0])

    async def show(request):
        return JSONResponse({"invocations": [[c, m, n] for (c, m), n in counts.items()], "floor": floor["requests"],
                             "sleepy_peak": sleepy["peak"]})

    app = Starlette(routes=[
        Route("/endpoints/{name}/invocations", invoke, methods=["POST"]),
        Route("/endpoints/{name}", describe), Route("/metrics", metrics),
        Route("/invocations", floor_invoke, methods=["POST"]), Route("/counts", show)])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning")).run(sockets=[sock])
""")


def _with_repo_path() -> dict[str, str]:
    """This environment, with the repository importable by a script run from a temporary folder."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = tmp_path_factory.mktemp("fake") / "fake_server.py"
    script.write_text(FAKE_SERVER)
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=_with_repo_path()
    )
    try:
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=10)


def counts(base_url: str) -> dict:
    with urllib.request.urlopen(f"{base_url}/counts", timeout=5) as response:
        return json.loads(response.read())


def total_invocations(base_url: str) -> int:
    return sum(n for _, _, n in counts(base_url)["invocations"])


def loadtest(*args: str, timeout: float = 240, **variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVING_API_KEY"))}
    # no ambient credentials: anonymous
    env["AWS_SHARED_CREDENTIALS_FILE"] = env["AWS_CONFIG_FILE"] = os.devnull
    env.update(variables)
    return subprocess.run(
        [sys.executable, "-m", "serving.cli", "loadtest", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_open_loop_direct_counts_match_the_server(fake_server: str, tmp_path: Path) -> None:
    before = total_invocations(fake_server)
    out = tmp_path / "direct"
    run = loadtest(
        "direct",
        "--endpoint",
        f"{fake_server}/endpoints/fake",
        "--rate",
        "40",
        "--duration",
        "3",
        "--weights",
        "a=1,slow=1,busy=2",
        "--poll-interval",
        "0.5",
        "--metrics-check",
        "--baseline",
        f"{fake_server}/invocations",
        "--out",
        str(out),
    )
    assert run.returncode == 0, run.stderr + run.stdout
    report = json.loads((out / "report.json").read_text())
    totals = report["totals"]
    assert totals["requests"] == 120 and totals["dropped"] == 0 and totals["unfinished"] == 0
    assert total_invocations(fake_server) - before == totals["answered"] == 120
    assert set(report["per_target"]) == {"a", "slow", "busy"}
    assert sum(t["requests"] for t in report["per_target"].values()) == 120
    assert totals["failures_by_code"].get("ModelNotReadyException", 0) == totals["failures"] > 0
    assert totals["failures_by_status"] == {"429": totals["failures"]}
    assert report["per_target"]["slow"]["latency_ms"]["p50"] >= 20
    assert (
        len(report["timeseries"]) == 3 and sum(r["requests"] for r in report["timeseries"]) == 120
    )
    assert (
        report["replicas"]["containers"]["a"][-1][1] > report["replicas"]["containers"]["a"][0][1]
    )
    check = report["metrics_check"]
    assert check["difference"] == 120 and check["matches"] is True
    assert report["baseline"]["totals"]["requests"] == 120 and report["ratios"]["p50"] is not None
    assert counts(fake_server)["floor"] >= 120
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "<script" not in html
    assert "throughput" in run.stdout and "busy" in run.stdout


def test_open_loop_does_not_wait_for_answers(fake_server: str, tmp_path: Path) -> None:
    """300 ms answers at 50 requests/s: every request leaves on schedule (about 15 in flight), none
    is skipped, and each latency counts from its intended send time. A closed loop would send 1 per
    300 ms."""
    before = total_invocations(fake_server)
    run = loadtest(
        "direct",
        "--endpoint",
        f"{fake_server}/endpoints/fake",
        "--rate",
        "50",
        "--duration",
        "2",
        "--weights",
        "sleepy=1",
        "--no-html",
        "--out",
        str(tmp_path / "open"),
    )
    assert run.returncode == 0, run.stderr + run.stdout
    report = json.loads((tmp_path / "open" / "report.json").read_text())
    assert report["totals"]["requests"] == 100 and report["totals"]["dropped"] == 0
    assert total_invocations(fake_server) - before == 100
    assert counts(fake_server)["sleepy_peak"] >= 10
    assert report["latency_ms"]["p50"] >= 300 and report["elapsed_s"] < 10  # not 100 × 300 ms


LAST_LAUNCH_SCRIPT = textwrap.dedent("""
    import locust  # noqa: F401  (gevent's patching first, as `python -m serving.loadtest` does)
    import gevent
    from types import SimpleNamespace
    from serving.client.credentials import Anonymous
    from serving.loadtest import locust_driver as runner
    from serving.loadtest.options import Plan, Prepared
    from serving.loadtest.recorder import RunResult
    from serving.loadtest.scenarios import Direct, Target

    class Hanging:  # a server that never answers: every started request stays in flight
        def request(self, *args, **kwargs):
            gevent.sleep(60)

    target = Target("a")
    plan = Plan(base_url="http://127.0.0.1:9", endpoint="e", scenario=Direct({"a": 1}), open_loop=True, level=100,
                duration=0.05, requests={target: Prepared("/x", {}, b"{}")}, auth=Anonymous())
    load = runner.Load(plan, RunResult("main"), plan.requests, plan.base_url)
    runner._Scheduler.schedule(SimpleNamespace(load=load, client=Hanging()))  # @task leaves the function as is
    print(load.schedule_done, load.launched, load.in_flight)
    load.pool.kill(block=False)
""")


def test_a_request_launched_last_counts_as_in_flight_before_it_runs(tmp_path: Path) -> None:
    """The scheduler spawns each request's greenlet and moves on; the control loop ends the run once
    the schedule is done and nothing is in flight. A request counted only when its greenlet first
    ran could be missed when both happened in one turn of the event loop: the run ended and the
    drain killed it unsent (a CI run's baseline sent 119 of its 120). Here the schedule returns
    before its last greenlet runs."""
    script = tmp_path / "last_launch.py"
    script.write_text(LAST_LAUNCH_SCRIPT)
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env=_with_repo_path(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    done, launched, in_flight = run.stdout.split()
    assert done == "True" and int(launched) == 5 and int(in_flight) == 5, run.stdout


def test_open_loop_drops_beyond_max_in_flight(fake_server: str, tmp_path: Path) -> None:
    before = total_invocations(fake_server)
    run = loadtest(
        "direct",
        "--endpoint",
        f"{fake_server}/endpoints/fake",
        "--rate",
        "50",
        "--duration",
        "2",
        "--weights",
        "sleepy=1",
        "--max-in-flight",
        "5",
        "--no-html",
        "--out",
        str(tmp_path / "bound"),
    )
    assert run.returncode == 0, run.stderr + run.stdout
    totals = json.loads((tmp_path / "bound" / "report.json").read_text())["totals"]
    # ~5 per 300 ms get through
    assert totals["requests"] + totals["dropped"] == 100 and totals["dropped"] >= 50
    assert total_invocations(fake_server) - before == totals["requests"]


def test_closed_loop_zipf_with_max_requests(fake_server: str, tmp_path: Path) -> None:
    before = counts(fake_server)["invocations"]
    out = tmp_path / "zipf"
    run = loadtest(
        "zipf",
        "--endpoint",
        f"{fake_server}/endpoints/fake",
        "--users",
        "4",
        "--duration",
        "20",
        "--max-requests",
        "200",
        "--container",
        "b",
        "--models",
        "5",
        "--no-html",
        "--out",
        str(out),
    )
    assert run.returncode == 0, run.stderr + run.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["totals"]["requests"] == 200 and report["totals"]["failures"] == 0
    assert report["elapsed_s"] < 20  # --max-requests ended it
    after = {(c, m): n for c, m, n in counts(fake_server)["invocations"]}
    for c, m, n in before:
        after[(c, m)] -= n
    per_model = {m: n for (c, m), n in after.items() if c == "b" and n}
    assert per_model == report["per_model"] and sum(per_model.values()) == 200
    assert max(per_model, key=per_model.get) == "customer-0.tar.gz"  # rank 1 is the most popular
    assert not (out / "report.html").exists()


def test_unreachable_endpoint_exits_1(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once closed
    run = loadtest(
        "direct",
        "--endpoint",
        f"http://127.0.0.1:{port}/endpoints/x",
        "--duration",
        "1",
        "--out",
        str(tmp_path / "x"),
    )
    assert run.returncode == 1
    assert "not reachable" in run.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["direct", "--weights", "a=x"], "--weights"),
        (["shift", "--from", "a", "--to", "nope"], "--to"),
        (["step"], "--steps"),
        (["direct", "--rate", "-1"], "--rate"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(fake_server: str, args: list[str], flag: str) -> None:
    run = loadtest(*args, "--endpoint", f"{fake_server}/endpoints/fake", "--duration", "1")
    assert run.returncode == 2 and f"argument {flag}" in run.stderr, run.stderr


@pytest.mark.parametrize(
    "secret, api_key, status",
    [
        ("secret", None, "ok"),
        ("wrong", None, "InvalidSignatureException"),
        (None, "lt-key", "ok"),
    ],
)
def test_credentials_are_sent_as_the_sdk_sends_them(
    fake_server: str, tmp_path: Path, secret, api_key, status
) -> None:
    """SigV4 from the AWS environment variables (verified by the server's own code), or
    --api-key."""
    variables = (
        {"AWS_ACCESS_KEY_ID": "AKIDLOADTEST", "AWS_SECRET_ACCESS_KEY": secret} if secret else {}
    )
    flags = ["--api-key", api_key] if api_key else []
    run = loadtest(
        "direct",
        "--endpoint",
        f"{fake_server}/endpoints/fake",
        "--rate",
        "20",
        "--duration",
        "1",
        "--weights",
        "a=1,b=1",
        *flags,
        "--no-html",
        "--out",
        str(tmp_path / "auth"),
        **variables,
    )
    report = json.loads((tmp_path / "auth" / "report.json").read_text())
    assert report["parameters"]["auth"] == ("BearerKey" if api_key else "SigV4")
    assert report["totals"]["requests"] == 20
    if status == "ok":
        assert run.returncode == 0 and report["totals"]["failures"] == 0, run.stderr
    else:
        assert run.returncode == 1 and report["totals"]["failures_by_code"] == {status: 20}
