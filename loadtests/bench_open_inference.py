"""The Open Inference Protocol (V2 REST and gRPC) here against MLServer's, on the same scikit-learn
model (issue 46).

One embedded server with one Direct endpoint of one `sklearn` container (bench_invoke's iris
pipeline), and MLServer 1.7.1 serving the same fitted pipeline in-process (`parallel_workers: 0`,
`debug: false`: its fastest production configuration; bench_invoke measures its default worker too).
wrk drives, interleaved over `--rounds`:

- 1 row (`[1, 4]`): V2 JSON here and at MLServer; V2 with the binary tensor extension here
  (MLServer's REST has no binary extension); V2 gRPC (`raw_input_contents`) here and at MLServer;
  and InvokeEndpoint here, the same container through SageMaker's protocol. Latency at one
  connection (p50, p99), throughput and server CPU per request at 32 (here: the gateway and the
  container process; MLServer: its one process), from /proc. gRPC is driven by `harness/grpc_load`
  (one channel, 32 calls in flight), REST by wrk: compare gRPC rows with each other.
- A 1 MB tensor (65,536 × 4 FP32): V2 JSON and binary here, JSON at MLServer, one request at a time
  from httpx; gRPC here and at MLServer, one call at a time from grpc_load.

    python -m loadtests.bench_open_inference [--seconds 5] [--rounds 3] [--write-docs]

Results: loadtests/results/bench_open_inference.json; with --write-docs,
docs/benchmarks/bench_open_inference.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.harness import grpc_load
from loadtests.harness.cpu import CpuMeter
from loadtests.harness.models import MLSERVER_MODEL, iris_models
from loadtests.harness.peers import ensure_mlserver, mlserver_versions, start_mlserver
from loadtests.harness.processes import BenchError, Processes, free_port, log
from loadtests.harness.proctree import gateway_and_container, process_cpu_seconds
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section
from loadtests.harness.wrk import Wrk, ensure_wrk, lua_bytes

DOCS = ROOT / "docs" / "benchmarks" / "bench_open_inference.md"
RESULTS = ROOT / "loadtests" / "results" / "bench_open_inference.json"
MLSERVER_VENV = ROOT / ".bench" / "mlserver-venv"
ROW = [5.1, 3.5, 1.4, 0.2]
LARGE_ROWS = 65_536  # × 4 FP32 = 1 MiB of tensor data


def v2_json(rows: np.ndarray, name: str = "input-0") -> str:
    return json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "FP32",
                    "shape": list(rows.shape),
                    "data": rows.reshape(-1).tolist(),
                }
            ]
        }
    )


def v2_binary(rows: np.ndarray) -> tuple[str, dict[str, str]]:
    """The binary tensor extension as Triton's client sends it: JSON header, then the raw tensor; as
    a str of bytes 0-255 (latin-1), which the wrk script carries byte for byte."""
    data = np.ascontiguousarray(rows, dtype="<f4").tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input-0",
                    "datatype": "FP32",
                    "shape": list(rows.shape),
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }
    return (head + data).decode("latin-1"), headers


def grpc_message(rows: np.ndarray, model: str, name: str = "input-0") -> bytes:
    """A ModelInferRequest as Triton's gRPC client sends it: the tensor in raw_input_contents."""
    from serving.open_inference import grpc_messages_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype="FP32", shape=list(rows.shape))
    request.raw_input_contents.append(np.ascontiguousarray(rows, dtype="<f4").tobytes())
    return request.SerializeToString()


def timed_posts(url: str, body: bytes, headers: dict[str, str], count: int) -> list[float]:
    """Milliseconds of `count` POSTs one after another on one keep-alive connection (httpx: wrk
    cannot send a body this large with NUL bytes in it from its Lua script), each answered 200."""
    import httpx

    latencies = []
    with httpx.Client(timeout=60) as client:
        client.post(url, content=body, headers=headers)  # the connection open, the path warm
        for _ in range(count):
            sent = time.perf_counter()
            response = client.post(url, content=body, headers=headers)
            latencies.append((time.perf_counter() - sent) * 1000)
            if response.status_code != 200:
                raise BenchError(f"{url}: {response.status_code} {response.text[:300]}")
    return latencies


