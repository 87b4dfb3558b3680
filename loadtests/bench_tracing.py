"""What OpenTelemetry tracing costs per request: off, at ratio 0.01 and at 1.0, against the code
without tracing (issue 59).

Four servers, each a child process with an embedded Ray of its own (`harness.servers`), serving the
same Direct endpoint of one `sklearn` container (the iris pipeline, 1 row):

- **baseline**: this repository at the commit before tracing came (`--baseline`, default the parent
  of the commit that added `serving/tracing/spans.py`), from a git worktree made for the run;
- **off**: this checkout, no `OTEL_*` variable (the default);
- **ratio 0.01** and **ratio 1.0**: `OTEL_TRACES_SAMPLER=parentbased_traceidratio` with that
  ratio, OTLP/HTTP to a receiver in this process that reads and drops each export (as a collector
  would, its CPU is not the server's).

Each round starts the four in turn and drives each with wrk (`--connections`, `--seconds` after a
warm-up): p50/p99, throughput, and the server's CPU per request (the gateway, the container's Ray
replica and its container process, from /proc). Medians over `--rounds`; ratios against the
baseline of the same run. End to end, CPU per request is noisy at the level of a percent, so the run
also times, in this process, every call the request path makes into `tracing` when it is off, and
states their sum as a share of the baseline's CPU per request: the cost of "off" resolved below the
noise.

    python -m loadtests.bench_tracing [--rounds 3] [--seconds 8] [--write-docs]

Results: loadtests/results/bench_tracing.json; with --write-docs, docs/benchmarks/bench_tracing.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from loadtests.harness.cpu import CpuMeter
from loadtests.harness.models import iris_models
from loadtests.harness.processes import log
from loadtests.harness.results import (
    ROOT,
    run_line,
    run_meta,
    worktree,
    write_results,
    write_section,
)
from loadtests.harness.servers import embedded_endpoint
from loadtests.harness.wrk import Wrk, ensure_wrk

DOCS = ROOT / "docs" / "benchmarks" / "bench_tracing.md"
RESULTS = ROOT / "loadtests" / "results" / "bench_tracing.json"
ENDPOINT = "traced"
BODY = "[[5.1, 3.5, 1.4, 0.2]]"
SETTINGS = ("baseline", "off", "ratio 0.01", "ratio 1.0")
# the request path's processes (harness.cpu's labels: the gateway, the container's Ray replica and
# its container process); Ray's own and the load generator's are not
SERVER_LABELS = ("gateway replica", "container ")


def baseline_commit() -> str:
    """The parent of the commit that added tracing."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "serving/tracing/spans.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not added:
        raise SystemExit("no commit adds serving/tracing/spans.py: pass --baseline")
    return f"{added[-1]}^"


@contextlib.contextmanager
def sink() -> Iterator[tuple[str, dict[str, int]]]:
    """An OTLP/HTTP receiver that reads each export and drops it; its URL and counts."""
    counts = {"exports": 0, "bytes": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            size = int(self.headers.get("content-length", "0"))
            self.rfile.read(size)
            counts["exports"] += 1
            counts["bytes"] += size
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", counts
    finally:
        server.shutdown()
        server.server_close()


def environment(setting: str, collector: str) -> dict[str, str]:
    if not setting.startswith("ratio"):
        return {}
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": setting.split()[1],
    }


def off_path_ns(calls: int = 200_000) -> dict[str, float]:
    """ns per call of each `tracing` call a request makes with tracing off, timed here."""
    from serving.runtimes import InvocationContext
    from serving.runtimes.context import Headers
    from serving.tracing import spans

    assert not spans.enabled()
    headers = Headers({"content-type": "application/json"})
    context = InvocationContext()

    def timed(call: Any) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter_ns()
            for _ in range(calls):
                call()
            best = min(best, (time.perf_counter_ns() - start) / calls)
        return best

    def with_step() -> None:
        with spans.step("authenticate"):
            pass

    return {
        "begin": timed(lambda: spans.begin("InvokeEndpoint", headers)),
        "step (with)": timed(with_step),
        "hop (with)": timed(lambda: spans.hop("iris", 1).__enter__()),
        "attempt (with)": timed(lambda: spans.attempt("http://x", 1, "10.0.0.1", True).__enter__()),
        "annotate": timed(lambda: spans.annotate(spans.STATUS, 200)),
        "current_carrier": timed(spans.current_carrier),
        "container: traceparent check": timed(lambda: "traceparent" in headers),
        "container: steps check": timed(lambda: context.steps is None),
    }


# calls per request of a Direct endpoint of one container, tracing off (gateway and container)
CALLS_PER_REQUEST = {
    "begin": 1,
    "step (with)": 2,  # authenticate, read body (authorize only with AccessControl)
    "hop (with)": 1,
    "attempt (with)": 1,
    "annotate": 1,
    "current_carrier": 2,  # the hop's signature, a shadow copy's link
    "container: traceparent check": 1,
    "container: steps check": 1,
}


