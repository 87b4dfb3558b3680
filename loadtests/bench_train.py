"""Training scaling benchmark: the digits CNN (PyTorch, DDP over gloo) on 1 and 2 workers, and a
bucket sweep.

    .venv/bin/python -m loadtests.bench_train [--quick] [--steps N] [--repeats N] [--write-docs]

Every configuration is one `serving.ray_wing.training.train()` call (its own embedded Ray,
num_cpus=2, a throw-away model store) of the recipe examples/recipes/digits-cnn.yaml with a fixed
number of optimizer steps and no checkpoint inside the timed steps; the whole list of configurations
runs --repeats times (passes, one after the other, so that drift on this VM hits every configuration
alike) and each number is the mean over the passes. What is read is `TrainingRun.timing`, measured
inside the PyTorch loop: samples/s over the loop's wall time, and per step the data, compute
(forward + backward + optimizer), gradient-sync wait (backward time after the last gradient bucket
was handed to the all-reduce) and all-reduce busy time (a DDP comm hook times each bucket's
all-reduce, overlapping backward); `other` is the loop's wall time per step less those (per-epoch
validation, progress bar, Python between phases).

1. Samples/s at the same GLOBAL batch (1 worker × 64 against 2 × 32) and at the same PER-WORKER
   batch (1 × 32 against 2 × 32); scaling efficiency = 2-worker samples/s / (2 × 1-worker
   samples/s). Also 1 worker × 64 with both cores (2 torch threads), the other way to spend the
   whole machine.
2. The per-step split of each run.
3. A bucket-size sweep at 2 × 32 (`training.bucket_cap_mb`, the analogue of Horovod's autotuned
   fusion threshold): the CNN's gradients are ~0.055 MB, so smaller buckets split every step's
   all-reduce. Results go to loadtests/results/bench_train.json (--quick: bench_train-quick.json)
   and, with --write-docs, the "Scaling benchmark" section of docs/training.md. Ratios within one
   run are the point, not absolute numbers: this VM has 2 shared cores, and 2 workers × 1 CPU is all
   of it.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    package_versions,
    write_results,
    write_section,
)

RECIPE = ROOT / "examples" / "recipes" / "digits-cnn.yaml"
RESULTS = ROOT / "loadtests" / "results"
# ~4-8 ms a step: a few seconds of loop next to ~35 s of Ray start and stop
STEPS, QUICK_STEPS = 1000, 100
REPEATS = 2
SWEEP_MB = (0.001, 0.025, 1.0, 25.0)  # 25: DDP's default, the 2 × 32 run of part 1
NUM_CPUS = 2

# name: (workers, cpus per worker, per-worker batch, bucket_cap_mb)
SCALING = {
    "1x64": (1, 1, 64, 25.0),
    "1x32": (1, 1, 32, 25.0),
    "2x32": (2, 1, 32, 25.0),
    "1x64-2threads": (1, 2, 64, 25.0),
}


def log(message: str) -> None:
    print(f"[bench_train {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def recipe_for(
    workers: int, cpus: float, batch: int, bucket_mb: float, steps: int, store: Path
) -> Any:
    from serving.training.recipe import parse_recipe

    document = copy.deepcopy(yaml.safe_load(RECIPE.read_text()))
    document["name"] = f"bench-{workers}x{batch}-c{cpus:g}-b{bucket_mb:g}"
    document["workers"] = {"count": workers, "cpus_per_worker": cpus}
    document["training"].update(
        epochs=1000,  # max_steps ends the run
        max_steps=steps,
        batch_size=batch,
        bucket_cap_mb=bucket_mb,
        # none inside the timed loop (the final state is written after it)
        checkpoint_every_steps=steps + 1,
        max_failures=0,
    )
    # export is after the timed loop
    document["output"] = {"store": str(store), "formats": ["torchscript"]}
    return parse_recipe(document, RECIPE.parent, f"bench recipe {document['name']}")


def measure(workers: int, cpus: float, batch: int, bucket_mb: float, steps: int) -> dict[str, Any]:
    from serving.ray_wing.training import train

    with tempfile.TemporaryDirectory(prefix="bench-train-") as store:
        recipe = recipe_for(workers, cpus, batch, bucket_mb, steps, Path(store))
        log(f"{recipe.name}: {steps} steps")
        run = train(recipe, store=store, num_cpus=NUM_CPUS)
    timing = run.timing
    split = timing["per_step"]
    other = timing["step_ms"] - split["data_ms"] - split["compute_ms"] - split["sync_wait_ms"]
    log(f"  {timing['samples_per_s']:.0f} samples/s, {split}, step {timing['step_ms']:.2f} ms")
    return {
        "workers": workers,
        "cpus_per_worker": cpus,
        "batch_per_worker": batch,
        "global_batch": workers * batch,
        "bucket_cap_mb": bucket_mb,
        "steps": timing["steps"],
        "samples_per_s": timing["samples_per_s"],
        "step_ms": timing["step_ms"],
        "per_step": {**split, "other_ms": round(other, 3)},
        "forward_ms": timing["forward_ms"],
        "backward_ms": timing["backward_ms"],
        "optimizer_ms": timing["optimizer_ms"],
        "val_accuracy": run.metrics.get("val_accuracy"),
        "train_call_wall_s": round(run.wall_s, 2),
    }


def ddp_buckets() -> dict[str, Any]:
    """The recipe's CNN: its parameter count, and the gradient buckets DDP forms at each swept
    bucket_cap_mb (element counts of each all-reduce in one step, after DDP's first-iteration
    rebuild), read through a comm hook in a one-process gloo group in this process; the same model
    and parameter order as the runs."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from serving.training.torch_models import build_model

    document = yaml.safe_load(RECIPE.read_text())
    model_spec = document["model"]
    stats = {"mean": [0.0] * 64, "std": [1.0] * 64, "image_shape": document["data"]["image_shape"]}
    buckets: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-train-ddp-") as folder:
        dist.init_process_group(
            "gloo", store=dist.FileStore(str(Path(folder) / "store"), 1), rank=0, world_size=1
        )
        try:
            for mb in SWEEP_MB:
                torch.manual_seed(0)
                model = build_model(
                    model_spec["family"], model_spec["hyperparameters"], 64, 10, stats
                )
                net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=mb)
                sizes: list[int] = []

                def hook(state: Any, bucket: Any, sizes: list[int] = sizes) -> Any:
                    sizes.append(bucket.buffer().numel())
                    return (
                        dist.all_reduce(bucket.buffer(), async_op=True)
                        .get_future()
                        .then(lambda f: f.value()[0])
                    )

                # unannotated: DDP checks them
                net.register_comm_hook(None, lambda state, bucket: hook(state, bucket))
                for _ in range(3):  # DDP rebuilds its buckets after the first iteration
                    sizes.clear()
                    net(torch.randn(32, 64)).sum().backward()
                buckets[f"{mb:g}"] = list(sizes)
        finally:
            dist.destroy_process_group()
    count = sum(p.numel() for p in model.parameters())
    return {"parameters": count, "gradient_mb": count * 4 / 1e6, "buckets": buckets}


