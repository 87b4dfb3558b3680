"""One framework's stack against a peer server's runtime for it, on the same model (bench_lightgbm,
bench_mlflow): the peer's virtual environment, each server's answer checked against the framework's
own in-process prediction, and wrk cases interleaved over rounds (p50 at one connection; throughput
and server CPU per request at 32, from /proc), summed up as medians and ratios against a baseline
case measured in the same round."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.harness.processes import BenchError, http, log
from loadtests.harness.proctree import process_cpu_seconds
from loadtests.harness.wrk import Wrk, lua_bytes

Key = tuple[int, str]  # (rows per request, case)
FIELDS = ("p50_ms", "rps", "cpu_us")


@dataclass(frozen=True)
class Case:
    """A POST of `body` to `url`, its CPU counted in the processes of `whose` (a key of the pids
    `interleaved` is given)."""

    url: str
    body: str
    whose: str


def ensure_venv(venv: Path, requirements: list[str]) -> Path:
    """A peer's virtual environment with `requirements` (created on first use); its `mlserver`."""
    binary = venv / "bin" / "mlserver"
    if binary.exists():
        return binary
    log(f"creating {venv} with {' '.join(requirements)} (first run only; needs PyPI) ...")
    python3 = shutil.which("python3") or sys.executable
    try:
        subprocess.run([python3, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *requirements], check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise BenchError(f"could not prepare {venv}: {error}; delete it and run again") from None
    return binary


def venv_versions(venv: Path, names: tuple[str, ...]) -> dict[str, str]:
    """The versions of `names` installed in `venv`."""
    code = (
        "import importlib.metadata as m, json, sys; "
        f"print(json.dumps({{n: m.version(n) for n in {names!r}}}))"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60
    )
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-300:]}


def answer_values(decoded: Any) -> Any:
    """The prediction in an answer: a V2 answer's first output, MLflow's `predictions`, or the
    answer itself."""
    if isinstance(decoded, dict) and "outputs" in decoded:
        return decoded["outputs"][0]["data"]
    if isinstance(decoded, dict) and "predictions" in decoded:
        return decoded["predictions"]
    return decoded


def check_answer(case: str, url: str, body: str, expected: np.ndarray, reference: str) -> None:
    """POST `body` to `url`; unless the answer (200) holds `expected` exactly, BenchError naming
    `reference`, what computed `expected` in this process."""
    status, answer = http("POST", url, body.encode(), {"Content-Type": "application/json"})[:2]
    if status != 200:
        raise BenchError(f"{case}: {status} {answer[:300]!r}")
    got = np.asarray(answer_values(json.loads(answer)), dtype=np.float64).reshape(-1)
    if not np.array_equal(got, np.asarray(expected, dtype=np.float64).reshape(-1)):
        raise BenchError(f"{case}: the answer is not {reference}'s: {answer[:300]!r}")


def scripts(wrk: Wrk, cases: dict[Key, Case]) -> dict[Key, Path]:
    """A wrk script per case (a JSON POST of its body), each warmed up (8 connections, 2 s)."""
    paths = {}
    for key, case in cases.items():
        path = wrk._script("POST", "", {"Content-Type": "application/json"})
        path.write_text(
            path.read_text().replace('wrk.body = ""', f"wrk.body = {lua_bytes(case.body)}", 1)
        )
        paths[key] = path
        warm, _ = wrk._run(path, case.url, 8, 2)
        if warm["status"] or not warm["requests"]:
            raise BenchError(f"{key}: {warm['status']} error answers while warming up")
    return paths


def interleaved(
    wrk: Wrk,
    cases: dict[Key, Case],
    pids: dict[str, dict[str, int]],
    rounds: int,
    seconds: float,
) -> dict[Key, list[dict[str, float]]]:
    """Every case once a round, for `rounds`: p50 at one connection, then throughput and the CPU
    per request of its processes (`pids[case.whose]`) at 32 connections."""
    paths = scripts(wrk, cases)
    runs: dict[Key, list[dict[str, float]]] = {key: [] for key in cases}
    for round_ in range(rounds):
        for key, case in cases.items():
            c1, _ = wrk._run(paths[key], case.url, 1, seconds)
            whose = pids[case.whose]
            before = {name: process_cpu_seconds(pid) for name, pid in whose.items()}
            c32, _ = wrk._run(paths[key], case.url, 32, seconds)
            used = sum(process_cpu_seconds(pid) - before[name] for name, pid in whose.items())
            if any(run[k] for run in (c1, c32) for k in ("status", "timeout", "connect")):
                raise BenchError(f"{key}: errors under load")
            row = {
                "p50_ms": c1["p50"] / 1000,
                "rps": c32["requests"] / (c32["duration_us"] / 1e6),
                "cpu_us": used / c32["requests"] * 1e6,
            }
            runs[key].append(row)
            log(
                f"round {round_ + 1} {key[0]:>2} rows {key[1]:<34} p50 {row['p50_ms']:.3f} ms  "
                f"{row['rps']:6.0f} req/s  {row['cpu_us']:.0f} µs CPU/request"
            )
    return runs


def summary(
    runs: dict[Key, list[dict[str, float]]], base: Callable[[Key], Key]
) -> list[dict[str, Any]]:
    """Each case's medians, and the medians of its per-round ratios to `base(key)`'s (CPU per
    request, throughput)."""

    def ratio(key: Key, field: str) -> float:
        pairs = zip(runs[key], runs[base(key)], strict=True)
        return round(statistics.median(s[field] / b[field] for s, b in pairs), 3)

    return [
        {
            "rows": key[0],
            "case": key[1],
            **{field: round(statistics.median(s[field] for s in samples), 3) for field in FIELDS},
            "cpu_ratio": ratio(key, "cpu_us"),
            "rps_ratio": ratio(key, "rps"),
        }
        for key, samples in runs.items()
    ]


def table(rows: list[dict[str, Any]], against: str) -> list[str]:
    """The docs' table of `summary` rows, ratios headed "vs `against`"."""
    lines = [
        "| rows per request | system, protocol | p50 ms (c1) | req/s (c32) | server CPU µs/request (c32) | "
        f"CPU vs {against} | req/s vs {against} |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['rows']} | {row['case']} | {row['p50_ms']:.3f} | {row['rps']:,.0f} | {row['cpu_us']:.0f} | "
            f"{row['cpu_ratio']:.2f}× | {row['rps_ratio']:.2f}× |"
        )
    return lines
