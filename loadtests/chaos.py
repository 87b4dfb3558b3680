"""Chaos under constant load: replicas, the registry and the gateway killed, one live update, on one
machine.

    .venv/bin/python -m loadtests.chaos [--rate 40] [--duration 150] [--write-docs]

Serves one Direct endpoint (three sklearn/python containers of the demo, two replicas each) on an
embedded Ray in this process, and drives it with `serving loadtest direct` (open loop, no client
retries) for the whole run, plus a second, slower stream of boto3 calls in standard retry mode (what
SageMaker advises). Meanwhile, on a fixed timetable: a random replica is killed every 20 s, the
registry actor once, the gateway once, and one update (a new environment for one container) is
applied. It reports, for each stream, requests sent and failed (by code) and p99, and for each event
how long until the endpoint was whole again. Bounded in time; not part of the test run. Results:
loadtests/results/chaos.json, and with --write-docs the "Chaos run" section of docs/reliability.md.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from loadtests.harness.loadtest import loadtest_command, read_report
from loadtests.harness.models import demo_models
from loadtests.harness.proctree import listener
from loadtests.harness.results import ROOT, write_results, write_section
from loadtests.harness.servers import in_process

RESULTS = ROOT / "loadtests" / "results" / "chaos.json"
REPLICAS = 2


def spec(models: Path, release: str = "1") -> dict:
    container = lambda host, image, model, **environment: {
        "ContainerHostname": host,
        "Image": image,
        "ModelDataUrl": str(models / model),
        "Resources": {"Cpus": 0.1},
        "AutoScaling": {"MinCapacity": REPLICAS, "MaxCapacity": REPLICAS},
        "Environment": environment,
    }
    return {
        "EndpointName": "chaos",
        "Containers": [
            container("iris", "sklearn", "iris-classifier"),
            container(
                "wine",
                "sklearn",
                "wine-classifier",
                SERVING_SKLEARN_METHOD="predict_proba",
                RELEASE=release,
            ),
            container("labels", "python", "iris-labels.tar.gz"),
        ],
    }


class RetryingStream:
    """boto3 calls in standard retry mode, one client per thread, at a fixed rate; failures by error
    code."""

    def __init__(self, url: str, rate: float) -> None:
        import boto3
        from botocore.config import Config

        self.client = lambda: boto3.client(
            "sagemaker-runtime",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
            config=Config(retries={"mode": "standard", "max_attempts": 10}),
        )
        self.period, self.latencies, self.failures, self.stop = (
            1.0 / rate,
            [],
            Counter(),
            threading.Event(),
        )
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        client = self.client()
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                client.invoke_endpoint(
                    EndpointName="chaos",
                    TargetContainerHostname="iris",
                    ContentType="application/json",
                    Body=b"[[5.1, 3.5, 1.4, 0.2]]",
                )
                self.latencies.append(time.perf_counter() - started)
            except Exception as error:
                self.failures[
                    getattr(error, "response", {}).get("Error", {}).get("Code")
                    or type(error).__name__
                ] += 1
            time.sleep(max(self.period * len(self.threads) - (time.perf_counter() - started), 0))

    def start(self) -> RetryingStream:
        for thread in self.threads:
            thread.start()
        return self

    def finish(self) -> dict:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        latencies = sorted(self.latencies)
        return {
            "requests": len(latencies) + sum(self.failures.values()),
            "failed": dict(self.failures),
            "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 1)
            if latencies
            else None,
        }


def run(rate: float, duration: float, seed: int) -> dict:
    import httpx
    import ray

    from serving import ray_wing
    from serving.config.spec import parse_spec

    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="serving-chaos-"))
    payloads = demo_models(work)
    events: list[dict] = []
    with in_process(spec(work / "models"), num_cpus=2) as server:
        url = server.url
        describe = lambda: httpx.get(f"{url}/endpoints/chaos", timeout=10).json()
        snapshot = server.snapshot
        whole = lambda: all(
            len(snapshot()["replicas"].get(("chaos", host), [])) == REPLICAS
            for host in ("iris", "wine", "labels")
        )

        report_dir = work / "loadtest"
        harness = subprocess.Popen(
            loadtest_command(
                "direct",
                f"{url}/endpoints/chaos",
                report_dir,
                "--rate",
                str(rate),
                "--duration",
                str(duration),
                *(f"--payload={host}={path}" for host, path in payloads.items()),
                "--seed",
                str(seed),
            ),
            stdout=subprocess.DEVNULL,
        )
        retrying = RetryingStream(url, rate=4).start()
        started = time.monotonic()
        at = lambda: round(time.monotonic() - started, 1)

        def recover(kind: str, detail: str, done) -> None:
            event = {"at_s": at(), "event": kind, "detail": detail, "recovered_after_s": None}
            events.append(event)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:
                try:
                    if done():
                        event["recovered_after_s"] = round(time.monotonic() - t0, 1)
                        break
                except Exception:  # the registry or the gateway may be down: that is the point
                    pass
                time.sleep(0.5)
            print(event, flush=True)

        timetable = [
            (10, "replica"),
            (30, "replica"),
            (45, "registry"),
            (60, "replica"),
            (75, "update"),
            (100, "replica"),
            (115, "gateway"),
            (130, "replica"),
        ]
        for when, kind in timetable:
            if when >= duration - 5:
                break
            time.sleep(max(when - (time.monotonic() - started), 0))
            if kind == "replica":
                host = rng.choice(("iris", "wine", "labels"))
                victim = rng.choice(snapshot()["replicas"][("chaos", host)])
                process = listener(victim)
                # the replica's supervisor (a Ray worker)
                process.parent().send_signal(signal.SIGKILL)
                recover(
                    "replica killed",
                    host,
                    lambda: whole() and victim not in snapshot()["replicas"][("chaos", host)],
                )
            elif kind == "registry":
                epoch = snapshot()["epoch"]
                ray.kill(ray_wing.registry_handle(), no_restart=False)
                recover("registry killed", "", lambda: snapshot()["epoch"] != epoch and whole())
            elif kind == "update":
                generation = server.deploy(parse_spec(spec(work / "models", release="2")))
                recover(
                    "update applied",
                    "wine: new environment",
                    lambda: (
                        describe()["LastUpdate"]["Generation"] >= generation
                        and describe()["LastUpdate"]["Status"] == "Succeeded"
                    ),
                )
            elif kind == "gateway":
                listener(url).send_signal(signal.SIGKILL)
                recover("gateway killed", "", lambda: _answers(url))
        harness.wait(timeout=duration + 120)
        load = read_report(report_dir)
        return {
            "rate": rate,
            "duration_s": duration,
            "seed": seed,
            "replicas_per_container": REPLICAS,
            "open_loop": {
                "requests": load["totals"]["requests"],
                "failed": load["totals"]["failures_by_status"],
                "failed_by_code": load["totals"]["failures_by_code"],
                "p99_ms": load["latency_ms"]["p99"],
                "dropped": load["totals"]["dropped"],
            },
            "retrying": retrying.finish(),
            "events": events,
        }


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/endpoints/chaos", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def render(result: dict) -> str:
    lines = [
        "Command: `.venv/bin/python -m loadtests.chaos --rate {rate:g} --duration {duration_s:g} --write-docs` "
        "(one run, this 2-core machine, embedded Ray; 3 containers × {replicas_per_container} replicas).".format(
            **result
        ),
        "",
        "| stream | requests | failed (by code) | p99 ms |",
        "|---|---|---|---|",
    ]
    for name, label in (
        ("open_loop", "`serving loadtest` open loop, no retries"),
        ("retrying", "boto3, standard retry mode"),
    ):
        stream = result[name]
        failed = (
            ", ".join(
                f"{code}: {count}"
                for code, count in sorted(stream.get("failed_by_code", stream["failed"]).items())
            )
            or "0"
        )
        lines.append(f"| {label} | {stream['requests']} | {failed} | {stream['p99_ms']} |")
    lines += ["", "| at (s) | event | | whole again after (s) |", "|---|---|---|---|"]
    for event in result["events"]:
        lines.append(
            f"| {event['at_s']} | {event['event']} | {event['detail']} | {event['recovered_after_s']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--duration", type=float, default=150.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    result = run(args.rate, args.duration, args.seed)
    write_results(RESULTS, result)
    print(render(result))
    if args.write_docs:
        write_section(
            ROOT / "docs" / "reliability.md", "chaos", "## Chaos run\n\n" + render(result)
        )


if __name__ == "__main__":
    main()
