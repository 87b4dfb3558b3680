"""UpdateEndpoint through the SageMaker API under constant load, against `serving apply`'s update as
the baseline.

    .venv/bin/python -m loadtests.bench_api_update [--rate 40] [--write-docs]

One embedded server. Two endpoints serve the same one-container Python model (a few ms of work):
`apply-ep` from a spec, `api-ep` created with boto3 (create_model -> create_endpoint_config ->
create_endpoint). Each is updated once while RATE requests/s reach it over plain HTTP (no retries):
`apply-ep` by re-deploying its spec with a changed Environment (what `serving apply` does:
container-level blue/green), `api-ep` by UpdateEndpoint to a new endpoint config (a new generation
of every variant beside the old, traffic moved in one step, the old one drained). Reported per
endpoint: failed calls, p50/p99 latency before and during the update, and how long the update took
to finish (InService again); the API's as ratios to the baseline's, measured in the same run. With
--write-docs the numbers become the "Updates under load" section of docs/sagemaker-api.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    write_results,
    write_section,
)
from loadtests.harness.servers import in_process

RESULTS = ROOT / "loadtests" / "results" / "bench_api_update.json"
DOCS = ROOT / "docs" / "sagemaker-api.md"
STEADY_S, AFTER_S = 20.0, 15.0
HANDLER = """
import json, time

def input_fn(body, content_type):
    return body

