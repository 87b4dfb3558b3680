"""A replica's cold start, per stack: from a death, or target tracking's decision, to the
container answering.

    .venv/bin/python -m loadtests.bench_cold_start [--rounds 2] [--write-docs]

One endpoint `coldstart`, one container per stack (python, scikit-learn, ONNX, XGBoost, PyTorch,
TensorFlow: examples/fifteen.yaml's models and an XGBoost booster trained here), one replica each,
served by `serving` on a fresh embedded Ray in a child process, twice, the two servers alternating
round by round: with container hosts (the default: the node's host supervises every replica) and
without (`node_hosts` off: each replica a Serve replica, its own Ray worker); stack templates on in
both. For each container, each timed from the `SIGKILL` to the first answer through the gateway (an
invocation every 10 ms until one answers 200; with one replica, nothing else can answer):

- `container process killed`: the model server alone dies; its supervisor starts it again in place
  (`serving.model_server.restart_budget`);
- `replica killed` (Serve replicas only): the replica's supervisor (its Ray worker) dies; Serve's
  controller starts a new replica, plus the time Ray takes to see the death. A container host
  supervises every replica of its node, so killing it is a node's loss, not a replica's
  (tests/integration/test_container_hosts.py).

Then each container's twin (`NAME-scaled`) is taken from 1 to 2 replicas by target tracking under a
trickle of requests: seconds from its autoscaler's decision (the time of its scaling activity, taken
to the millisecond where the policy runs: the registry for hosts, Serve's controller for Serve
replicas) to the bench seeing the new replica registered (`CurrentReplicas` 2 in the gateway's
`GET /endpoints/coldstart`, read every 20 ms: the gateway routes to it from then on).

The bench signals only processes it identified as this endpoint's (a container process titled
`coldstart/HOSTNAME`, forked for a Serve replica of `coldstart` or for a container host), by PID.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from loadtests.bench_container_start import containers
from loadtests.harness.cpu import read_procs
from loadtests.harness.models import hetero_models
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section
from loadtests.harness.servers import embedded_endpoint
from serving.client import Client, RetryPolicy

RESULTS = ROOT / "loadtests" / "results" / "bench_cold_start.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_cold_start.md"
ENDPOINT = "coldstart"
CHOSEN = (
    "python-labels",
    "sklearn-iris",
    "onnx-iris",
    "xgboost-cancer",
    "pytorch-script",
    "tensorflow-saved",
)
DEATHS = ("container process killed", "replica killed")
SERVERS = {"hosts": True, "serve replicas": False}  # node_hosts
# what a death of each kind needs: a replica's own supervisor to kill
DEATHS_OF = {"hosts": ("container process killed",), "serve replicas": DEATHS}
POLL_S = 0.02
# Each container has a twin that target tracking scales from 1 to 2 replicas under a trickle of
# requests (invocations per minute per replica; requests per second).
SCALED_TARGET, SCALED_RATE = 30, 5.0


def scaled(container: dict[str, Any]) -> str:
    return f"{container['hostname']}-scaled"


BOUND_S = 180.0  # a death the server does not recover from within this fails the run


def xgboost_container(folder: Path) -> dict[str, Any]:
    """A `model.tar.gz` as SageMaker's XGBoost algorithm writes it, and a CSV row for it."""
    import xgboost
    from sklearn.datasets import load_breast_cancer

    rows, labels = load_breast_cancer(return_X_y=True)
    booster = xgboost.train(
        {"objective": "binary:logistic", "max_depth": 3}, xgboost.DMatrix(rows, label=labels), 20
    )
    folder.mkdir(parents=True)
    booster.save_model(str(folder / "xgboost-model.json"))
    (folder / "xgboost-model.json").rename(folder / "xgboost-model")
    with tarfile.open(folder / "model.tar.gz", "w:gz") as tar:
        tar.add(folder / "xgboost-model", arcname="xgboost-model")
    return {
        "hostname": "xgboost-cancer",
        "image": "xgboost",
        "model_data": str(folder / "model.tar.gz"),
        "environment": {},
        "body": ",".join(f"{value:g}" for value in rows[0]),
        "content_type": "text/csv",
    }


