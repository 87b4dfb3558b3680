"""Invocation benchmark: our endpoint against a floor and a peer, in one run on this machine.

    .venv/bin/python -m loadtests.bench_invoke [--duration S] [--out FILE.json] [--write-docs]

What it does, in order (every step bounded in time; everything it starts is stopped
at the end, also on failure, Ctrl-C or SIGTERM):

1. Trains the iris model (StandardScaler + LogisticRegression on scikit-learn's
   bundled iris) once, saves that fitted object as skops (ours) and joblib
   (floor, MLServer), and the 3-container Serial chain of examples/serial.yaml
   (examples/train_demo.py's models) into a temporary folder.
2. Times the in-process work (predict alone, the floor's handler, our runtime's
   decode/predict/encode) so that HTTP costs can be told apart from compute.
3. Peers phase: starts (a) the floor, a bare Starlette + uvicorn app calling
   predict in-process (loadtests/harness/floor_server.py), then the cheapest proxy in
   front of it (loadtests/harness/proxy_floor.py: what crossing two processes costs, as
   every request of ours does), and (b) MLServer + its scikit-learn runtime with
   default settings (in .bench/mlserver-venv, created on first use); loads each
   with wrk; stops them.
4. Ours phase: starts an embedded Ray, the endpoint server (gateway) and two
   endpoints: Direct with one container and the Serial chain with three; loads
   the direct invocation, the serial invocation and the direct container's data
   port alone (the gateway bypassed), reading around each case of the direct
   container the share of its predictions run on its event loop (its stats);
   then the floor again (sequential and c32:
   this VM's speed drifts within minutes, so every ratio against the floor uses
   the mean of its two runs); then diagnostics (gateway /ping, each serial
   container's data port, the router's own hop client alone).
5. Writes results (JSON) and, with --write-docs, its part of docs/benchmarks/bench_invoke.md.

Load: wrk, one thread; sequential = 1 connection (`-t1 -c1 --latency`), then 8
and 32 connections for throughput; each case after a short warm-up at the same
concurrency. Every case records p50/p90/p99/mean latency, req/s, error counts
(a case with any error is flagged, and its numbers are not used for verdicts)
and the CPU time each process group spent per request (from /proc).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtests.harness.cpu import CpuMeter, wait_for_quiet
from loadtests.harness.models import iris_models
from loadtests.harness.peers import (
    MLSERVER_MODEL,
    ensure_mlserver,
    mlserver_versions,
    start_floor,
    start_mlserver,
    start_proxy_floor,
)
from loadtests.harness.processes import (
    BenchError,
    Interrupted,
    Processes,
    http,
    install_interrupts,
    log,
)
from loadtests.harness.profile import profile_case
from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    our_versions,
    write_section,
)
from loadtests.harness.wrk import Case, Wrk, ensure_wrk
from loadtests.invoke.analysis import (
    FLOOR_AGAIN,
    LOADS,
    MLSERVER_VARIANTS,
    PROXY_FLOOR,
    add_noise_notes,
    analyse,
    build_breakdown_text,
)
from loadtests.invoke.docs import render_docs
from loadtests.invoke.measure import (
    DIRECT,
    JSON_HEADERS,
    MLSERVER_BODY,
    OUR_BODY,
    SERIAL,
    hop_headers,
    inline_counts,
    inprocess_timings,
    router_hop,
    start_ours,
    time_serve_status,
)
from loadtests.invoke.process_targets import H2H_LOADS, H2H_MLSERVER, H2H_OURS, h2h_load

DEFAULT_MLSERVER_VENV = ROOT / ".bench" / "mlserver-venv"
# beside the other benchmarks' results
DEFAULT_OUT = ROOT / "loadtests" / "results" / "bench_invoke.json"
DOCS_PATH = ROOT / "docs" / "benchmarks" / "bench_invoke.md"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--duration", type=float, default=15.0, help="seconds per measured case (default 15)"
    )
    parser.add_argument(
        "--warmup", type=float, help="warm-up seconds before each case (default: duration/5, 1..3)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"results JSON (default {DEFAULT_OUT.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help=f"(re)write {DOCS_PATH.relative_to(ROOT)} from this run",
    )
    parser.add_argument("--docs", type=Path, default=DOCS_PATH, help=argparse.SUPPRESS)
    parser.add_argument(
        "--mlserver-venv",
        type=Path,
        default=DEFAULT_MLSERVER_VENV,
        help=f"MLServer's virtual environment, created on first use (default "
        f"{DEFAULT_MLSERVER_VENV.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=60.0,
        metavar="S",
        help="before each case, wait up to S seconds for processes outside this run to use under "
        "--quiet-cores (default 60; 0: do not wait)",
    )
    parser.add_argument(
        "--quiet-cores",
        type=float,
        default=0.15,
        metavar="C",
        help="CPU (in cores) that other processes may use during a case before it counts as disturbed (default 0.15)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help="measure a disturbed case again up to this many times (default 2); the last attempt "
        "is kept and its disturbance reported",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="head-to-head rounds of MLServer in-process and our direct endpoint, both up, measured in turn at "
        "1 and 32 connections (default 3; 0: none)",
    )
    parser.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="skip the py-spy profiles of the gateway and container replicas",
    )
    parser.add_argument(
        "--keep-temp",
        action="store_true",
        help="keep the temporary folder (models, logs, Lua scripts)",
    )
    args = parser.parse_args(argv)
    if args.duration < 1:
        parser.error("--duration must be at least 1 second")
    if args.warmup is None:
        args.warmup = min(3.0, max(1.0, args.duration / 5))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    diag = max(2.0, args.duration / 3)
    n_main, n_diag = 5 * len(LOADS) + 2 * len(H2H_LOADS) * args.rounds, 8
    per_case = args.wait_quiet + (args.retries + 1) * (args.warmup + 20)
    budget = (
        1500
        + n_main * (per_case + (args.retries + 1) * args.duration)
        + n_diag * (per_case + (args.retries + 1) * diag)
    )
    install_interrupts()
    signal.alarm(int(budget))  # the whole run is bounded; cleanup still runs (see Interrupted)
    report: dict[str, Any] = {
        "command": command_line(__file__),
        "started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "quiet_cores": args.quiet_cores,
        "diag_duration_s": diag,
        "budget_s": int(budget),
        "machine": machine_facts(),
        "notes": [],
    }
    work = Path(tempfile.mkdtemp(prefix="bench-invoke-"))
    logs = work / "logs"
    logs.mkdir()
    processes = Processes()
    ours_server = None  # the EmbeddedServer, once started
    cases: list[Case] = []
    meter = CpuMeter()
    try:
        wrk = Wrk(
            ensure_wrk(),
            work,
            meter,
            quiet_wait=args.wait_quiet,
            quiet_threshold=args.quiet_cores,
            retries=args.retries,
        )
        report["versions"] = our_versions()
        try:  # fail before spending time on the peers if our side cannot even start
            importlib.import_module("serving.ray_wing")
        except Exception as error:
            raise BenchError(
                f"cannot import serving.ray_wing: {type(error).__name__}: {error}"
            ) from None
        mlserver_bin = ensure_mlserver(args.mlserver_venv)
        report["mlserver_versions"] = mlserver_versions(args.mlserver_venv)
        log(f"training models into {work} ...")
        paths = iris_models(work)
        if args.wait_quiet > 0:
            wait_for_quiet(meter, args.wait_quiet, args.quiet_cores, window=2.0)
        report["inprocess_us"] = inprocess_timings(paths)
        log(f"in-process µs per call: {report['inprocess_us']}")

        def load_all(system: str, url: str, body: str, headers=None, inline=None):
            """Every load on `url`; `inline`: the container's counts reader, to record the share of
            its predictions that ran on its event loop in each case (warm-up and retries
            included)."""
            for load, connections in LOADS:
                before = inline() if inline else None
                cases.append(
                    wrk.case(
                        system,
                        load,
                        connections,
                        url,
                        args.duration,
                        args.warmup,
                        body=body,
                        headers=headers or JSON_HEADERS,
                    )
                )
                if inline:
                    (calls, on_loop), (calls0, on_loop0) = inline(), before
                    share = (on_loop - on_loop0) / max(1, calls - calls0)
                    report["inline_share"][f"{system} {load}"] = round(share, 3)
                    log(
                        f"    the container ran {share:.1%} of its {calls - calls0} predictions on its event loop"
                    )

        # --- peers phase
        log("starting the floor (bare Starlette + uvicorn, predict in-process) ...")
        floor, floor_url = start_floor(processes, paths, logs)
        meter.roles[floor.pid] = "floor server"
        status, body = http("POST", floor_url + "/invocations", OUR_BODY, JSON_HEADERS)
        report["samples"] = {"floor": body.decode()}
        if status != 200 or json.loads(body) != [0]:
            raise BenchError(f"floor answered {status} {body[:200]!r}, expected [0]")
        load_all("floor", floor_url + "/invocations", OUR_BODY)
        log("starting the floor behind a proxy (two processes, as ours) ...")
        proxy, proxy_url = start_proxy_floor(processes, floor_url, logs)
        meter.roles[proxy.pid] = "proxy in front of the floor"
        status, body = http("POST", proxy_url + "/invocations", OUR_BODY, JSON_HEADERS)
        report["samples"][PROXY_FLOOR] = body.decode()
        if status != 200 or json.loads(body) != [0]:
            raise BenchError(
                f"the proxy in front of the floor answered {status} {body[:200]!r}, expected [0]"
            )
        load_all(PROXY_FLOOR, proxy_url + "/invocations", OUR_BODY)
        processes.stop(proxy)
        processes.stop(floor)

        log(
            f"starting MLServer {report['mlserver_versions'].get('mlserver')} (default settings) ..."
        )
        mlserver, mlserver_url = start_mlserver(processes, mlserver_bin, paths, logs)
        meter.roles[mlserver.pid] = "mlserver"
        infer = f"{mlserver_url}/v2/models/{MLSERVER_MODEL}/infer"
        status, body = http("POST", infer, MLSERVER_BODY, JSON_HEADERS)
        report["samples"]["MLServer"] = body.decode()
        if status != 200 or json.loads(body)["outputs"][0]["data"] != [0]:
            raise BenchError(f"MLServer answered {status} {body[:300]!r}, expected class 0")
        load_all("MLServer", infer, MLSERVER_BODY)
        processes.stop(mlserver)
        # The same MLServer with inference in its HTTP process, and with its adaptive batching on
        # (issue 18).
        for system, _, settings, model_settings in MLSERVER_VARIANTS:
            log(f"starting MLServer ({system}) ...")
            mlserver, mlserver_url = start_mlserver(
                processes, mlserver_bin, paths, logs, settings, model_settings
            )
            meter.roles[mlserver.pid] = "mlserver"
            load_all(system, f"{mlserver_url}/v2/models/{MLSERVER_MODEL}/infer", MLSERVER_BODY)
            processes.stop(mlserver)

        # --- ours
        log("starting an embedded Ray, the endpoint server and both endpoints ...")
        t0 = time.monotonic()
        ours_server, ours = start_ours(paths)
        report["ours_ready_s"] = round(time.monotonic() - t0, 1)
        log(f"ready in {report['ours_ready_s']} s: {ours['base']}; data ports {ours['ports']}")
        base = ours["base"]
        direct_url, serial_url = (f"{base}/endpoints/{n}/invocations" for n in (DIRECT, SERIAL))
        port_url = ours["ports"][f"{DIRECT}/iris"] + "/invocations"
        # the data port answers only signed hops
        port_headers = hop_headers(DIRECT, "iris", OUR_BODY)
        for name, url, headers in (
            ("direct", direct_url, lambda: JSON_HEADERS),
            ("serial", serial_url, lambda: JSON_HEADERS),
            ("container port", port_url, port_headers),
        ):
            status, body = http("POST", url, OUR_BODY, headers())
            report["samples"][f"ours: {name}"] = body.decode()
            expected = {"labels": ["setosa"]} if name == "serial" else [0]
            if status != 200 or json.loads(body) != expected:
                raise BenchError(
                    f"ours ({name}) answered {status} {body[:300]!r}, expected {expected}"
                )
        inline = inline_counts(ours["ports"][f"{DIRECT}/iris"], DIRECT, "iris")
        report["inline_share"] = {}
        load_all("ours: container data port", port_url, OUR_BODY, port_headers, inline)
        load_all("ours: direct", direct_url, OUR_BODY, inline=inline)
        load_all("ours: serial (3 containers)", serial_url, OUR_BODY)
        log("the floor again (this VM's speed drifts: ratios use the mean of both floor runs) ...")
        floor, floor_url = start_floor(processes, paths, logs)
        meter.roles[floor.pid] = "floor server"
        for load, connections in LOADS:
            if load in ("sequential", "c32"):  # the two the targets use
                cases.append(
                    wrk.case(
                        FLOOR_AGAIN,
                        load,
                        connections,
                        floor_url + "/invocations",
                        args.duration,
                        args.warmup,
                        body=OUR_BODY,
                        headers=JSON_HEADERS,
                    )
                )
        processes.stop(floor)

        if args.rounds:
            # Minutes apart, this VM's drift alone moved MLServer's CPU per request by 10% between
            # two runs: the target against it is judged on rounds in turn, each system's own
            # processes counted in its cases.
            system, _, settings, model_settings = MLSERVER_VARIANTS[0]
            log(f"head to head: {system} and ours, {args.rounds} rounds in turn ...")
            mlserver, mlserver_url = start_mlserver(
                processes, mlserver_bin, paths, logs, settings, model_settings
            )
            meter.roles[mlserver.pid] = "mlserver"
            contenders = [
                (H2H_MLSERVER, f"{mlserver_url}/v2/models/{MLSERVER_MODEL}/infer", MLSERVER_BODY),
                (H2H_OURS, direct_url, OUR_BODY),
            ]
            for round_ in range(1, args.rounds + 1):
                for load, connections in H2H_LOADS:
                    # ABBA: neither always first
                    for name, url, body in contenders if round_ % 2 else contenders[::-1]:
                        cases.append(
                            wrk.case(
                                name,
                                h2h_load(load, round_),
                                connections,
                                url,
                                args.duration,
                                args.warmup,
                                body=body,
                                headers=JSON_HEADERS,
                            )
                        )
            processes.stop(mlserver)

        log("diagnostics ...")
        cases.append(
            wrk.case(
                "ours: gateway GET /ping",
                "sequential",
                1,
                f"{base}/ping",
                diag,
                args.warmup,
                method="GET",
            )
        )
        report["serial_ports"] = {}
        body = OUR_BODY
        for hostname in ours["serial_hostnames"]:
            url = ours["ports"][f"{SERIAL}/{hostname}"] + "/invocations"
            signed = hop_headers(SERIAL, hostname, body)
            case = wrk.case(
                f"ours: serial container {hostname} port",
                "sequential",
                1,
                url,
                diag,
                args.warmup,
                body=body,
                headers=signed,
            )
            cases.append(case)
            if case.flagged is None:
                report["serial_ports"][hostname] = case.p50_ms
            status, out = http("POST", url, body, signed())
            body = out.decode()  # the next container's request, as the chain passes it
        report["router_hop"] = router_hop(port_url, OUR_BODY, diag, port_headers())
        report["serve_status_call"] = time_serve_status()
        log(f"  status poll (registry) vs serve.status(): {report['serve_status_call']}")
        log(f"  router hop → container port: {report['router_hop']}")
        if args.profile:
            log("profiles (py-spy, not measured cases) ...")
            report["profiles"] = {
                "direct": profile_case(
                    processes,
                    wrk,
                    meter,
                    {"gateway replica": "gateway", f"container iris ({DIRECT})": "container iris"},
                    direct_url,
                    OUR_BODY,
                    diag,
                    work,
                ),
                "serial": profile_case(
                    processes,
                    wrk,
                    meter,
                    {"gateway replica": "gateway"},
                    serial_url,
                    OUR_BODY,
                    diag,
                    work,
                ),
            }
            for name, prof in report["profiles"].items():
                if "skipped" in prof:
                    log(f"  {name}: profile skipped ({prof['skipped']})")
                for process_name, summary in prof.get("processes", {}).items():
                    top = ", ".join(
                        f"{b['bucket'].split(' (')[0]} {b['us_per_request']} µs"
                        for b in summary.get("buckets", [])[:4]
                    )
                    log(f"  {name} c32 ({prof['rps']} req/s while profiled), {process_name}: {top}")
    except Interrupted as why:
        report["notes"].append(f"run interrupted ({why}); results are partial")
        log(f"interrupted ({why}): stopping everything this run started ...")
        raise SystemExit(130)
    except BenchError as error:
        report["notes"].append(f"run failed: {error}")
        log(f"FAILED: {error}")
        return_code = 1
    # a bug, or serving/ not importable: still stop everything and keep the results
    except Exception as error:
        import traceback

        traceback.print_exc()
        report["notes"].append(f"run failed: {type(error).__name__}: {error}")
        log(f"FAILED: {type(error).__name__}: {error}")
        return_code = 1
    else:
        return_code = 0
    finally:
        signal.alarm(0)
        processes.stop_all()
        if ours_server is not None:
            log("shutting down Ray ...")
            try:
                ours_server.close()
            except Exception as error:
                log(f"Ray shutdown: {error}")
        if args.keep_temp:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        report["cases"] = [asdict(c) for c in cases]
        report["analysis"] = analyse(cases)
        report["breakdown_text"] = build_breakdown_text(report, cases)
        add_noise_notes(report, cases)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False))
        log(f"results: {args.out}")

    for name, verdict in report["analysis"]["targets"].items():
        met = {True: "met", False: "NOT MET", None: "not assessable"}[verdict["met"]]
        log(f"target: {name}: {met} ({verdict['detail']})")
    if args.write_docs:
        if return_code != 0:
            log("not writing docs: the run failed")
        else:
            write_section(args.docs, "bench_invoke", render_docs(report))
            log(f"wrote {args.docs}")
    if any(c.flagged for c in cases):
        log("some cases were FLAGGED (errors during load); see the report")
    return return_code


if __name__ == "__main__":
    sys.exit(main())
