"""bench_invoke's verdicts: ratios, per-hop costs and the issue's three targets, and the
plain-language reading of where the time goes, all computed from one run's cases."""

from __future__ import annotations

import os
import statistics
from dataclasses import replace
from typing import Any

from loadtests.harness.cpu import OTHER, run_cpu_us
from loadtests.harness.wrk import Case
from loadtests.invoke.process_targets import process_targets

LOADS = (("sequential", 1), ("c8", 8), ("c32", 32), ("c256", 256))
# MLServer besides its default (one inference worker process):
# (system, ratio key, settings.json changes, model-settings.json changes)
MLSERVER_VARIANTS = (
    ("MLServer, in-process", "mlserver_inprocess", {"parallel_workers": 0}, None),
    (
        "MLServer, adaptive batching",
        "mlserver_batching",
        None,
        {"max_batch_size": 32, "max_batch_time": 0.002},
    ),
)
MLSERVERS = ("MLServer", *(variant[0] for variant in MLSERVER_VARIANTS))
# loadtests/harness/proxy_floor.py: what two processes cost, no work of ours
PROXY_FLOOR = "floor behind a proxy"
# the floor measured once more at the end: this VM's speed drifts
FLOOR_AGAIN = "floor, again after ours"
# issue 18's targets against the floor
FLOOR_P50_TARGET, FLOOR_CPU_TARGET, SERIAL_HOP_TARGET = 2.0, 2.5, 0.5
COLLAPSE_RATIO = 0.8  # c32 below this fraction of c8 req/s counts as a throughput collapse


def _get(cases: list[Case], system: str, load: str) -> Case | None:
    return next((c for c in cases if c.system == system and c.load == load), None)


def _floor_only(again: Case, first: Case) -> Case:
    """The floor's run after ours with the CPU of its own processes only (those of its first run),
    not Ray's idle."""
    return replace(
        again,
        cpu_us_per_request={
            k: v for k, v in again.cpu_us_per_request.items() if k in first.cpu_us_per_request
        },
    )


def bracketed_floor(cases: list[Case]) -> list[Case]:
    """`cases` with each floor case replaced by the mean of it and the same load's measurement after
    ours.

    This VM's speed drifts by up to 2× within minutes, and ours are measured minutes after the
    floor: the floor is measured before and after them, and every ratio against the floor uses the
    mean of the two. Ray is up and idle during the second run; only the processes of the first (the
    floor server, wrk) count as the floor's."""
    out = []
    for case in cases:
        again = _get(cases, FLOOR_AGAIN, case.load) if case.system == "floor" else None
        if again is None or case.flagged is not None or again.flagged is not None:
            out.append(case)
            continue
        again = _floor_only(again, case)
        out.append(
            replace(
                case,
                p50_ms=(case.p50_ms + again.p50_ms) / 2,
                p99_ms=(case.p99_ms + again.p99_ms) / 2,
                rps=(case.rps + again.rps) / 2,
                cpu_us_per_request={
                    k: (v + again.cpu_us_per_request.get(k, 0.0)) / 2
                    for k, v in case.cpu_us_per_request.items()
                },
            )
        )
    return out


def server_cpu_us(case: Case) -> float:
    """CPU per request of the server's processes: everything this run started except wrk."""
    return sum(
        v for k, v in case.cpu_us_per_request.items() if k not in (OTHER, "wrk (load generator)")
    )