def chosen_containers(scratch: Path) -> list[dict[str, Any]]:
    models = scratch / "models"
    hetero_models(models)
    found = {
        container["hostname"]: {
            **container,
            "environment": {
                name: value
                for name, value in container["environment"].items()
                if name not in ("SERVING_CPUS", "SERVING_GPUS")  # the spec's Resources say so
            },
            "body": json.dumps(container["request"]),
            "content_type": "application/json",
        }
        for container in containers(models)
    }
    found["xgboost-cancer"] = xgboost_container(scratch / "xgboost")
    return [found[name] for name in CHOSEN]


def spec(chosen: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "EndpointName": ENDPOINT,
        "InferenceExecutionConfig": {"Mode": "Direct"},
        "Containers": [
            {
                "ContainerHostname": container["hostname"],
                "Image": container["image"],
                "ModelDataUrl": container["model_data"],
                "Environment": container["environment"],
                "Resources": {"Cpus": 0.1},
            }
            for container in chosen
        ]
        + [
            {
                "ContainerHostname": scaled(container),
                "Image": container["image"],
                "ModelDataUrl": container["model_data"],
                "Environment": container["environment"],
                "Resources": {"Cpus": 0.1},
                "AutoScaling": {
                    "MinCapacity": 1,
                    "MaxCapacity": 2,
                    "TargetTrackingScalingPolicyConfiguration": {
                        "TargetValue": SCALED_TARGET,
                        "PredefinedMetricSpecification": {
                            "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
                        },
                        "ScaleOutCooldown": 0,
                        "DisableScaleIn": True,
                    },
                },
            }
            for container in chosen
        ],
    }


def processes_of(hostname: str) -> tuple[int, int]:
    """(supervisor, container process) of `hostname`'s one replica: the model server titled
    `coldstart/HOSTNAME` whose logical parent is a Serve replica of this endpoint's application for
    it, or a container host."""
    table = read_procs()
    serve_replica = f"ray::ServeReplica:{ENDPOINT}.{hostname}."

    def ours(cmdline: str, parent: int) -> bool:
        supervisor = table.get(parent, ("", 0, 0, ""))[3]
        if cmdline.startswith(f"serving.model_server.main {ENDPOINT}/{hostname} "):  # forked
            return supervisor.startswith((serve_replica, "ray::ContainerHost"))
        # a fresh interpreter (its stack's template was not ready) names no container: its
        # Serve replica does
        return "serving.model_server.main" in cmdline and supervisor.startswith(serve_replica)

    found = [
        (parent, pid) for pid, (_, parent, _, cmdline, _) in table.items() if ours(cmdline, parent)
    ]
    if len(found) != 1:
        raise RuntimeError(f"expected one replica of {hostname}, found {found}")
    return found[0]


