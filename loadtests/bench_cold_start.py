"""A replica's cold start, per stack: from a death to the container answering again.

    .venv/bin/python -m loadtests.bench_cold_start [--rounds 2] [--write-docs]

One endpoint `coldstart`, one container per stack (python, scikit-learn, ONNX, XGBoost, PyTorch,
TensorFlow: examples/fifteen.yaml's models and an XGBoost booster trained here), one replica each,
served by `serving` on a fresh embedded Ray in a child process, twice: with stack templates (the
default) and without (`fork_templates` off: every container process a fresh interpreter), the two
servers alternating round by round. For each container, two deaths, each timed from the `SIGKILL`
to the first answer through the gateway (an invocation every 10 ms until one answers 200; with one
replica, nothing else can answer):

- `container process killed`: the model server alone dies; its supervisor starts it again in place
  (`serving.model_server.restart_budget`);
- `replica killed`: the replica's supervisor (its Ray worker) dies; Serve's controller starts a new
  replica, as it does when the autoscaler raises the count, plus the time Ray takes to see the death.

The bench signals only processes it identified as this endpoint's (a container process whose
logical parent is a Serve replica of `coldstart`, or that replica), by PID.
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
SERVERS = {"templates": True, "no templates": False}
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
    """(supervisor, container process) of `hostname`'s one replica: the container process is the
    model server whose logical parent is a Serve replica of this endpoint's application for it."""
    table = read_procs()
    prefix = f"ray::ServeReplica:{ENDPOINT}.{hostname}."
    found = [
        (parent, pid)
        for pid, (_, parent, _, cmdline, _) in table.items()
        if "serving.model_server.main" in cmdline
        and table.get(parent, ("", 0, 0, ""))[3].startswith(prefix)
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


def _serve_log(folder: Path, pattern: str, text: str, after: dt.datetime) -> dt.datetime | None:
    """The time of the first line at or after `after` that contains `text`, in Serve's log files
    `pattern` under `folder` ("INFO 2026-11-29 14:40:38,270 ..."); None if there is none yet."""
    found = []
    for path in folder.glob(pattern):
        for line in path.read_text(errors="replace").splitlines():
            if text in line:
                when = dt.datetime.strptime(" ".join(line.split()[1:3]), "%Y-%m-%d %H:%M:%S,%f")
                if when >= after:
                    found.append(when)
    return min(found) if found else None


def time_scale_out(url: str, container: dict[str, Any]) -> dict[str, Any]:
    """Invoke `container`'s scaled twin until target tracking adds its second replica; from Serve's logs: the
    controller adding it (the autoscaler's decision applied), its worker starting our constructor,
    and the constructor done (the container process serving and registered)."""
    logs = Path("/tmp/ray/session_latest/logs/serve").resolve()
    began = dt.datetime.now()
    name = scaled(container)
    target = {**container, "hostname": name}
    deployment = f"Deployment(name='{name}', app='{ENDPOINT}.{name}."
    clock = time.perf_counter()
    while True:
        if time.perf_counter() - clock > BOUND_S:
            raise RuntimeError(f"{name} did not scale out within {BOUND_S:g} s")
        answers(url, target)
        time.sleep(1 / SCALED_RATE)
        decided = _serve_log(logs, "controller_*.log", f"Adding 1 replica to {deployment}", began)
        if decided is None:
            continue
        pattern = f"replica_{ENDPOINT}.{name}.*.log"
        ready = _serve_log(logs, pattern, "Finished initializing replica.", decided)
        if ready is not None:
            break
    started = _serve_log(logs, pattern, "Started initializing replica.", decided)
    assert started is not None
    return {
        "worker_up_s": (started - decided).total_seconds(),
        "seconds": (ready - decided).total_seconds(),
    }


def run_server(chosen: list[dict[str, Any]], templates: bool) -> dict[str, dict[str, Any]]:
    timings: dict[str, dict[str, Any]] = {}
    with embedded_endpoint(spec(chosen), fork_templates=templates) as url:
        for container in chosen:
            timings[container["hostname"]] = {}
            for death in DEATHS:
                timings[container["hostname"]][death] = time_death(url, container, death)
                print(
                    f"{'templates' if templates else 'no templates'}: {container['hostname']}: "
                    f"{death}: {timings[container['hostname']][death]['seconds']:.2f} s",
                    flush=True,
                )
            scale_out = timings[container["hostname"]]["scale-out"] = time_scale_out(url, container)
            print(f"{container['hostname']}: scale-out: {scale_out}", flush=True)
    return timings


def _median(saved: dict[str, Any], server: str, hostname: str, death: str) -> float:
    return statistics.median(run[hostname][death]["seconds"] for run in saved["runs"][server])


def _replica_killed_parts(saved: dict[str, Any]) -> list[str]:
    """A killed replica's time in two parts: until its new Ray worker's process started (Serve
    noticing the death; below zero where Ray handed it an idle worker it had started before), then
    until the container answers."""
    lines = [
        "A killed replica's time, in two parts (median, range, over every container and round):",
        "",
    ]
    for server in SERVERS:
        kills = [
            run[hostname]["replica killed"]
            for run in saved["runs"][server]
            for hostname in CHOSEN
            if run[hostname]["replica killed"]["supervisor_started_s"] is not None
        ]
        noticed = [kill["supervisor_started_s"] for kill in kills]
        started = [kill["seconds"] - kill["supervisor_started_s"] for kill in kills]
        lines.append(
            f"- {server}: until the new replica's worker process started "
            f"{statistics.median(noticed):.2f} s ({min(noticed):.2f}–{max(noticed):.2f}), then to "
            f"the first answer {statistics.median(started):.2f} s ({min(started):.2f}–{max(started):.2f})."
        )
    return lines


def docs_section(saved: dict[str, Any]) -> str:
    lines = [
        "## Replica cold start, per stack",
        "",
        "Seconds from a `SIGKILL` to the container's first answer through the gateway, one replica per "
        f"container, median of {saved['rounds']} rounds (`loadtests/bench_cold_start.py` has the method). "
        "*Container process killed*: its supervisor starts it again in place. *Replica killed*: Serve "
        "starts a new replica (a Ray worker, its supervisor, then the container process), as for a "
        "scale-out. Ratio: templates against no templates, same run.",
        "",
        "| container | stack | process killed, templates | no templates | ratio "
        "| replica killed, templates | no templates | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    stacks = saved["stacks"]
    for hostname in CHOSEN:
        cells = []
        for death in DEATHS:
            forked = _median(saved, "templates", hostname, death)
            fresh = _median(saved, "no templates", hostname, death)
            cells.append(f"{forked:.2f} | {fresh:.2f} | {forked / fresh:.2f}")
        lines.append(f"| {hostname} | {stacks[hostname]} | " + " | ".join(cells) + " |")
    in_place = all(
        run[hostname]["container process killed"]["in_place"]
        for runs in saved["runs"].values()
        for run in runs
        for hostname in CHOSEN
    )
    lines += ["", *_replica_killed_parts(saved)]
    lines += [
        "",
        "## Scale-out: target tracking's second replica",
        "",
        "Each container above has a twin (`NAME-scaled`) that target tracking takes from 1 to 2 replicas "
        f"under {SCALED_RATE:g} requests/s. Seconds from Serve's controller adding the replica (its log "
        "line: the autoscaler's decision applied) to the new replica's Ray worker starting our "
        "constructor (*worker up*), and to the constructor done: the container process serving and "
        "registered (*serving*), from Serve's own logs; median of the rounds.",
        "",
        "| container | stack | worker up, templates | serving, templates | worker up, no templates "
        "| serving, no templates | ratio (serving) |",
        "|---|---|---|---|---|---|---|",
    ]
    for hostname in CHOSEN:
        row = {
            (server, key): statistics.median(
                run[hostname]["scale-out"][key] for run in saved["runs"][server]
            )
            for server in SERVERS
            for key in ("worker_up_s", "seconds")
        }
        lines.append(
            f"| {hostname} | {stacks[hostname]} | {row['templates', 'worker_up_s']:.2f} | "
            f"{row['templates', 'seconds']:.2f} | {row['no templates', 'worker_up_s']:.2f} | "
            f"{row['no templates', 'seconds']:.2f} | "
            f"{row['templates', 'seconds'] / row['no templates', 'seconds']:.2f} |"
        )
    lines += [
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
