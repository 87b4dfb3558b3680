"""What data capture and a shadow variant cost an invocation: p50, p99 and CPU per request at 0%,
10% and 100% capture, and with a shadow variant that gets a copy of every call (issue 45).

One embedded server, four Direct endpoints of the same scikit-learn container (bench_invoke's iris
pipeline): one without DataCaptureConfig, and three capturing Input and Output to a local folder at
0%, 10% and 100%; and two endpoints of the same model created through the SageMaker API (boto3): one
variant alone, and one variant with a shadow variant of the same model at weight 1.0 (every call
copied). wrk drives each at one connection (latency) and at 32 (throughput and CPU per request of
the gateway and the container process, from /proc), interleaved over `--rounds`; the table gives
medians and the ratio to the endpoint without capture in the same round. Capture is written by the
gateway, so its cost lands in the gateway's CPU; the table also divides that by the container
process's CPU, whose work is the same in every case, which cancels this VM's drift. What was written
is counted at the end against the gateway's own count of the 100% endpoint's invocations (each must
have its record), and the shadow's copies against the calls its endpoint answered. The shadow's
container process is a third process whose CPU per request is reported apart: it does the production
container's work again.

    python -m loadtests.bench_capture [--seconds 8] [--rounds 5] [--write-docs]

Results: loadtests/results/bench_capture.json; with --write-docs, its section of
docs/benchmarks/bench_capture.md.
"""

from __future__ import annotations

import argparse
import logging
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.harness.cpu import CpuMeter
from loadtests.harness.models import iris_models
from loadtests.harness.processes import BenchError, http, log
from loadtests.harness.proctree import gateway_and_container, process_cpu_seconds
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section
from loadtests.harness.wrk import Wrk, ensure_wrk
from loadtests.invoke.measure import JSON_HEADERS, OUR_BODY

DOCS = ROOT / "docs" / "benchmarks" / "bench_capture.md"
RESULTS = ROOT / "loadtests" / "results" / "bench_capture.json"
CASES = {"no capture": None, "capture 0%": 0, "capture 10%": 10, "capture 100%": 100}
# case -> API endpoint
API_CASES = {"API variant": "api-plain", "API variant + shadow 100%": "api-shadow"}


def api_endpoints(url: str, models: Path) -> None:
    """The two API endpoints, created as a SageMaker pipeline creates them, InService."""
    import boto3
    from botocore.config import Config

    sm = boto3.client(
        "sagemaker",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries={"max_attempts": 1}),
    )
    sm.create_model(
        ModelName="iris",
        PrimaryContainer={"Image": "sklearn", "ModelDataUrl": str(models / "iris")},
    )
    variant = {"ModelName": "iris", "InitialInstanceCount": 1, "InstanceType": "ml.m5.large"}
    sm.create_endpoint_config(
        EndpointConfigName="plain", ProductionVariants=[{"VariantName": "Live", **variant}]
    )
    sm.create_endpoint_config(
        EndpointConfigName="shadowed",
        ProductionVariants=[{"VariantName": "Live", **variant}],
        ShadowProductionVariants=[
            {"VariantName": "Shadow", "InitialVariantWeight": 1.0, **variant}
        ],
    )
    for endpoint, config in (("api-plain", "plain"), ("api-shadow", "shadowed")):
        sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=config)
    for endpoint in API_CASES.values():
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName=endpoint, WaiterConfig={"Delay": 1, "MaxAttempts": 300}
        )


def specs(models: Path, folder: Path) -> dict[str, Any]:
    from serving.config.spec import parse_spec

    found = {}
    for index, (case, percent) in enumerate(CASES.items()):
        document: dict[str, Any] = {
            "EndpointName": f"capture-{index}",
            "Containers": [
                {
                    "ContainerHostname": "iris",
                    "Image": "sklearn",
                    "ModelDataUrl": str(models / "iris"),
                }
            ],
        }
        if percent is not None:
            document["DataCaptureConfig"] = {
                "InitialSamplingPercentage": percent,
                "DestinationS3Uri": str(folder),
                "CaptureOptions": [{"CaptureMode": "InputAndOutput"}],
            }
        found[case] = parse_spec(document)
    return found