def docs_section(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        "## Measured",
        "",
        f"{meta['rounds']} interleaved rounds of {meta['case_seconds']:.0f} s per case; medians. MLServer "
        f"{result['mlserver_versions'].get('mlserver', '?')}, in-process (`parallel_workers: 0`), `debug: false`.",
        "",
        "| system, protocol | p50 ms (c1) | p99 ms (c1) | p50 / p99 ms (c32) | req/s (c32) | server CPU µs/request (c32) | "
        "p50 vs MLServer V2 | req/s vs MLServer V2 | CPU vs MLServer V2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['case']} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['p50_c32_ms']:.2f} / "
            f"{row['p99_c32_ms']:.2f} | {row['rps']:,.0f} | {row['cpu_us']:.0f} | "
            f"{row['p50_ratio']:.2f}× | {row['rps_ratio']:.2f}× | {row['cpu_ratio']:.2f}× |"
        )
    by_case = {row["case"]: row for row in result["rows"]}
    ours, theirs = by_case.get("serving, V2 gRPC"), by_case.get("MLServer, V2 gRPC")
    if ours and theirs:
        lines += [
            "",
            f"gRPC against MLServer's gRPC (the same driver): p50 {ours['p50_ms'] / theirs['p50_ms']:.2f}×, "
            f"req/s {ours['rps'] / theirs['rps']:.2f}×, server CPU per request {ours['cpu_us'] / theirs['cpu_us']:.2f}×.",
        ]
    lines += [
        "",
        f"A 1 MB tensor (65,536 × 4 FP32), {result['meta'].get('large_requests', '?')} requests per round one after "
        "another from httpx (REST), one call at a time for half a case's seconds from grpc_load (gRPC); client time "
        "included:",
        "",
        "| system, encoding | request bytes | p50 ms | p99 ms | p50 vs MLServer JSON |",
        "|---|---|---|---|---|",
    ]
    for row in result["large"]:
        lines.append(
            f"| {row['case']} | {row['bytes']:,} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['p50_ratio']:.2f}× |"
        )
    lines += ["", run_line(meta, RESULTS)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--large-requests", type=int, default=20, help="1 MB requests per case and round"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    meta = run_meta(
        __file__, case_seconds=args.seconds, rounds=args.rounds, large_requests=args.large_requests
    )
    from serving.config.spec import parse_spec
    from serving.ray_wing import EmbeddedServer, EndpointsNotReady
    from serving.settings import ServerSettings

    work = Path(tempfile.mkdtemp(prefix="bench-v2-"))
    paths = iris_models(work)
    spec = parse_spec(
        {
            "EndpointName": "v2-iris",
            "Containers": [
                {
                    "ContainerHostname": "iris",
                    "Image": "sklearn",
                    "ModelDataUrl": str(paths["skops_dir"]),
                }
            ],
        }
    )
    mlserver_bin = ensure_mlserver(MLSERVER_VENV)
    processes = Processes()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    log("starting MLServer (in-process) and the embedded server ...")
    mlserver_grpc = free_port()
    mlserver, mlserver_url = start_mlserver(
        processes, mlserver_bin, paths, work, {"parallel_workers": 0, "grpc_port": mlserver_grpc}
    )
    server = EmbeddedServer(
        [spec], ServerSettings(host="127.0.0.1", port=0, grpc_port=0), ready_timeout_s=300
    )
    try:
        server.__enter__()
    except EndpointsNotReady as error:
        processes.stop(mlserver)
        raise BenchError(str(error)) from None
    time.sleep(10)  # Ray's start-up work (dashboard, agents) winds down before anything is timed
    one = np.asarray([ROW], dtype=np.float32)
    large = np.random.default_rng(0).normal(5.0, 1.0, (LARGE_ROWS, 4)).astype(np.float32)
    binary_one, binary_headers = v2_binary(one)
    binary_large, large_headers = v2_binary(large)
    json_headers = {"Content-Type": "application/json"}
    ours_v2 = f"{server.url}/v2/models/v2-iris/infer"
    theirs_v2 = f"{mlserver_url}/v2/models/{MLSERVER_MODEL}/infer"
    # case -> (url, body, headers, whose processes)
    cases = {
        "MLServer, V2 JSON": (theirs_v2, v2_json(one, "predict"), json_headers, "mlserver"),
        "serving, V2 JSON": (ours_v2, v2_json(one), json_headers, "ours"),
        "serving, V2 binary": (ours_v2, binary_one, binary_headers, "ours"),
        "serving, InvokeEndpoint JSON": (
            f"{server.url}/endpoints/v2-iris/invocations",
            json.dumps([ROW]),
            json_headers,
            "ours",
        ),
    }
    large_cases = {
        "MLServer, V2 JSON": (theirs_v2, v2_json(large, "predict"), json_headers),
        "serving, V2 JSON": (ours_v2, v2_json(large), json_headers),
        "serving, V2 binary": (ours_v2, binary_large, large_headers),
    }
    # gRPC: case -> (target, message file, whose processes)
    infer_method = "/inference.GRPCInferenceService/ModelInfer"
    ours_grpc, theirs_grpc = f"127.0.0.1:{server.settings.grpc_port}", f"127.0.0.1:{mlserver_grpc}"

    def message_file(name: str, message: bytes) -> Path:
        (work / name).write_bytes(message)
        return work / name

    grpc_cases = {
        "MLServer, V2 gRPC": (
            theirs_grpc,
            message_file("theirs-1.bin", grpc_message(one, MLSERVER_MODEL, "predict")),
            "mlserver",
        ),
        "serving, V2 gRPC": (
            ours_grpc,
            message_file("ours-1.bin", grpc_message(one, "v2-iris")),
            "ours",
        ),
    }
    large_grpc = {
        "MLServer, V2 gRPC": (
            theirs_grpc,
            message_file("theirs-l.bin", grpc_message(large, MLSERVER_MODEL, "predict")),
        ),
        "serving, V2 gRPC": (ours_grpc, message_file("ours-l.bin", grpc_message(large, "v2-iris"))),
    }
    cases_all = [*cases, *grpc_cases]
    runs: dict[str, list[dict[str, float]]] = {case: [] for case in cases_all}
    large_runs: dict[str, list[dict[str, float]]] = {
        case: [] for case in [*large_cases, *large_grpc]
    }
    try:
        pids = {"ours": gateway_and_container("v2-iris"), "mlserver": {"mlserver": mlserver.pid}}
        wrk = Wrk(ensure_wrk(), work, CpuMeter(), timeout_s=30.0)

        def script(body: str, headers: dict[str, str]) -> Path:
            path = wrk._script("POST", "", headers)
            path.write_text(
                path.read_text().replace('wrk.body = ""', f"wrk.body = {lua_bytes(body)}", 1)
            )
            return path

        scripts = {case: script(body, headers) for case, (_, body, headers, _) in cases.items()}
        for case, (url, *_rest) in cases.items():
            warm, _ = wrk._run(scripts[case], url, 8, 2)
            if warm["status"] or not warm["requests"]:
                raise BenchError(f"{case}: {warm['status']} error answers while warming up")

        def measure(round_: int, case: str, whose: str, load: Any, failed: Any) -> None:
            """One case at 1 connection (latency) and 32 (latency, throughput, the servers' CPU per
            request); `load(connections)` runs it, `failed(stats)` says whether a run saw errors."""
            c1 = load(1)
            before = {name: process_cpu_seconds(pid) for name, pid in pids[whose].items()}
            c32 = load(32)
            used = sum(process_cpu_seconds(pid) - before[name] for name, pid in pids[whose].items())
            if failed(c1) or failed(c32):
                raise BenchError(f"{case}: errors under load")
            row = {
                "p50_ms": c1["p50"] / 1000,
                "p99_ms": c1["p99"] / 1000,
                "p50_c32_ms": c32["p50"] / 1000,
                "p99_c32_ms": c32["p99"] / 1000,
                "rps": c32["requests"] / (c32["duration_us"] / 1e6),
                "cpu_us": used / c32["requests"] * 1e6,
            }
            runs[case].append(row)
            log(
                f"round {round_ + 1} {case:<30} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms  "
                f"{row['rps']:6.0f} req/s  {row['cpu_us']:.0f} µs CPU/request"
            )

        wrk_failed = lambda stats: any(
            stats[k] for k in ("status", "timeout", "connect", "read", "write")
        )  # noqa: E731
        grpc_failed = lambda stats: bool(stats["errors"]) or not stats["requests"]  # noqa: E731
        for round_ in range(args.rounds):
            for case, (url, _, _, whose) in cases.items():
                run_wrk = lambda c, s=scripts[case], u=url: wrk._run(s, u, c, args.seconds)[0]  # noqa: E731
                measure(round_, case, whose, run_wrk, wrk_failed)
            for case, (target, message, whose) in grpc_cases.items():
                run_grpc = lambda c, t=target, m=message: grpc_load.run(
                    t, infer_method, m, c, args.seconds
                )  # noqa: E731
                measure(round_, case, whose, run_grpc, grpc_failed)
            for case, (target, message) in large_grpc.items():
                one_at_a_time = grpc_load.run(
                    target, infer_method, message, 1, max(2.0, args.seconds / 2)
                )
                large_runs[case].append(
                    {"p50_ms": one_at_a_time["p50"] / 1000, "p99_ms": one_at_a_time["p99"] / 1000}
                )
                log(
                    f"round {round_ + 1} 1 MB {case:<25} p50 {large_runs[case][-1]['p50_ms']:.2f} ms"
                )
            for case, (url, body, headers) in large_cases.items():
                latencies = timed_posts(url, body.encode("latin-1"), headers, args.large_requests)
                large_runs[case].append(
                    {
                        "p50_ms": float(np.percentile(latencies, 50)),
                        "p99_ms": float(np.percentile(latencies, 99)),
                    }
                )
                log(
                    f"round {round_ + 1} 1 MB {case:<25} p50 {large_runs[case][-1]['p50_ms']:.2f} ms"
                )
    finally:
        server.__exit__(None, None, None)
        processes.stop(mlserver)
    base = runs["MLServer, V2 JSON"]

    def ratio(samples: list[dict[str, float]], key: str, against: list[dict[str, float]]) -> float:
        return round(
            statistics.median(s[key] / b[key] for s, b in zip(samples, against, strict=True)), 3
        )

    rows = [
        {
            "case": case,
            **{
                key: round(statistics.median(s[key] for s in samples), 3)
                for key in ("p50_ms", "p99_ms", "p50_c32_ms", "p99_c32_ms", "rps", "cpu_us")
            },
            "p50_ratio": ratio(samples, "p50_ms", base),
            "rps_ratio": ratio(samples, "rps", base),
            "cpu_ratio": ratio(samples, "cpu_us", base),
        }
        for case, samples in runs.items()
    ]
    large_rows = [
        {
            "case": case,
            "bytes": len(large_cases[case][1].encode("latin-1"))
            if case in large_cases
            else large_grpc[case][1].stat().st_size,
            **{
                key: round(statistics.median(s[key] for s in samples), 3)
                for key in ("p50_ms", "p99_ms")
            },
            "p50_ratio": ratio(samples, "p50_ms", large_runs["MLServer, V2 JSON"]),
        }
        for case, samples in large_runs.items()
    ]
    meta["seconds"] = round(time.monotonic() - started, 1)
    result = {
        "meta": meta,
        "mlserver_versions": mlserver_versions(MLSERVER_VENV),
        "rows": rows,
        "large": large_rows,
        "runs": runs,
        "large_runs": large_runs,
    }
    write_results(args.out, result)
    for row in rows + large_rows:
        print(row)
    if args.write_docs:
        write_section(
            DOCS, "bench_open_inference", docs_section(result), title="# bench_open_inference"
        )


if __name__ == "__main__":
    main()
