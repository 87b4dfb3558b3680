"""GPU benchmark: the pytorch and onnx stacks on CUDA against the same stacks on the CPU.

    python -m loadtests.bench_gpu run --out DIR [--cpus 4] [--seconds 5] # on a machine with a GPU
    .venv/bin/python -m loadtests.bench_gpu docs DIR/bench_gpu.json # writes its part of
    docs/benchmarks/bench_gpu.md

`run` builds two models with torch (no downloads), saves each as TorchScript (`model.pt`, the
pytorch stack) and as ONNX (`model.onnx`, the onnx stack), loads them through this project's
runtimes exactly as a container replica does (`SERVING_GPUS` 0 or 1, `SERVING_CPUS` = --cpus),
and times `Runtime.invoke` (decode, predict, encode: what a replica does per request, without
HTTP) for each stack x model x batch x device, in one process and one run:

  iris-mlp   4 -> 64 -> 3 (the size of the demo models): batch 1 as JSON
  wide-mlp   512 -> 4096 -> 4096 -> 10 (about 19 M parameters): batch 1 and 256 as NPY

Each case warms up, then runs for --seconds; it reports p50/p99 per call and rows per second,
and checks that CUDA and CPU answers agree. Ray is not needed (the GPU machine has none): the
runtimes are the part of a replica that touches the device.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.harness.results import ROOT

MODELS = {  # name -> layer widths
    "iris-mlp": [4, 64, 3],
    "wide-mlp": [512, 4096, 4096, 10],
}
CASES = [
    ("iris-mlp", 1, "application/json"),
    ("wide-mlp", 1, "application/x-npy"),
    ("wide-mlp", 256, "application/x-npy"),
]


def build_models(root: Path) -> dict[str, Path]:
    """One folder per (stack, model) holding what that stack loads."""
    import torch

    torch.manual_seed(0)
    folders = {}
    for name, widths in MODELS.items():
        layers: list[Any] = []
        for a, b in zip(widths, widths[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1]).eval()
        example = torch.randn(2, widths[0])
        pt = root / "pytorch" / name
        pt.mkdir(parents=True)
        torch.jit.script(model).save(str(pt / "model.pt"))
        onnx_dir = root / "onnx" / name
        onnx_dir.mkdir(parents=True)
        torch.onnx.export(
            model,
            (example,),
            str(onnx_dir / "model.onnx"),
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
            dynamo=False,
        )
        folders[f"pytorch/{name}"], folders[f"onnx/{name}"] = pt, onnx_dir
    return folders


def body_for(rows: int, width: int, content_type: str) -> bytes:
    import numpy as np

    data = np.random.default_rng(rows).standard_normal((rows, width)).astype("float32")
    if content_type == "application/json":
        return json.dumps(data.tolist()).encode()
    buffer = io.BytesIO()
    np.save(buffer, data)
    return buffer.getvalue()


def decode(body: bytes, content_type: str):
    import numpy as np

    if content_type.startswith("application/json"):
        return np.asarray(json.loads(body), dtype="float64")
    return np.load(io.BytesIO(body))


def time_case(runtime, body: bytes, content_type: str, seconds: float) -> dict[str, float]:
    from serving.runtimes.base import InvocationContext

    for _ in range(20):
        runtime.invoke(body, content_type, content_type, InvocationContext())
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and len(times) < 20000:
        started = time.perf_counter()
        runtime.invoke(body, content_type, content_type, InvocationContext())
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {
        "calls": len(times),
        "p50_ms": statistics.median(times),
        "p99_ms": times[int(0.99 * (len(times) - 1))],
        "mean_ms": statistics.fmean(times),
    }


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import onnxruntime
    import torch

    from serving.runtimes.onnx import OnnxRuntime
    from serving.runtimes.pytorch import PyTorchRuntime

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "command": " ".join(["python", "-m", "loadtests.bench_gpu", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
            "onnxruntime_providers": onnxruntime.get_available_providers(),
        },
        "cpus": args.cpus,
        "seconds": args.seconds,
        "cases": [],
        "notes": [],
    }
    print(json.dumps(report["machine"]), flush=True)
    stacks = {"pytorch": PyTorchRuntime, "onnx": OnnxRuntime}
    with tempfile.TemporaryDirectory() as tmp:
        folders = build_models(Path(tmp))
        for stack, runtime_class in stacks.items():
            for model, rows, content_type in CASES:
                body = body_for(rows, MODELS[model][0], content_type)
                answers = {}
                for device, gpus in (("cpu", "0"), ("cuda", "1")):
                    runtime = runtime_class(
                        folders[f"{stack}/{model}"],
                        {"SERVING_CPUS": str(args.cpus), "SERVING_GPUS": gpus},
                    )
                    runtime.load()
                    used = _device_of(stack, runtime)
                    if device == "cuda" and used != "cuda":
                        report["notes"].append(
                            f"{stack} on CUDA not measured: given a GPU it ran on the {used} (providers of this "
                            f"onnxruntime: {', '.join(onnxruntime.get_available_providers())}); CUDA needs the "
                            "`onnxruntime-gpu` build"
                        )
                        continue
                    result, content = runtime.invoke(body, content_type, content_type, _context())
                    answers[device] = decode(result, content)
                    timing = time_case(runtime, body, content_type, args.seconds)
                    case = {
                        "stack": stack,
                        "model": model,
                        "batch": rows,
                        "content_type": content_type,
                        "device": used,
                        **timing,
                        "rows_per_s": rows * 1000 / timing["mean_ms"],
                    }
                    report["cases"].append(case)
                    print(json.dumps(case), flush=True)
                    del runtime
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                if "cuda" in answers:
                    gap = float(np.max(np.abs(answers["cuda"] - answers["cpu"])))
                    report["notes"].append(
                        f"{stack} {model} batch {rows}: CUDA and CPU answers differ by at most {gap:.2e}"
                    )
                    if gap > 1e-2:
                        raise SystemExit(f"{stack} {model}: CUDA answer differs from CPU by {gap}")
    (out / "bench_gpu.json").write_text(json.dumps(report, indent=1))
    print(render(report))
    return 0


def _device_of(stack: str, runtime) -> str:
    if stack == "pytorch":
        return runtime.device.type
    return "cuda" if runtime.model.get_providers()[0] == "CUDAExecutionProvider" else "cpu"


def _context():
    from serving.runtimes.base import InvocationContext

    return InvocationContext()


def render(report: dict[str, Any]) -> str:
    machine = report["machine"]
    lines = [
        "## GPU: PyTorch and ONNX on CUDA vs CPU",
        "",
        "The `pytorch` and `onnx` stacks' per-request work (`Runtime.invoke`: decode, predict, encode; no HTTP, no "
        "Ray) on a GPU machine, CUDA against the same machine's CPU, in one run of `loadtests/bench_gpu.py` "
        "(see its docstring for the models). CI has no GPU: these numbers come from a lent GPU machine and "
        "are refreshed only where one is available.",
        "",
        f"Generated by `{report['command']}` on {report['started']}: {machine['gpu']}, {machine['nproc']} CPU cores "
        f"(each runtime limited to {report['cpus']} threads through `SERVING_CPUS`, as a container with "
        f"`Resources.Cpus: {report['cpus']}` would be), Python {machine['python']}, torch {machine['torch']}, "
        f"onnxruntime {machine['onnxruntime']} (providers: {', '.join(machine['onnxruntime_providers'])}); "
        f"{report['seconds']:g} s per case.",
        "",
        "| stack | model | batch | body | device | p50 ms | p99 ms | rows/s | CUDA / CPU p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cpu = {(c["stack"], c["model"], c["batch"]): c for c in report["cases"] if c["device"] == "cpu"}
    for c in report["cases"]:
        ratio = ""
        if c["device"] == "cuda" and (c["stack"], c["model"], c["batch"]) in cpu:
            ratio = f"{c['p50_ms'] / cpu[(c['stack'], c['model'], c['batch'])]['p50_ms']:.2f}"
        body = "JSON" if "json" in c["content_type"] else "NPY"
        lines.append(
            f"| {c['stack']} | {c['model']} | {c['batch']} | {body} | {c['device']} | {c['p50_ms']:.3f} | "
            f"{c['p99_ms']:.3f} | {c['rows_per_s']:,.0f} | {ratio} |"
        )
    faster = [
        c
        for c in report["cases"]
        if c["device"] == "cuda" and (c["stack"], c["model"], c["batch"]) in cpu
    ]
    if faster:
        lines += [
            "",
            "Reading: a GPU pays for a container when its model has real work per request; for a demo-sized "
            "model the per-call launch and copies cost more than the arithmetic saves (ratio above 1), and "
            "batching (several rows per request) is where it gains most. Choose `Resources.Gpus` per container "
            "accordingly: a multi-container endpoint can give the GPU to the one container that needs it.",
        ]
    # once each
    lines += ["", "Notes:", ""] + [f"- {note}" for note in dict.fromkeys(report["notes"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser(
        "run", help="measure (needs torch and onnxruntime; CUDA when present)"
    )
    run_parser.add_argument("--out", required=True, help="folder for bench_gpu.json")
    run_parser.add_argument(
        "--cpus", type=float, default=4, help="the container's CPU share (SERVING_CPUS)"
    )
    run_parser.add_argument("--seconds", type=float, default=5, help="seconds per case")
    docs_parser = commands.add_parser(
        "docs", help="write the results' section of docs/benchmarks/bench_gpu.md"
    )
    docs_parser.add_argument("result", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    from loadtests.harness.results import write_section

    write_section(
        ROOT / "docs" / "benchmarks" / "bench_gpu.md",
        "bench_gpu",
        render(json.loads(args.result.read_text())),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