def docs_section(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        "## Measured",
        "",
        f"{meta['rounds']} interleaved rounds of {meta['case_seconds']:.0f} s per case; medians. Ratios: against the endpoint "
        "without DataCaptureConfig in the same round, then the median of those.",
        "",
        "| endpoint | p50 ms (c1) | p99 ms (c1) | p50 ratio | req/s (c32) | req/s ratio | gateway µs/request (c32) | "
        "container µs/request (c32) | shadow container µs/request (c32) | gateway CPU ratio | gateway ÷ container, ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        shadow = f"{row['shadow_us']:.0f}" if row.get("shadow_us") is not None else "—"
        lines.append(
            f"| {row['case']} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['p50_ratio']:.2f}× | {row['rps']:,.0f} "
            f"| {row['rps_ratio']:.2f}× | {row['gateway_us']:.0f} | {row['container_us']:.0f} | {shadow} | "
            f"{row['gateway_ratio']:.2f}× | {row['gateway_per_container_ratio']:.2f}× |"
        )
    lines += [
        "",
        f"Records written: {result['records_written']:,} (every call of the 100% endpoint: {result['complete']}).",
        f"Shadow copies: {result['shadow']}.",
        "",
        run_line(meta, RESULTS),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    meta = run_meta(__file__, case_seconds=args.seconds, rounds=args.rounds)
    from serving.ray_wing import EmbeddedServer, EndpointsNotReady
    from serving.settings import ServerSettings

    work = Path(tempfile.mkdtemp(prefix="bench-capture-"))
    paths = iris_models(work)
    folder = work / "captured"
    endpoints = specs(paths["models"], folder)
    # outside the model root, as the API requires
    state = Path(tempfile.mkdtemp(prefix="bench-capture-state-"))
    (state / "types.json").write_text('{"InstanceTypes": {"ml.m5.large": {"Cpus": 0.1}}}')
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        allow_anonymous_api=True,
        model_roots=str(paths["models"]),
        instance_types_file=str(state / "types.json"),
        state_file=str(state / "state.db"),
    )
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    log("starting the embedded server with four endpoints, then two through the SageMaker API ...")
    server = EmbeddedServer(list(endpoints.values()), settings, ready_timeout_s=300)
    try:
        server.__enter__()
    except EndpointsNotReady as error:
        raise BenchError(str(error)) from None
    cases = [*CASES, *API_CASES]
    runs: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    full_endpoint = next(
        spec.EndpointName for case, spec in endpoints.items() if CASES[case] == 100
    )
    # the 100% endpoint's invocations (each must have its record)
    full_calls, shadow = 0, "not counted"
    try:
        api_endpoints(server.url, paths["models"])
        wrk = Wrk(ensure_wrk(), work, CpuMeter())
        names = {**{case: spec.EndpointName for case, spec in endpoints.items()}, **API_CASES}
        url = {case: f"{server.url}/endpoints/{name}/invocations" for case, name in names.items()}
        served = {
            **{case: spec.EndpointName for case, spec in endpoints.items()},
            **{case: f"{name}@Live@1" for case, name in API_CASES.items()},
        }
        pids = {case: gateway_and_container(name) for case, name in served.items()}
        pids["API variant + shadow 100%"]["shadow"] = gateway_and_container("api-shadow@Shadow@1")[
            "container"
        ]
        script = wrk._script("POST", OUR_BODY, JSON_HEADERS)
        for case in cases:
            wrk._run(script, url[case], 8, 2)  # warm: the model on the loop, connections open
        for round_ in range(args.rounds):
            for case in cases:
                one, _ = wrk._run(script, url[case], 1, args.seconds)
                before = {name: process_cpu_seconds(pid) for name, pid in pids[case].items()}
                many, _ = wrk._run(script, url[case], 32, args.seconds)
                used = {
                    name: process_cpu_seconds(pid) - before[name]
                    for name, pid in pids[case].items()
                }
                if any(
                    stats[k]
                    for stats in (one, many)
                    for k in ("status", "timeout", "connect", "read", "write")
                ):
                    raise BenchError(f"{case}: errors under load")
                runs[case].append(
                    {
                        "p50_ms": one["p50"] / 1000,
                        "p99_ms": one["p99"] / 1000,
                        "rps": many["requests"] / (many["duration_us"] / 1e6),
                        "gateway_us": used["gateway"] / many["requests"] * 1e6,
                        "container_us": used["container"] / many["requests"] * 1e6,
                        **(
                            {"shadow_us": used["shadow"] / many["requests"] * 1e6}
                            if "shadow" in used
                            else {}
                        ),
                    }
                )
                row = runs[case][-1]
                log(
                    f"round {round_ + 1} {case:<14} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms  "
                    f"{row['rps']:6.0f} req/s  gateway {row['gateway_us']:.0f} µs  container {row['container_us']:.0f} µs"
                )
        time.sleep(3)  # the last flush
        status, text = http("GET", f"{server.url}/metrics")
        if status != 200:
            raise BenchError(f"GET /metrics answered {status}")
        pattern = rf'serving_invocations_total\{{[^}}]*endpoint="{full_endpoint}"[^}}]*\}} (\S+)'
        full_calls = int(sum(float(value) for value in re.findall(pattern, text.decode())))
        copies = {
            outcome: int(float(value))
            for outcome, value in re.findall(
                r'serving_shadow_copies_total\{[^}]*endpoint="api-shadow"[^}]*outcome="(\w+)"[^}]*\} (\S+)',
                text.decode(),
            )
        }
        answered = re.findall(
            r'serving_invocations_total\{[^}]*endpoint="api-shadow@Live@1"[^}]*\} (\S+)',
            text.decode(),
        )
        shadow = f"{copies} for {int(sum(float(value) for value in answered)):,} calls answered by the production variant"
    finally:
        server.__exit__(None, None, None)
    written = {}
    for path in folder.rglob("*.jsonl"):
        endpoint = path.relative_to(folder).parts[0]
        written[endpoint] = written.get(endpoint, 0) + len(path.read_text().splitlines())
    rows = []
    base = runs["no capture"]
    for case, samples in runs.items():

        def median(key: str) -> float:
            return statistics.median(s[key] for s in samples)

        def ratio(key: str) -> float:
            return statistics.median(s[key] / b[key] for s, b in zip(samples, base, strict=True))

        rows.append(
            {
                "case": case,
                **{
                    key: round(median(key), 3)
                    for key in ("p50_ms", "p99_ms", "rps", "gateway_us", "container_us")
                },
                **(
                    {"shadow_us": round(median("shadow_us"), 3)}
                    if "shadow_us" in samples[0]
                    else {}
                ),
                "p50_ratio": round(ratio("p50_ms"), 3),
                "rps_ratio": round(ratio("rps"), 3),
                "gateway_ratio": round(ratio("gateway_us"), 3),
                # The container's work is the same in every case, so gateway ÷ container cancels
                # this VM's drift.
                "gateway_per_container_ratio": round(
                    statistics.median(
                        (s["gateway_us"] / s["container_us"])
                        / (b["gateway_us"] / b["container_us"])
                        for s, b in zip(samples, base, strict=True)
                    ),
                    3,
                ),
            }
        )
    meta["seconds"] = round(time.monotonic() - started, 1)
    result = {
        "meta": meta,
        "rows": rows,
        "records_written": sum(written.values()),
        "written_by_endpoint": written,
        "complete": f"{written.get(full_endpoint, 0):,} records for {full_calls:,} invocations (the gateway's count)",
        "shadow": shadow,
        "runs": runs,
    }
    write_results(args.out, result)
    for row in rows:
        print(row)
    print(result["complete"])
    if args.write_docs:
        write_section(DOCS, "bench_capture", docs_section(result), title="# bench_capture")


if __name__ == "__main__":
    main()