def answers(url: str, container: dict[str, Any]) -> bool:
    request = urllib.request.Request(
        f"{url}/endpoints/{ENDPOINT}/invocations",
        data=container["body"].encode(),
        headers={
            "Content-Type": container["content_type"],
            "X-Amzn-SageMaker-Target-Container-Hostname": container["hostname"],
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return False


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def time_death(url: str, container: dict[str, Any], death: str) -> dict[str, Any]:
    """Kill one process of `container`'s replica; seconds until the container answers again."""
    if not answers(url, container):
        raise RuntimeError(f"{container['hostname']} does not answer before the kill")
    supervisor, process = processes_of(container["hostname"])
    victim = process if death == "container process killed" else supervisor
    killed, killed_wall = time.perf_counter(), time.time()
    os.kill(victim, signal.SIGKILL)
    # A killed supervisor's container process serves on until it sees its lifeline close: only an
    # answer once it is gone comes from the new replica.
    gone_s = None
    while True:
        if gone_s is None and not _running(process):
            gone_s = time.perf_counter() - killed
        if gone_s is not None and answers(url, container):
            break
        if time.perf_counter() - killed > BOUND_S:
            raise RuntimeError(f"{container['hostname']}: no answer {BOUND_S:g} s after the kill")
        time.sleep(0.01)
    seconds = time.perf_counter() - killed
    deadline = time.monotonic() + 30  # the dead replica's container process may still be exiting
    while True:
        try:
            new_supervisor, new_process = processes_of(container["hostname"])
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    # when the (new) supervisor's process started, after the kill (psutil: boot time + 10 ms ticks)
    since_kill = psutil.Process(new_supervisor).create_time() - killed_wall
    return {
        "seconds": seconds,
        "supervisor_started_s": since_kill if new_supervisor != supervisor else None,
        "old_process_gone_s": gone_s,
        "in_place": new_supervisor == supervisor,
        "new_process": new_process != process,
    }


def time_scale_out(url: str, container: dict[str, Any]) -> dict[str, Any]:
    """Invoke `container`'s scaled twin until target tracking has added its second replica; seconds
    from the decision (its scaling activity's time, taken where the autoscaler runs) to the bench
    seeing the new replica registered."""
    name = scaled(container)
    target = {**container, "hostname": name}
    clock = time.perf_counter()
    next_call = 0.0
    with Client(url, sign=False, retry=RetryPolicy.none(), timeout=10) as client:
        while True:
            now = time.perf_counter()
            if now - clock > BOUND_S:
                raise RuntimeError(f"{name} did not scale out within {BOUND_S:g} s")
            if now >= next_call:  # the trickle
                answers(url, target)
                next_call = now + 1 / SCALED_RATE
            described = client.describe_endpoint(ENDPOINT)
            seen = time.time()
            (twin,) = [c for c in described["Containers"] if c["ContainerHostname"] == name]
            if twin["CurrentReplicas"] >= 2:
                (out,) = [
                    a
                    for a in described["ScalingActivities"]
                    if a["ContainerHostname"] == name and a["To"] == 2
                ]
                decided = dt.datetime.fromisoformat(out["Time"].replace("Z", "+00:00"))
                return {
                    "seconds": seen - decided.timestamp(),
                    # the whole scale-out under the burst: metrics, decision, start
                    "from_first_request_s": time.perf_counter() - clock,
                }
            time.sleep(POLL_S)


def run_server(chosen: list[dict[str, Any]], hosts: bool) -> dict[str, dict[str, Any]]:
    server = "hosts" if hosts else "serve replicas"
    timings: dict[str, dict[str, Any]] = {}
    with embedded_endpoint(spec(chosen), node_hosts=hosts) as url:
        for container in chosen:
            timings[container["hostname"]] = {}
            for death in DEATHS_OF[server]:
                timings[container["hostname"]][death] = time_death(url, container, death)
                print(
                    f"{server}: {container['hostname']}: "
                    f"{death}: {timings[container['hostname']][death]['seconds']:.2f} s",
                    flush=True,
                )
            scale_out = timings[container["hostname"]]["scale-out"] = time_scale_out(url, container)
            print(f"{server}: {container['hostname']}: scale-out: {scale_out}", flush=True)
    return timings


def _median(saved: dict[str, Any], server: str, hostname: str, what: str) -> float:
    return statistics.median(run[hostname][what]["seconds"] for run in saved["runs"][server])


def _replica_killed_parts(saved: dict[str, Any]) -> list[str]:
    """A killed Serve replica's time in two parts: until its new Ray worker's process started (Serve
    noticing the death; below zero where Ray handed it an idle worker it had started before), then
    until the container answers."""
    kills = [
        run[hostname]["replica killed"]
        for run in saved["runs"]["serve replicas"]
        for hostname in CHOSEN
        if run[hostname]["replica killed"]["supervisor_started_s"] is not None
    ]
    noticed = [kill["supervisor_started_s"] for kill in kills]
    started = [kill["seconds"] - kill["supervisor_started_s"] for kill in kills]
    return [
        "A killed Serve replica's time, in two parts (median, range, over every container and round): "
        f"until the new replica's worker process started {statistics.median(noticed):.2f} s "
        f"({min(noticed):.2f}–{max(noticed):.2f}), then to the first answer "
        f"{statistics.median(started):.2f} s ({min(started):.2f}–{max(started):.2f}).",
    ]


def _burst(saved: dict[str, Any]) -> list[str]:
    """The whole scale-out under the trickle, from its first request (metrics, decision, start)."""
    parts = []
    for server in SERVERS:
        spans = [
            run[hostname]["scale-out"]["from_first_request_s"]
            for run in saved["runs"][server]
            for hostname in CHOSEN
        ]
        parts.append(
            f"{server} {statistics.median(spans):.2f} s ({min(spans):.2f}–{max(spans):.2f})"
        )
    return [
        f"Target tracking's whole scale-out under the trickle ({SCALED_RATE:g} requests/s against a "
        f"target of {SCALED_TARGET} per replica per minute), from its first request to the second "
        "replica registered (median, range, over every container and round): "
        + "; ".join(parts)
        + ".",
    ]


def docs_section(saved: dict[str, Any]) -> str:
    lines = [
        "## Replica cold start, per stack",
        "",
        "Seconds, median of "
        f"{saved['rounds']} rounds (`loadtests/bench_cold_start.py` has the method), with container "
        "hosts (the default) and with a Serve replica per container replica (`node_hosts` off), stack "
        "templates on in both; ratio: hosts against Serve replicas, same run. *Scale-out*: from target "
        "tracking's decision to the new replica registered. *Process killed*: from the `SIGKILL` of "
        "the container process to its first answer (its supervisor starts it again in place). "
        "*Replica killed*: the Serve replica's worker killed; Serve starts a new one.",
        "",
        "| container | stack | scale-out, hosts | Serve replicas | ratio "
        "| process killed, hosts | Serve replicas | replica killed, Serve replicas |",
        "|---|---|---|---|---|---|---|---|",
    ]
    stacks = saved["stacks"]
    for hostname in CHOSEN:
        out_hosts = _median(saved, "hosts", hostname, "scale-out")
        out_serve = _median(saved, "serve replicas", hostname, "scale-out")
        lines.append(
            f"| {hostname} | {stacks[hostname]} | {out_hosts:.2f} | {out_serve:.2f} | "
            f"{out_hosts / out_serve:.2f} | "
            f"{_median(saved, 'hosts', hostname, 'container process killed'):.2f} | "
            f"{_median(saved, 'serve replicas', hostname, 'container process killed'):.2f} | "
            f"{_median(saved, 'serve replicas', hostname, 'replica killed'):.2f} |"
        )
    lines += ["", *_burst(saved)]
    in_place = all(
        run[hostname]["container process killed"]["in_place"]
        for runs in saved["runs"].values()
        for run in runs
        for hostname in CHOSEN
    )
    lines += [
        "",
        *_replica_killed_parts(saved),
        "",
        "Every container process killed was started again by the same supervisor: "
        f"{'yes' if in_place else 'NO'}.",
        "",
        run_line(saved, RESULTS),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    clock = time.perf_counter()
    saved = run_meta(__file__, rounds=args.rounds)
    saved["runs"] = {server: [] for server in SERVERS}
    with tempfile.TemporaryDirectory(prefix="bench-cold-start-") as scratch:
        chosen = chosen_containers(Path(scratch))
        saved["stacks"] = {container["hostname"]: container["image"] for container in chosen}
        for round_ in range(args.rounds):
            order = list(SERVERS) if round_ % 2 == 0 else list(reversed(SERVERS))
            for server in order:
                saved["runs"][server].append(run_server(chosen, SERVERS[server]))
    saved["seconds"] = time.perf_counter() - clock
    write_results(RESULTS, saved)
    print(docs_section(saved))
    if args.write_docs:
        write_section(DOCS, "bench_cold_start", docs_section(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