def analyse(cases: list[Case]) -> dict[str, Any]:
    """Ratios, per-hop costs and the three targets, all from this run's cases (the floor:
    `bracketed_floor`)."""
    measured = {(c.system, c.load): c for c in cases}
    cases = bracketed_floor(cases)

    def ok(case):
        return case is not None and case.flagged is None

    F, M, D, S, C, P = (
        "floor",
        "MLServer",
        "ours: direct",
        "ours: serial (3 containers)",
        "ours: container data port",
        "ours: gateway GET /ping",
    )
    out: dict[str, Any] = {"ratios": [], "targets": {}}
    for system in (PROXY_FLOOR, C, D, S, *MLSERVERS):
        for load, _ in LOADS:
            case, floor, peer = (
                _get(cases, system, load),
                _get(cases, F, load),
                _get(cases, M, load),
            )
            if not ok(case):
                continue
            row = {"system": system, "load": load}
            if ok(floor):
                row["p50_vs_floor"] = round(case.p50_ms / floor.p50_ms, 2)
                row["rps_vs_floor"] = round(case.rps / floor.rps, 2)
            if ok(peer) and system != M:
                row["p50_vs_mlserver"] = round(case.p50_ms / peer.p50_ms, 2)
                row["rps_vs_mlserver"] = round(case.rps / peer.rps, 2)
            for variant, key, _, _ in MLSERVER_VARIANTS:
                other = _get(cases, variant, load)
                if ok(other) and system not in MLSERVERS:
                    row[f"p50_vs_{key}"] = round(case.p50_ms / other.p50_ms, 2)
                    row[f"rps_vs_{key}"] = round(case.rps / other.rps, 2)
            out["ratios"].append(row)

    # 1. direct ahead of every MLServer configuration: sequential p50 and p99, req/s at every
    #    concurrency
    checks, details = [], []
    for peer_name in MLSERVERS:
        for load, _ in LOADS:
            d, m = _get(cases, D, load), _get(cases, peer_name, load)
            if not (ok(d) and ok(m)):
                checks.append(None)
                continue
            if load == "sequential":
                for q in ("p50_ms", "p99_ms"):
                    checks.append(getattr(d, q) < getattr(m, q))
                    details.append(
                        f"{peer_name} sequential {q[:3]} {getattr(d, q):.3f} vs {getattr(m, q):.3f} ms"
                    )
            else:
                checks.append(d.rps > m.rps)
                details.append(f"{peer_name} {load} {d.rps:.0f} vs {m.rps:.0f} req/s")
    proxy_seq, inprocess_seq = (
        _get(cases, PROXY_FLOOR, "sequential"),
        _get(cases, MLSERVER_VARIANTS[0][0], "sequential"),
    )
    # one process against two: where a one-connection row is decided
    if ok(proxy_seq) and ok(inprocess_seq):
        details.append(
            f"for reference, the floor behind a proxy (two processes, no work of ours) against "
            f"{inprocess_seq.system} (one process): sequential p50 {proxy_seq.p50_ms:.3f} vs "
            f"{inprocess_seq.p50_ms:.3f} ms"
        )
    out["targets"][
        "direct ahead of MLServer (default, in-process, adaptive batching) in every row"
    ] = {
        "met": None if None in checks else all(checks),
        "detail": "; ".join(details),
    }

    # 1b. direct against the floor: sequential p50 and the servers' CPU per request at c32 (wrk and
    # others excluded)
    floor_seq, d_seq = _get(cases, F, "sequential"), _get(cases, D, "sequential")
    floor_c32, d_c32 = _get(cases, F, "c32"), _get(cases, D, "c32")
    if all(ok(c) for c in (floor_seq, d_seq, floor_c32, d_c32)):
        p50_ratio = d_seq.p50_ms / floor_seq.p50_ms
        ours_cpu, floor_cpu = server_cpu_us(d_c32), server_cpu_us(floor_c32)
        cpu_ratio = ours_cpu / floor_cpu if floor_cpu else float("inf")
        out["floor"] = {
            "p50_ratio": round(p50_ratio, 2),
            "cpu_ratio": round(cpu_ratio, 2),
            "ours_cpu_us": round(ours_cpu),
            "floor_cpu_us": round(floor_cpu),
        }
        detail = (
            f"sequential p50 {d_seq.p50_ms:.3f} vs {floor_seq.p50_ms:.3f} ms = {p50_ratio:.2f}×; server CPU "
            f"per request at c32 {ours_cpu:.0f} vs {floor_cpu:.0f} µs = {cpu_ratio:.2f}×"
        )
        before, after = measured.get((F, "sequential")), measured.get((FLOOR_AGAIN, "sequential"))
        before32, after32 = measured.get((F, "c32")), measured.get((FLOOR_AGAIN, "c32"))
        if all(ok(c) for c in (before, after, before32, after32)):
            again_cpu = server_cpu_us(_floor_only(after32, before32))
            detail += (
                f" (the floor: the mean of its runs before and after ours, p50 {before.p50_ms:.3f} and "
                f"{after.p50_ms:.3f} ms, CPU {server_cpu_us(before32):.0f} and {again_cpu:.0f} µs)"
            )
        proxy_seq, proxy_c32 = (
            _get(cases, PROXY_FLOOR, "sequential"),
            _get(cases, PROXY_FLOOR, "c32"),
        )
        if ok(proxy_seq) and ok(proxy_c32):
            # What two processes cost with no work of ours: the part of the ratios no change of ours
            # can remove.
            proxy_cpu = server_cpu_us(proxy_c32)
            out["floor"].update(
                {
                    "proxy_p50_ratio": round(proxy_seq.p50_ms / floor_seq.p50_ms, 2),
                    "proxy_cpu_ratio": round(proxy_cpu / floor_cpu, 2) if floor_cpu else None,
                    "ours_over_proxy_p50": round(d_seq.p50_ms / proxy_seq.p50_ms, 2),
                    "ours_over_proxy_cpu": round(ours_cpu / proxy_cpu, 2) if proxy_cpu else None,
                }
            )
            detail += (
                f"; the floor behind a proxy (two processes, no work of ours): p50 {proxy_seq.p50_ms:.3f} ms = "
                f"{proxy_seq.p50_ms / floor_seq.p50_ms:.2f}× the floor, CPU {proxy_cpu:.0f} µs = "
                f"{out['floor']['proxy_cpu_ratio']:.2f}×; ours over it: p50 "
                f"{out['floor']['ours_over_proxy_p50']:.2f}×, CPU {out['floor']['ours_over_proxy_cpu']:.2f}×"
            )
        out["targets"][
            f"direct p50 ≤ {FLOOR_P50_TARGET:g}× and CPU per request ≤ {FLOOR_CPU_TARGET:g}× the floor"
        ] = {
            "met": p50_ratio <= FLOOR_P50_TARGET and cpu_ratio <= FLOOR_CPU_TARGET,
            "detail": detail,
        }

    # 2. serial: each container adds at most one hop's cost (beyond its own work)
    s_seq, p_seq, c_seq = (
        _get(cases, S, "sequential"),
        _get(cases, P, "sequential"),
        _get(cases, C, "sequential"),
    )
    ports = [
        c
        for c in cases
        if c.system.startswith("ours: serial container ") and c.load == "sequential"
    ]
    if (
        all(ok(c) for c in (s_seq, d_seq, p_seq, c_seq))
        and len(ports) == 3
        and all(ok(c) for c in ports)
    ):
        work = sum(c.p50_ms for c in ports)
        # direct: gateway beyond HTTP, minus the container
        hop = d_seq.p50_ms - p_seq.p50_ms - c_seq.p50_ms
        # serial: the same, per container of the chain
        per_container = (s_seq.p50_ms - p_seq.p50_ms - work) / 3
        gross_added = (s_seq.p50_ms - d_seq.p50_ms) / 2
        gross_hop = d_seq.p50_ms - p_seq.p50_ms
        out["hop"] = {
            "gateway_ping_ms": p_seq.p50_ms,
            "direct_ms": d_seq.p50_ms,
            "serial_ms": s_seq.p50_ms,
            "container_port_ms": c_seq.p50_ms,
            "serial_ports_ms": {c.system.split()[3]: c.p50_ms for c in ports},
            "hop_overhead_direct_ms": round(hop, 3),
            "hop_overhead_serial_ms": round(per_container, 3),
            "gross_added_per_container_ms": round(gross_added, 3),
            "gross_hop_ms": round(gross_hop, 3),
        }
        c32_d, c32_s = _get(cases, D, "c32"), _get(cases, S, "c32")
        if ok(c32_d) and ok(c32_s):
            gw_d = c32_d.cpu_us_per_request.get("gateway replica", 0.0)
            gw_s = c32_s.cpu_us_per_request.get("gateway replica", 0.0)
            out["hop"].update(
                {
                    "gateway_cpu_us_direct": round(gw_d),
                    "gateway_cpu_us_serial": round(gw_s),
                    "gateway_cpu_us_per_added_hop": round((gw_s - gw_d) / 2),
                }
            )
        out["targets"]["serial adds at most one hop per container"] = {
            "met": per_container <= hop,
            "detail": f"per container, net of the containers' own work: (serial {s_seq.p50_ms:.3f} − ping "
            f"{p_seq.p50_ms:.3f} − Σ container ports {work:.3f}) / 3 = {per_container:.3f} ms vs one hop on "
            f"the direct path (direct {d_seq.p50_ms:.3f} − ping {p_seq.p50_ms:.3f} − container port "
            f"{c_seq.p50_ms:.3f}) = {hop:.3f} ms; gross: (serial − direct) / 2 = {gross_added:.3f} ms vs "
            f"direct − ping = {gross_hop:.3f} ms (sequential p50)",
        }
        if ok(floor_seq):
            # Issue 18: what each container beyond the first adds, net of its own work, against what
            # one direct call adds over the floor (the whole per-call overhead of our path: gateway,
            # hop, container app).
            extra = ((s_seq.p50_ms - work) - (d_seq.p50_ms - c_seq.p50_ms)) / 2
            overhead = d_seq.p50_ms - floor_seq.p50_ms
            out["hop"].update(
                {"extra_container_ms": round(extra, 3), "direct_over_floor_ms": round(overhead, 3)}
            )
            out["targets"][
                f"each extra serial container adds ≤ {SERIAL_HOP_TARGET:g}× a direct call's overhead"
            ] = {
                "met": overhead > 0 and extra <= SERIAL_HOP_TARGET * overhead,
                "detail": f"((serial {s_seq.p50_ms:.3f} − Σ container ports {work:.3f}) − (direct {d_seq.p50_ms:.3f} − "
                f"its container port {c_seq.p50_ms:.3f})) / 2 = {extra:.3f} ms per extra container vs direct "
                f"− floor {floor_seq.p50_ms:.3f} = {overhead:.3f} ms: "
                f"{extra / overhead if overhead > 0 else float('inf'):.2f}× (sequential p50)",
            }
    else:
        out["targets"]["serial adds at most one hop per container"] = {
            "met": None,
            "detail": "cases missing or flagged",
        }

    out["targets"].update(
        process_targets(
            lambda system, load: _get(cases, system, load), server_cpu_us, MLSERVERS[1], cases
        )
    )

    # 3. no throughput collapse at 32 connections
    verdicts, details = [], []
    for system in (C, D, S):
        c8, c32 = _get(cases, system, "c8"), _get(cases, system, "c32")
        if c8 is None or c32 is None:
            continue
        good = ok(c8) and ok(c32) and c32.rps >= COLLAPSE_RATIO * c8.rps
        verdicts.append(good)
        details.append(
            f"{system}: c32/c8 = {c32.rps / c8.rps if c8.rps else 0:.2f}"
            + ("" if ok(c32) else f" ({c32.flagged})")
        )
    out["targets"]["no throughput collapse at 32 connections"] = {
        "met": all(verdicts) if verdicts else None,
        "detail": "; ".join(details)
        + f" (collapse: c32 below {COLLAPSE_RATIO:g}× c8 or any error)",
    }
    return out


