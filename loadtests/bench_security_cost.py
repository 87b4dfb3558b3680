"""What each security property of a direct call costs, measured apart (issue 44, item 2).

- **The network namespace, seccomp and Landlock** (the container process's sandbox,
  `serving.model_server.sandbox`): a child process times syscalls, then is measured again in fresh
  children confined by seccomp alone, by Landlock alone, by both (a container process until
  2026-11-28) and by all three (a container process now: a network namespace of its own first).
  Confinement cannot be undone, so each configuration is its own process; the five are interleaved
  over `--rounds`, and each figure is the median of the rounds' best-of-5 blocks. The syscalls are
  those a container process makes per request: a write and read on a socket pair and on a TCP
  loopback connection made before confinement (as the data port is, in the node's namespace), a
  clock read, `getppid` as the bare syscall; and `open` + `close`, which Landlock checks (a
  container opens no file per request).
- **Start-up**: the CPU and wall time of confining a fresh process, as a container process does now
  (its own network namespace with loopback up and a listener on it, a Landlock rule for its own
  port) and as it did until 2026-11-27 (the node's network, a Landlock connect rule for each of the
  65,535 ports but the server's), in `--rounds` fresh processes each.
- **The hop MAC** (`serving.trust.hops`): `sign` as the gateway calls it and `verify` as the
  container does, on the benchmarks' 1-row request.
- **Caller authentication and authorization in the gateway**
  (`serving.access.decision.EndpointAccess`): `authenticate` of an API key (`Authorization: Bearer`)
  and of a request signed by botocore's SigV4 signer, and `authorize` of one container (its audit
  line written to /dev/null), as the gateway runs them when an endpoint has AccessControl; with
  AccessControl off the gateway runs neither.

    python -m loadtests.bench_security_cost [--rounds 15] [--write-docs]

Results: loadtests/results/bench_security_cost.json; with --write-docs, its section of
docs/benchmarks/bench_security_cost.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section

LAYERS = ("none", "seccomp", "landlock", "both", "all")
BODY = b"[[5.1, 3.5, 1.4, 0.2]]"
DOCS = ROOT / "docs" / "benchmarks" / "bench_security_cost.md"
RESULTS = ROOT / "loadtests" / "results" / "bench_security_cost.json"
PROFILE_RESULTS = ROOT / "loadtests" / "results" / "bench_profile.json"
# the container process's, when bench_profile has not been run (its strace count)
SYSCALLS_PER_REQUEST = 7.0


def best_ns(call: Callable[[], Any], n: int, blocks: int = 5) -> float:
    """ns per call: the least of `blocks` timed blocks of `n` calls (the least disturbed, as timeit
    advises)."""
    for _ in range(n // 10):
        call()
    samples = []
    for _ in range(blocks):
        start = time.perf_counter_ns()
        for _ in range(n):
            call()
        samples.append((time.perf_counter_ns() - start) / n)
    return min(samples)


def child(layer: str, folder: str, n: int) -> None:
    """Run in a fresh process: confine it as `layer` says, time the syscalls, print them as JSON."""
    import ctypes  # noqa: F401  (loaded before Landlock closes the file system)
    import socket

    from serving.model_server import sandbox, seccomp

    probe = os.path.join(folder, "probe")
    a, b = socket.socketpair()  # before seccomp, which refuses new Unix sockets
    # the data port: in the node's namespace, made before
    listener = socket.create_server(("127.0.0.1", 0))
    tcp_a = socket.create_connection(listener.getsockname())
    tcp_b, _ = listener.accept()
    payload = b"x" * 64
    if layer != "none":
        libc = sandbox._libc()  # the sandbox's own layers, one at a time (apply() runs them all)
        # PR_SET_NO_NEW_PRIVS
        if layer in ("seccomp", "landlock") and libc.prctl(38, 1, 0, 0, 0) != 0:
            raise SystemExit("prctl(PR_SET_NO_NEW_PRIVS) failed")
        if layer == "seccomp" and not seccomp.install(libc):
            raise SystemExit("seccomp could not be installed")
        if layer == "landlock":
            abi = sandbox.landlock_abi()
            if not abi:
                raise SystemExit("Landlock is not available")
            sandbox._landlock(
                libc, abi, sandbox.SandboxPolicy(read=(folder,)), sandbox.SandboxReport()
            )
        network = {"both": "host", "all": "isolated"}.get(layer)
        # "both": as until 2026-11-28, in the node's network; "all": a namespace of its own first,
        # as now
        if (
            network
            and not sandbox.apply(
                sandbox.SandboxPolicy(read=(folder,), network=network), require=True
            ).confined
        ):
            raise SystemExit("the sandbox could not be applied")

    def socket_round() -> None:
        os.write(a.fileno(), payload)
        os.read(b.fileno(), 64)

    def tcp_round() -> None:
        os.write(tcp_a.fileno(), payload)
        os.read(tcp_b.fileno(), 64)

    def open_close() -> None:
        os.close(os.open(probe, os.O_RDONLY))

    timings = {
        "getppid": best_ns(os.getppid, n),
        "clock_gettime (thread CPU clock)": best_ns(time.thread_time, n),
        "socket write + read (2 syscalls)": best_ns(socket_round, n),
        "TCP loopback write + read (2 syscalls)": best_ns(tcp_round, n),
        "open + close (2 syscalls)": best_ns(open_close, n // 4),
    }
    print(json.dumps(timings))


def confine_once(how: str) -> None:
    """Run in a fresh process: confine it as a container process does now ("namespace") or did until
    2026-11-28 ("port rules"), and print the CPU and wall seconds that took."""
    from serving.model_server import sandbox

    folder = tempfile.mkdtemp(prefix="bench-confine-")
    if how == "namespace":
        policy = sandbox.SandboxPolicy(read=(folder,), network="isolated", own_port=45999)
    else:  # every port but the server's, one rule each (what the closed-port design needed)
        policy = sandbox.SandboxPolicy(
            read=(folder,),
            network="host",
            connect_ports=tuple(range(1, 8080)) + tuple(range(8081, 65536)),
        )
    cpu, wall = time.process_time(), time.perf_counter()
    sandbox.apply(policy, require=True)
    print(json.dumps({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}))


def fresh_process(call: str, what: str) -> dict[str, float]:
    """What `call` (a function of this module, with its arguments) prints last, run in a fresh
    interpreter."""
    code = f"from loadtests.bench_security_cost import {call.partition('(')[0]}; {call}"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    if done.returncode != 0:
        raise SystemExit(f"{what} failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def startup_costs(rounds: int) -> dict[str, dict[str, float]]:
    runs: dict[str, list[dict[str, float]]] = {"namespace": [], "port rules": []}
    for _ in range(rounds):
        for how in runs:
            runs[how].append(fresh_process(f"confine_once({how!r})", f"confining ({how})"))
    return {
        how: {
            key: round(statistics.median(r[key] for r in results) * 1000, 2)
            for key in ("cpu_s", "wall_s")
        }
        for how, results in runs.items()
    }


def syscall_costs(rounds: int, n: int) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="bench-security-")
    Path(folder, "probe").write_text("x")
    runs: dict[str, list[dict[str, float]]] = {layer: [] for layer in LAYERS}
    for _ in range(rounds):
        for layer in LAYERS:
            runs[layer].append(
                fresh_process(f"child({layer!r}, {folder!r}, {n})", f"the {layer} child")
            )
    ops = list(runs["none"][0])
    medians = {
        layer: {op: round(statistics.median(r[op] for r in runs[layer]), 1) for op in ops}
        for layer in LAYERS
    }
    # Each round's confined process against that round's unconfined one: the VM's drift falls on
    # both alike.
    deltas = {
        layer: {
            op: round(
                statistics.median(
                    r[op] - plain[op] for r, plain in zip(runs[layer], runs["none"], strict=True)
                ),
                1,
            )
            for op in ops
        }
        for layer in LAYERS[1:]
    }
    return {"median_ns": medians, "delta_ns": deltas}


def hop_mac(n: int) -> dict[str, float]:
    from serving import protocol
    from serving.trust import hops

    key = os.urandom(32)
    plain = {"content-type": "application/json", "accept": "application/json"}
    signed = plain | hops.sign(key, "POST", protocol.INVOCATIONS_PATH, BODY, plain)
    return {
        "sign (gateway)": round(
            best_ns(lambda: hops.sign(key, "POST", protocol.INVOCATIONS_PATH, BODY, plain), n)
        ),
        "verify (container)": round(
            best_ns(lambda: hops.verify(key, "POST", protocol.INVOCATIONS_PATH, BODY, signed), n)
        ),
    }


def caller_auth(n: int) -> dict[str, float]:
    """ns per request of authenticate, by scheme, and of authorize (its audit line written to
    /dev/null)."""
    import logging

    import yaml
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from serving.access.decision import AUDIT_LOGGER, EndpointAccess, _audit
    from serving.access.identities import load_identities
    from serving.access.sigv4 import RawRequest

    folder = Path(tempfile.mkdtemp(prefix="bench-auth-"))
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "sagemaker:InvokeEndpoint", "Resource": "*"}],
    }
    (folder / "invoke.json").write_text(json.dumps(policy))
    key_id, secret, api_key = (
        "AKIABENCHSECURITY01",
        "bench-secret-of-forty-characters-or-more",
        "bench-api-key-0123456789",
    )
    (folder / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "signer",
                        "AccessKeyId": key_id,
                        "SecretAccessKey": secret,
                        "PolicyDocuments": ["invoke.json"],
                    },
                    {"Principal": "batch", "ApiKey": api_key, "PolicyDocuments": ["invoke.json"]},
                ]
            }
        )
    )
    access = EndpointAccess(
        load_identities(folder / "identities.yaml"), region="us-east-1", account_id="000000000000"
    )
    audit = logging.getLogger(AUDIT_LOGGER)
    audit.handlers[:] = [logging.StreamHandler(open(os.devnull, "w"))]  # noqa: SIM115 (for the whole run)
    audit.propagate, audit.level = False, logging.INFO

    path = "/endpoints/bench/invocations"
    request = AWSRequest(
        "POST",
        f"http://127.0.0.1:8080{path}",
        data=BODY,
        headers={
            "Content-Type": "application/json",
            "X-Amzn-SageMaker-Target-Container-Hostname": "c",
        },
    )
    SigV4Auth(Credentials(key_id, secret), "sagemaker", "us-east-1").add_auth(request)
    prepared = request.prepare()
    headers = (("host", "127.0.0.1:8080"),) + tuple(
        (k, v.decode() if isinstance(v, bytes) else str(v)) for k, v in prepared.headers.items()
    )
    sigv4 = RawRequest("POST", path, "", headers, BODY)
    bearer = RawRequest(
        "POST",
        path,
        "",
        (
            ("host", "127.0.0.1:8080"),
            ("authorization", f"Bearer {api_key}"),
            ("content-type", "application/json"),
        ),
        BODY,
    )

    caller = access.authenticate("bench", bearer)
    record = {
        "event": "authorize",
        "principal": caller.principal,
        "auth": caller.scheme,
        "endpoint": "bench",
        "containers": ["c"],
        "model": None,
        "action": "sagemaker:InvokeEndpoint",
        "resource": "arn:aws:sagemaker:us-east-1:000000000000:endpoint/bench",
        "decision": "allow",
        "statements": {"c": None},
    }
    return {
        "authenticate: API key (Bearer)": round(
            best_ns(lambda: access.authenticate("bench", bearer), n)
        ),
        "authenticate: SigV4 (boto3's signer)": round(
            best_ns(lambda: access.authenticate("bench", sigv4), n)
        ),
        "authorize one container (policies, decision metric, audit line)": round(
            best_ns(lambda: access.authorize("bench", caller, ["c"]), n)
        ),
        "of which the audit line (time stamp, JSON, logging)": round(
            best_ns(lambda: _audit(logging.INFO, record), n)
        ),
    }


def syscalls_per_request() -> tuple[float, str]:
    """The container process's syscalls per request: bench_profile's strace count when it has been
    run."""
    try:
        traced = json.loads(PROFILE_RESULTS.read_text())["syscalls"]["container"]
        return float(traced[0]["per_request"]), "bench_profile's strace count"
    except (OSError, KeyError, IndexError, ValueError):
        return (
            SYSCALLS_PER_REQUEST,
            "bench_profile's last strace count (not found in this checkout)",
        )


def docs_section(result: dict[str, Any]) -> str:
    meta, syscalls, deltas = (
        result["meta"],
        result["syscalls"]["median_ns"],
        result["syscalls"]["delta_ns"],
    )
    base = syscalls["none"]
    lines = [
        "## Measured",
        "",
        f"ns per operation, median of {meta['rounds']} rounds of fresh processes (each the best of 5 blocks). "
        "Δ: the median over the rounds of the confined process's figure less the same round's unconfined one.",
        "",
        "| operation | unconfined | seccomp | Δ | Landlock | Δ | both (until 2026-11-28) | Δ | "
        "namespace + both (a container process) | Δ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for op, plain in base.items():
        row = [f"| {op} | {plain:.0f}"]
        for layer in ("seccomp", "landlock", "both", "all"):
            row.append(f"{syscalls[layer][op]:.0f} | {deltas[layer][op]:+.0f}")
        lines.append(" | ".join(row) + " |")
    per, source = result["syscalls_per_request"], result["syscalls_per_request_source"]
    lines += [
        "",
        f"Per request: {per:g} syscalls in the container process ({source}) × the `getppid` Δ under all layers = "
        f"**{result['sandbox_us_per_request']:+.2f} µs** (Landlock checks only opens, and a container opens no "
        "file per request; its data port's sockets stay in the node's namespace, so the namespace adds no work to "
        "them).",
        "",
        "Start-up: confining one fresh process, ms (median of the rounds):",
        "",
        "| confinement | CPU ms | wall ms |",
        "|---|---|---|",
        *[
            f"| {label} | {result['startup'][how]['cpu_s']:.1f} | {result['startup'][how]['wall_s']:.1f} |"
            for how, label in (
                ("namespace", "now: a network namespace of its own, Landlock, seccomp"),
                (
                    "port rules",
                    "until 2026-11-28: the node's network, 65,534 Landlock port rules, seccomp",
                ),
            )
        ],
        "",
        "| per request | µs |",
        "|---|---|",
    ]
    lines += [f"| hop MAC: {name} | {ns / 1000:.1f} |" for name, ns in result["hop_mac"].items()]
    lines += [
        f"| caller auth in the gateway: {name} | {ns / 1000:.1f} |"
        for name, ns in result["caller_auth"].items()
    ]
    lines += [
        "| caller auth with AccessControl off | 0 (not run) |",
        "",
        f"Kernel {meta['kernel']}. " + run_line(meta, RESULTS),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rounds", type=int, default=15, help="fresh processes per sandbox configuration"
    )
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed block")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    meta = run_meta(__file__, kernel=os.uname().release, rounds=args.rounds)
    syscalls = syscall_costs(args.rounds, args.calls)
    per, source = syscalls_per_request()
    result: dict[str, Any] = {
        "meta": meta,
        "syscalls": syscalls,
        "syscalls_per_request": per,
        "syscalls_per_request_source": source,
        "sandbox_us_per_request": round(per * syscalls["delta_ns"]["all"]["getppid"] / 1000, 2),
        "startup": startup_costs(args.rounds),
        "hop_mac": hop_mac(args.calls // 4),
        "caller_auth": caller_auth(args.calls // 10),
    }
    meta["seconds"] = round(time.monotonic() - started, 1)
    write_results(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "meta"}, indent=2))
    if args.write_docs:
        write_section(
            DOCS, "bench_security_cost", docs_section(result), title="# bench_security_cost"
        )


if __name__ == "__main__":
    main()