def measure(url: str, wrk: Wrk, setting: str, connections: int, seconds: float) -> dict[str, Any]:
    case = wrk.case(
        setting,
        f"{connections} conn",
        connections,
        f"{url}/endpoints/{ENDPOINT}/invocations",
        seconds,
        2.0,
        body=BODY,
        headers={"content-type": "application/json"},
    )
    cpu = sum(
        value for label, value in case.cpu_us_per_request.items() if label.startswith(SERVER_LABELS)
    )
    return {
        "rps": case.rps,
        "p50_ms": case.p50_ms,
        "p99_ms": case.p99_ms,
        "server_cpu_us": cpu,
        "cpu_us_by_process": case.cpu_us_per_request,
        "errors": sum(case.errors.values()),
        "disturbance_cores": case.disturbance,
    }


def docs_section(result: dict[str, Any]) -> str:
    meta, rows = result["meta"], result["medians"]
    base = rows["baseline"]
    lines = [
        "## Measured",
        "",
        f"{meta['rounds']} interleaved rounds, {meta['case_seconds']:.0f} s per case at "
        f"{meta['connections']} connections, 1 row; medians. Baseline: `{result['baseline']}`, the "
        "code before tracing, run from a git worktree in the same run.",
        "",
        "| server | req/s | p50 ms | p99 ms | server CPU µs / request | CPU vs baseline |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for setting in SETTINGS:
        row = rows[setting]
        lines.append(
            f"| {setting} | {row['rps']:.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
            f"{row['server_cpu_us']:.0f} | {row['server_cpu_us'] / base['server_cpu_us']:.3f}× |"
        )
    off = result["off_path"]
    lines += [
        "",
        f"Round-to-round spread of the baseline's CPU per request: {result['baseline_spread']:.1%} "
        "(max − min over median): the end-to-end rows cannot resolve a difference below it.",
        "",
        "**Off, resolved below the noise.** Every call the request path makes into `tracing` with "
        "tracing off, timed in one process (best of 5 × 200,000):",
        "",
        "| call | ns | per request |",
        "|---|---:|---:|",
    ]
    for name, ns in off["ns"].items():
        lines.append(f"| `{name}` | {ns:.0f} | {CALLS_PER_REQUEST[name]} |")
    lines += [
        "",
        f"Sum per request: **{off['per_request_ns']:.0f} ns**, {off['share_of_baseline']:.3%} of the "
        f"baseline's {base['server_cpu_us']:.0f} µs of server CPU per request (target: < 1 %).",
        "",
        f"Exports received at ratio 1.0: {result['exports'].get('ratio 1.0', 0)} requests, "
        f"{result['export_bytes'].get('ratio 1.0', 0) / 1e6:.1f} MB over the run.",
        "",
        run_line(meta, RESULTS),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--baseline", default=None, help="the commit without tracing")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    meta = run_meta(
        __file__, rounds=args.rounds, case_seconds=args.seconds, connections=args.connections
    )
    baseline = args.baseline or baseline_commit()
    work = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    iris = iris_models(work)["skops_dir"]
    wrk = Wrk(ensure_wrk(), work, CpuMeter(), quiet_wait=20.0, retries=1)
    runs: dict[str, list[dict[str, Any]]] = {setting: [] for setting in SETTINGS}
    exports: dict[str, int] = {}
    export_bytes: dict[str, int] = {}
    with worktree(baseline) as base_tree, sink() as (collector, counts):
        for round_number in range(1, args.rounds + 1):
            for setting in SETTINGS:
                source = base_tree if setting == "baseline" else None
                container = {"ContainerHostname": "iris", "Image": "sklearn"}
                container["ModelDataUrl"] = str(iris)
                if source is not None:  # its container process imports `serving` from there
                    container["Environment"] = {"SERVING_SANDBOX_READ": str(source)}
                spec = {"EndpointName": ENDPOINT, "Containers": [container]}
                before = dict(counts)
                log(f"round {round_number}: {setting}")
                with embedded_endpoint(
                    spec, environment=environment(setting, collector), source=source
                ) as url:
                    time.sleep(5)  # Ray's start-up work winds down
                    runs[setting].append(measure(url, wrk, setting, args.connections, args.seconds))
                exports[setting] = exports.get(setting, 0) + counts["exports"] - before["exports"]
                export_bytes[setting] = (
                    export_bytes.get(setting, 0) + counts["bytes"] - before["bytes"]
                )
    medians = {
        setting: {
            key: statistics.median(run[key] for run in rows)
            for key in rows[0]
            if key != "cpu_us_by_process"
        }
        for setting, rows in runs.items()
    }
    base_cpu = [run["server_cpu_us"] for run in runs["baseline"]]
    ns = off_path_ns()
    per_request = sum(ns[name] * CALLS_PER_REQUEST[name] for name in ns)
    meta["seconds"] = time.monotonic() - started
    result = {
        "meta": meta,
        "baseline": baseline,
        "runs": runs,
        "medians": medians,
        "baseline_spread": (max(base_cpu) - min(base_cpu)) / statistics.median(base_cpu),
        "off_path": {
            "ns": ns,
            "per_request_ns": per_request,
            "share_of_baseline": per_request / 1000 / medians["baseline"]["server_cpu_us"],
        },
        "exports": exports,
        "export_bytes": export_bytes,
    }
    write_results(RESULTS, result)
    log(docs_section(result))
    if args.write_docs:
        write_section(DOCS, "bench_tracing", docs_section(result), "# bench_tracing")


if __name__ == "__main__":
    main()