def mean_of(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's passes: the mean of every number, each pass's samples/s kept."""
    first = passes[0]
    average = lambda key, within=None: (
        sum((p[within] if within else p)[key] for p in passes) / len(passes)
    )  # noqa: E731
    merged = {
        key: value
        for key, value in first.items()
        if not isinstance(value, (int, float))
        or key
        in (
            "workers",
            "cpus_per_worker",
            "batch_per_worker",
            "global_batch",
            "bucket_cap_mb",
            "steps",
        )
    }
    for key in (
        "samples_per_s",
        "step_ms",
        "forward_ms",
        "backward_ms",
        "optimizer_ms",
        "train_call_wall_s",
    ):
        merged[key] = average(key)
    merged["per_step"] = {key: average(key, "per_step") for key in first["per_step"]}
    merged["samples_per_s_each_pass"] = [p["samples_per_s"] for p in passes]
    merged["val_accuracy_each_pass"] = [p["val_accuracy"] for p in passes]
    return merged


def run(steps: int, repeats: int) -> dict[str, Any]:
    configs = {
        **SCALING,
        **{f"2x32-bucket{mb:g}": (2, 1, 32, mb) for mb in SWEEP_MB if mb != SCALING["2x32"][3]},
    }
    passes: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for index in range(repeats):
        log(f"pass {index + 1} of {repeats}")
        for name, config in configs.items():
            passes[name].append(measure(*config, steps))
    runs = {name: mean_of(results) for name, results in passes.items()}
    sweep = {
        f"{mb:g}": runs["2x32" if mb == SCALING["2x32"][3] else f"2x32-bucket{mb:g}"]
        for mb in SWEEP_MB
    }
    rate = lambda name: runs[name]["samples_per_s"]  # noqa: E731
    return {
        "model": ddp_buckets(),
        "command": command_line(__file__),
        "machine": machine_facts(),
        "versions": package_versions(("ray", "torch", "scikit-learn", "numpy")),
        "parameters": {
            "recipe": str(RECIPE.relative_to(ROOT)),
            "steps": steps,
            "repeats": repeats,
            "num_cpus": NUM_CPUS,
        },
        "runs": runs,
        "scaling": {
            "same_global_batch": {
                "one": "1x64",
                "two": "2x32",
                "efficiency": rate("2x32") / (2 * rate("1x64")),
            },
            "same_per_worker_batch": {
                "one": "1x32",
                "two": "2x32",
                "efficiency": rate("2x32") / (2 * rate("1x32")),
            },
            "two_workers_over_one_worker_two_threads": rate("2x32") / rate("1x64-2threads"),
        },
        "bucket_sweep": {
            mb: {**result, "samples_per_s_vs_25mb": result["samples_per_s"] / rate("2x32")}
            for mb, result in sweep.items()
        },
    }


def _rates(r: dict[str, Any]) -> str:
    each = r.get("samples_per_s_each_pass") or [r["samples_per_s"]]
    spread = f" ({min(each):.0f}–{max(each):.0f})" if len(each) > 1 else ""
    return f"{r['samples_per_s']:.0f}{spread}"


def _row(label: str, r: dict[str, Any]) -> str:
    s = r["per_step"]
    return (
        f"| {label} | {r['global_batch']} | {_rates(r)} | {r['step_ms']:.2f} | {s['compute_ms']:.2f} | "
        f"{r['forward_ms']:.2f} / {r['backward_ms']:.2f} / {r['optimizer_ms']:.2f} | {s['sync_wait_ms']:.2f} | "
        f"{s['allreduce_busy_ms']:.2f} | {s['data_ms']:.3f} | {s['other_ms']:.2f} |"
    )


def render(result: dict[str, Any]) -> str:
    runs, scaling, sweep, p = (
        result["runs"],
        result["scaling"],
        result["bucket_sweep"],
        result["parameters"],
    )
    machine, m = result["machine"], result["model"]
    header = [
        "| run (workers × batch) | global batch | samples/s (passes) | step ms | compute ms | fwd / bwd / opt ms | "
        "sync wait ms | all-reduce busy ms | data ms | other ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {
        "1x64": "1 × 64 (1 CPU)",
        "1x32": "1 × 32 (1 CPU)",
        "2x32": "2 × 32 (1 CPU each)",
        "1x64-2threads": "1 × 64 (2 CPUs, 2 torch threads)",
    }
    same_global, same_worker = (
        scaling["same_global_batch"]["efficiency"],
        scaling["same_per_worker_batch"]["efficiency"],
    )
    lines = [
        "## Scaling benchmark",
        "",
        "`.venv/bin/python -m loadtests.bench_train --write-docs` (raw results in `loadtests/results/bench_train.json`;",
        "`--quick` for a short smoke run). The digits CNN of",
        f"`{p['recipe']}` (PyTorch, DDP over gloo; {m['parameters']:,} parameters = {m['gradient_mb']:.3f} MB of float32",
        f"gradients), {p['steps']} optimizer",
        "steps per run, no checkpoint inside them. Each configuration is its own `serving train` run on an embedded",
        f"Ray with {p['num_cpus']} CPUs; the list of configurations ran {p.get('repeats', 1)} time(s), one pass after the",
        "other, and each number is the mean over the passes (each pass's samples/s in brackets). Machine:",
        f"{machine['nproc']} shared cores ({machine['cpu_model']}), no GPU; torch {result['versions'].get('torch')},",
        f"ray {result['versions'].get('ray')}. The split is measured inside the loop, per step, averaged over the",
        "workers: compute = forward + backward up to the last gradient bucket + optimizer; sync wait = the rest",
        "of backward, i.e. waiting for the all-reduce; all-reduce busy = every bucket's all-reduce from launch to",
        "done (it overlaps backward, so it is not added to the others); data = slicing the batch; other = the",
        "loop's wall time per step (step ms) less data, compute and sync wait: per-epoch validation (every rank",
        "scores the validation rows), the progress bar, Python between the phases.",
        "",
        *header,
        *(_row(labels[name], runs[name]) for name in ("1x64", "1x32", "2x32", "1x64-2threads")),
        "",
        "| scaling efficiency = 2-worker samples/s ÷ (2 × 1-worker samples/s) | |",
        "|---|---|",
        f"| same global batch (2 × 32 against 1 × 64) | **{same_global:.2f}** |",
        f"| same per-worker batch (2 × 32 against 1 × 32) | **{same_worker:.2f}** |",
        f"| 2 × 32 against one worker with both cores (1 × 64, 2 threads) | {scaling['two_workers_over_one_worker_two_threads']:.2f}× |",
        "",
        "Bucket-size sweep at 2 × 32 (`training.bucket_cap_mb`; DDP's default is 25 MB, one bucket for this model):",
        "",
        "| bucket_cap_mb | all-reduces a step (elements each) | samples/s (passes) | vs 25 MB | step ms | compute ms | "
        "sync wait ms | all-reduce busy ms |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {mb} | {len(m['buckets'][mb])} ({', '.join(map(str, m['buckets'][mb]))}) | {_rates(r)} | {r['samples_per_s_vs_25mb']:.2f} | {r['step_ms']:.2f} | "
            f"{r['per_step']['compute_ms']:.2f} | {r['per_step']['sync_wait_ms']:.2f} | "
            f"{r['per_step']['allreduce_busy_ms']:.2f} |"
            for mb, r in sweep.items()
        ),
        "",
        *reading(result),
    ]
    return "\n".join(lines)


def reading(result: dict[str, Any]) -> list[str]:
    """What the numbers say, with the numbers of this result."""
    runs, sweep, m = result["runs"], result["bucket_sweep"], result["model"]
    one, two, wide = runs["1x32"], runs["2x32"], runs["1x64-2threads"]
    # 1 MB and 25 MB form the same single bucket: the noise floor
    same = sweep["1"]["samples_per_s_vs_25mb"]
    tiny = sweep[f"{SWEEP_MB[0]:g}"]
    return [
        "**Reading.** On this machine two workers are slower than one, at either batch. 2 workers × 1 CPU is the",
        "whole machine (2 cores), and Ray's own processes (raylet, GCS, the Train controller, the driver) and",
        "gloo's threads run on the same two cores, so each worker computes more slowly than a lone one: at the",
        f"same per-worker batch of 32, compute is {two['per_step']['compute_ms']:.2f} ms a step with 2 workers against "
        f"{one['per_step']['compute_ms']:.2f} ms with one",
        f"(forward {two['forward_ms']:.2f} against {one['forward_ms']:.2f} ms) — contention for the cores, not "
        "communication. On top of that every step waits",
        f"{two['per_step']['sync_wait_ms']:.2f} ms for the all-reduce of {m['gradient_mb'] * 1000:.0f} KB of gradients "
        "over loopback gloo: that is latency, not bandwidth, and",
        f"it is longer than the whole backward pass ({two['backward_ms']:.2f} ms), so there is nothing for DDP's "
        "overlap to hide it behind.",
        "Data parallelism pays when a step's compute is large against one all-reduce's latency (Horovod's rule of",
        f"thumb); a {m['parameters']:,}-parameter CNN on 8×8 images is the opposite case, so the efficiencies above "
        "measure this",
        "machine's overhead, not how the trainer scales on a cluster with a core (or a GPU) per worker. One worker",
        f"with both cores does not help either ({wide['samples_per_s']:.0f} samples/s with 2 torch threads against "
        f"{runs['1x64']['samples_per_s']:.0f} with one): the model is",
        "too small for intra-op parallelism, and the second core is better left to Ray. Data loading is",
        "negligible (the shard is in memory as a NumPy array: slicing a batch is well under 0.1 ms); `other`",
        "(validation at each epoch end, the progress bar) is a few percent of a step.",
        "",
        f"The sweep: buckets smaller than the gradients ({m['gradient_mb']:.3f} MB) split each step's all-reduce into "
        "several, and",
        f"each costs its own latency: at {SWEEP_MB[0]:g} MB ({len(m['buckets'][f'{SWEEP_MB[0]:g}'])} all-reduces a step) "
        f"the sync wait grows to {tiny['per_step']['sync_wait_ms']:.2f} ms and throughput drops to "
        f"{tiny['samples_per_s_vs_25mb']:.2f}× one bucket's.",
        "Any cap at or above the gradients' size gives one bucket, so the 1 MB and 25 MB runs are the same",
        f"configuration: their ratio ({same:.2f}) is this VM's run-to-run noise, and a difference smaller than that "
        "(as at 0.025 MB)",
        "is not a finding. What an autotuner would conclude here is what DDP's default already does: one bucket.",
        "Smaller buckets only pay when backward is long enough for early buckets' all-reduces to overlap the rest",
        "of it — a larger model, or a real network between the workers.",
        "",
        "No GPU on this machine: the NCCL path and mixed precision (`gpus_per_worker` > 0) were not measured here.",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_STEPS} steps a run (a smoke run)"
    )
    parser.add_argument("--steps", type=int, help=f"optimizer steps a run (default {STEPS})")
    parser.add_argument(
        "--repeats", type=int, help=f"passes over the configurations (default {REPEATS}; --quick 1)"
    )
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="rewrite the Scaling benchmark section of docs/training.md",
    )
    parser.add_argument("--render", metavar="JSON", help="only render a saved result")
    args = parser.parse_args()
    if args.render:
        result = json.loads(Path(args.render).read_text())
        if "model" not in result:
            result["model"] = ddp_buckets()
            write_results(Path(args.render), result)
    else:
        steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
        result = run(steps, args.repeats or (1 if args.quick else REPEATS))
        write_results(
            RESULTS / ("bench_train-quick.json" if args.quick else "bench_train.json"), result
        )
    text = render(result)
    print(text)
    if args.write_docs:
        write_section(ROOT / "docs" / "training.md", "bench_train", text, title="# Training")
    return 0


if __name__ == "__main__":
    sys.exit(main())