def predict_fn(data, model):
    end = time.perf_counter() + 0.003
    while time.perf_counter() < end:
        pass
    return {"ok": True}

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
"""


def log(message: str) -> None:
    print(f"[bench_api_update {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Load:
    """RATE requests/s to one endpoint over plain HTTP, on two threads; each answer's time, status
    and latency."""

    def __init__(self, url: str, endpoint: str, rate: float) -> None:
        self.url, self.endpoint, self.interval = url, endpoint, 2.0 / rate
        self.samples: list[tuple[float, int, float]] = []  # (sent at, status, latency s)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    status = client.post(
                        f"/endpoints/{self.endpoint}/invocations",
                        content=b'{"x": 1}',
                        headers={"Content-Type": "application/json"},
                    ).status_code
                except httpx.HTTPError:
                    status = 0
                self.samples.append((sent, status, time.monotonic() - sent))
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - sent)))

    def window(self, start: float, end: float) -> dict[str, Any]:
        chosen = [
            (status, latency) for sent, status, latency in self.samples if start <= sent < end
        ]
        latencies = sorted(latency for status, latency in chosen if status == 200)
        return {
            "calls": len(chosen),
            "failed": sum(1 for status, _ in chosen if status != 200),
            "p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
            "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 2)
            if latencies
            else None,
        }


def run(rate: float) -> dict[str, Any]:
    import boto3
    from botocore.config import Config

    from serving.config.spec import parse_spec

    root = Path(tempfile.mkdtemp(prefix="bench-api-"))
    (root / "model" / "code").mkdir(parents=True)
    (root / "model" / "code" / "inference.py").write_text(HANDLER)
    (root / "types.json").write_text(json.dumps({"InstanceTypes": {"ml.m5.large": {"Cpus": 0.1}}}))
    container = {
        "ContainerHostname": "only",
        "Image": "python",
        "ModelDataUrl": str(root / "model"),
        "Resources": {"Cpus": 0.1},
    }
    spec = {"EndpointName": "apply-ep", "Containers": [container]}
    results: dict[str, Any] = {}
    with in_process(
        spec,
        model_roots=str(root / "model"),
        instance_types_file=str(root / "types.json"),
        state_file=str(root / "state.db"),
        allow_anonymous_api=True,
    ) as server:
        options = dict(
            endpoint_url=server.url,
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
            config=Config(retries={"max_attempts": 1}),
        )
        sm = boto3.client("sagemaker", **options)
        sm.create_model(
            ModelName="bench",
            PrimaryContainer={"Image": "python", "ModelDataUrl": str(root / "model")},
        )
        for name in ("bench-1", "bench-2"):
            sm.create_endpoint_config(
                EndpointConfigName=name,
                ProductionVariants=[
                    {
                        "VariantName": "AllTraffic",
                        "ModelName": "bench",
                        "InitialInstanceCount": 1,
                        "InstanceType": "ml.m5.large",
                    }
                ],
            )
        started = time.monotonic()
        sm.create_endpoint(EndpointName="api-ep", EndpointConfigName="bench-1")
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName="api-ep", WaiterConfig={"Delay": 0.5, "MaxAttempts": 600}
        )
        results["api_create_s"] = round(time.monotonic() - started, 2)
        log(f"api-ep InService after {results['api_create_s']} s")

        def apply_update() -> float:
            changed = {**spec, "Containers": [{**container, "Environment": {"BENCH_VERSION": "2"}}]}
            generation = server.deploy(parse_spec(changed))
            begun = time.monotonic()
            while time.monotonic() - begun < 300:
                update = server.describe().get("apply-ep", {}).get("LastUpdate") or {}
                if update.get("Generation") == generation and update.get("Status") == "Succeeded":
                    return time.monotonic() - begun
                time.sleep(0.25)
            raise RuntimeError("apply-ep's update did not finish within 300 s")

        def api_update() -> float:
            begun = time.monotonic()
            sm.update_endpoint(EndpointName="api-ep", EndpointConfigName="bench-2")
            sm.get_waiter("endpoint_in_service").wait(
                EndpointName="api-ep", WaiterConfig={"Delay": 0.25, "MaxAttempts": 1200}
            )
            return time.monotonic() - begun

        for endpoint, update in (("apply-ep", apply_update), ("api-ep", api_update)):
            with Load(server.url, endpoint, rate) as load:
                time.sleep(STEADY_S)
                began = time.monotonic()
                took = update()
                ended = time.monotonic()
                time.sleep(AFTER_S)  # past the old version's drain and deletion
            results[endpoint] = {
                "update_s": round(took, 2),
                "steady": load.window(began - STEADY_S, began),
                "during_update": load.window(began, ended),
                "after": load.window(ended, ended + AFTER_S),
            }
            log(f"{endpoint}: {json.dumps(results[endpoint])}")
    api, base = results["api-ep"], results["apply-ep"]
    results["ratios"] = {
        "update_time_api_over_apply": round(api["update_s"] / base["update_s"], 2),
        "p99_during_over_steady_api": round(
            api["during_update"]["p99_ms"] / api["steady"]["p99_ms"], 2
        ),
        "p99_during_over_steady_apply": round(
            base["during_update"]["p99_ms"] / base["steady"]["p99_ms"], 2
        ),
    }
    results["rate_per_s"] = rate
    return results


def section(results: dict[str, Any]) -> str:
    rows = []
    for endpoint, how in (("apply-ep", "`serving apply` (baseline)"), ("api-ep", "UpdateEndpoint")):
        r = results[endpoint]
        rows.append(
            f"| {how} | {r['update_s']} s | {r['steady']['p50_ms']} / {r['steady']['p99_ms']} ms | "
            f"{r['during_update']['p50_ms']} / {r['during_update']['p99_ms']} ms | "
            f"{r['steady']['failed'] + r['during_update']['failed'] + r['after']['failed']} of "
            f"{r['steady']['calls'] + r['during_update']['calls'] + r['after']['calls']} |"
        )
    ratios = results["ratios"]
    return "\n".join(
        [
            "### Updates under load (measured)",
            "",
            f"`{results['command']}` — one embedded server on this machine "
            f"({results['machine'].get('nproc')} CPUs), {results['rate_per_s']:g} requests/s of plain HTTP (no retries) to a "
            "one-container Python endpoint while it is updated; the baseline is `serving apply`'s container-level update "
            "of an identical endpoint, in the same run.",
            "",
            "| update | until InService | p50 / p99 before | p50 / p99 during | failed calls |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"UpdateEndpoint took {ratios['update_time_api_over_apply']}× as long as the baseline (it brings a whole "
            f"new generation up and waits for it to be InService); p99 during the update was "
            f"{ratios['p99_during_over_steady_api']}× its steady value (baseline: "
            f"{ratios['p99_during_over_steady_apply']}×). CreateEndpoint to InService: {results['api_create_s']} s. "
            "Results: `loadtests/results/bench_api_update.json`.",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rate", type=float, default=40.0, help="requests per second during each update"
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="replace the section in docs/sagemaker-api.md"
    )
    parser.add_argument(
        "--from-results", action="store_true", help="no run: write the docs from the last results"
    )
    args = parser.parse_args()
    if args.from_results:
        results = json.loads(RESULTS.read_text())
    else:
        results = run(args.rate)
        results["machine"] = machine_facts()
        results["command"] = command_line(__file__)
        write_results(RESULTS, results)
    print(json.dumps(results["ratios"], indent=2))
    if args.write_docs:
        write_section(
            DOCS, "bench_api_update", section(results), title="# SageMaker control-plane API"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