def build_breakdown_text(report: dict[str, Any], cases: list[Case]) -> list[str]:
    """Plain-language reading of the numbers, computed from them."""
    out = []
    cases = bracketed_floor(cases)

    def get(system, load):
        case = _get(cases, system, load)
        return case if case is not None and case.flagged is None else None

    floor, port, direct, serial, ping, peer = (
        get(s, "sequential")
        for s in (
            "floor",
            "ours: container data port",
            "ours: direct",
            "ours: serial (3 containers)",
            "ours: gateway GET /ping",
            "MLServer",
        )
    )
    timings = report.get("inprocess_us", {})
    predict = timings.get("predict (1 row, in-process)")
    if predict and floor:
        out.append(
            f"- The model dominates: `predict` on one row takes {predict / 1000:.3f} ms in-process here "
            f"({predict / 1000 / floor.p50_ms:.0%} of the floor's {floor.p50_ms:.3f} ms), mostly scikit-learn's "
            "per-call input validation. Every server pays it once per request (three times for the chain)."
        )
    proxy = get(PROXY_FLOOR, "sequential")
    if floor and proxy:
        text = (
            f"- Two processes cost {proxy.p50_ms - floor.p50_ms:+.3f} ms before any work of ours: the floor behind "
            f"the cheapest proxy (`loadtests/harness/proxy_floor.py`: uvicorn + Starlette in, the hop client out, nothing "
            f"else) answers in {proxy.p50_ms:.3f} ms, {proxy.p50_ms / floor.p50_ms:.2f}× the floor. Our gateway "
            "runs apart from the containers (they run tenant code in a sandbox; it holds the keys), so every "
            "request of ours pays that"
        )
        if direct:
            text += (
                f"; the direct path's {direct.p50_ms:.3f} ms is {direct.p50_ms / proxy.p50_ms:.2f}× it, and the "
                f"{direct.p50_ms - proxy.p50_ms:.3f} ms between them is our gateway's and container's own work "
                "(authentication, routing, the signed hop and its check, the SageMaker hooks, metrics)"
            )
        out.append(text + ".")
    if floor and port:
        out.append(
            f"- The container's data port costs {port.p50_ms - floor.p50_ms:+.3f} ms over the floor "
            f"({port.p50_ms:.3f} vs {floor.p50_ms:.3f} ms): our container app (Starlette routing, the "
            "hop signature check, the runtime's SageMaker hooks, concurrency bookkeeping) on the same HTTP "
            "stack with this runtime's limits."
        )
    hop = report.get("router_hop", {}).get("p50_ms")
    if port and direct:
        text = (
            f"- The gateway adds {direct.p50_ms - port.p50_ms:.3f} ms per direct invocation (direct "
            f"{direct.p50_ms:.3f} ms vs the container port {port.p50_ms:.3f} ms)"
        )
        if ping:
            text += f"; answering HTTP at all costs it {ping.p50_ms:.3f} ms (`GET /ping`)"
        if hop:
            text += (
                f"; the router's hop client calling the container from a fresh process takes "
                f"{hop:.3f} ms, {hop - port.p50_ms:+.3f} ms against wrk calling it"
            )
        out.append(
            text
            + ". The rest is the router's own work (headers, body, the chain loop) and waiting for the "
            "GIL inside the gateway replica, which it shares with Ray's threads."
        )
    status = report.get("serve_status_call")
    if status:
        out.append(
            f"- Endpoint statuses (`GET /endpoints/...`) are polled once per second by the registry actor, "
            f"in its own process, and reach the gateway with the routing table; one poll costs "
            f"{status['thread_cpu_ms_p50']:.1f} ms of Python CPU ({status['wall_ms_p50']:.1f} ms wall) with "
            f"this run's three applications. Serve's public `serve.status()` costs "
            f"{status.get('public_thread_cpu_ms_p50', float('nan')):.1f} ms of CPU for the same answer "
            "(Ray 2.60 rebuilds it through pydantic and re-pickles each deployment's request-router class); "
            "when the gateway called it itself, that time held the gateway's GIL once a second and showed "
            "in its p99."
        )
    if direct and serial:
        out.append(
            f"- The serial chain ({serial.p50_ms:.3f} ms) pays three container calls and three hops; see "
            '"Serial chain: cost per container" for the per-hop split.'
        )
    if peer and direct:
        out.append(
            f"- MLServer ({peer.p50_ms:.3f} ms sequential) hands every request from its HTTP process to its "
            "inference worker over multiprocessing queues (pickled messages, executor threads, a select() "
            "loop): two processes and several thread wake-ups per request."
        )
    c32 = {
        s: get(s, "c32")
        for s in (
            "floor",
            "MLServer",
            "ours: container data port",
            "ours: direct",
            "ours: serial (3 containers)",
        )
    }
    for name in ("ours: direct", "ours: serial (3 containers)"):
        d = c32[name]
        if d:
            parts = ", ".join(
                f"{k} {v:.0f} µs" for k, v in d.cpu_us_per_request.items() if k != OTHER and v >= 5
            )
            out.append(
                f"- {name[6:].capitalize()} at 32 connections ({d.busy_cores:.2f} of {os.cpu_count()} cores "
                f"busy), CPU per request: {parts}."
            )
    rows = [(k, c) for k, c in c32.items() if c]
    if rows:
        out.append(
            "- CPU per request at c32, all processes of the run (wrk included): "
            + ", ".join(f"{k} {run_cpu_us(c):.0f} µs ({c.rps:,.0f} req/s)" for k, c in rows)
            + ". On a saturated 2-core machine req/s ≈ busy cores / CPU per request: throughput is CPU per request."
        )
    return out


def add_noise_notes(report: dict[str, Any], cases: list[Case]) -> None:
    """Say which kept cases were still disturbed by other processes or by the hypervisor."""
    limit = report.get("quiet_cores", 0.15)
    noisy = [
        f"{c.system} {c.load} (other {c.other_cores:.2f}, steal {c.steal_cores:.2f} cores)"
        for c in cases
        if c.disturbance > limit
    ]
    if noisy:
        report["notes"].append(
            f"still disturbed (other processes + steal above {limit:g} cores) after the retries: "
            + ", ".join(noisy)
            + "; those cases competed for the CPU"
        )
    steal = [c.steal_cores for c in cases]
    if steal:
        report["notes"].append(
            f"hypervisor steal during the kept cases: median {statistics.median(steal):.2f}, "
            f"max {max(steal):.2f} cores (this machine is a VM; steal is CPU it did not get)"
        )
