"""`serving train RECIPE.yaml`: train on Ray (embedded, or a cluster with --address) into the model
store."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap


def _epilog() -> str:
    from serving.training.recipe import field_lines

    wrapped = []
    for line in field_lines():
        indent = len(line) - len(line.lstrip())
        wrapped += textwrap.wrap(line, 110, subsequent_indent=" " * (indent + 4)) or [""]
    return "recipe fields (docs/training.md; examples/recipes/):\n" + "\n".join(
        "  " + line for line in wrapped
    )


def cmd_train(args: argparse.Namespace) -> int:
    from serving.ray_wing.training import train
    from serving.training.recipe import RecipeError, load_recipe

    try:
        recipe = load_recipe(args.recipe)
        run = train(
            recipe,
            store=args.store,
            address=args.address,
            resume=args.resume,
            profile=args.profile,
            verbose=args.verbose,
        )
    except RecipeError as error:
        print(f"{args.recipe}: INVALID", file=sys.stderr)
        for line in str(error).splitlines():
            print(f"  {line}", file=sys.stderr)
        return 2
    print()
    where = f"{len(run.groups)} models in parallel" if run.groups else f"{run.workers} worker(s)"
    print(f"trained {run.name} version {run.version} ({where}) in {run.wall_s:.1f} s")
    print(f"metrics: {json.dumps(run.metrics, default=str)}")
    timing = run.timing
    # a data-parallel step split
    if timing.get("per_step", {}).get("sync_wait_ms") or timing.get("backward_ms"):
        split = timing["per_step"]
        print(
            f"per step: compute {split['compute_ms']:.2f} ms, gradient sync wait {split['sync_wait_ms']:.2f} ms "
            f"(all-reduce busy {split['allreduce_busy_ms']:.2f} ms, overlapping backward), data "
            f"{split['data_ms']:.2f} ms; {timing['samples_per_s']:.0f} samples/s"
        )
    print(f"model: {run.path}  (model.json describes it)")
    if args.profile:
        print(
            f"timeline: {run.path / 'timeline'} (open the worker-*.trace.json files in https://ui.perfetto.dev)"
        )
    print("serve it with this container in an endpoint spec (`serving up SPEC.yaml`):")
    if run.groups:
        print(
            f"  - {{ContainerHostname: {run.name}, Image: {run.stacks[0]}, Mode: MultiModel, "
            f"ModelDataUrl: {run.model_data_url}}}   # TargetModel: <group>.tar.gz, {len(run.groups)} groups"
        )
    else:
        print(
            f"  - {{ContainerHostname: {run.name}, Image: {run.stacks[0]}, ModelDataUrl: {run.model_data_url}}}"
        )
    return 0


def add_parser(commands) -> None:
    """`serving train`."""
    parser = commands.add_parser(
        "train",
        help="train a model from a recipe on Ray and write it into the model store",
        description="Train RECIPE.yaml on Ray (an embedded local Ray unless --address) and write "
        "STORE/NAME/VERSION/model.tar.gz + model.json, with STORE/NAME/latest pointing at it.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipe", metavar="RECIPE.yaml")
    parser.add_argument(
        "--store", metavar="DIR", help="model store folder (default: the recipe's output.store)"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Ray's own output too (its workers', Ray Train's and Ray Data's notices); it is always in Ray's log files",
    )
    parser.add_argument(
        "--address", metavar="ADDR", help="train on this Ray cluster (as `serving up --address`)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the newest unfinished run of this recipe's model from its "
        "last checkpoint (a run that was killed)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="write a Chrome-trace/Perfetto timeline per worker (torch profiler)",
    )
    parser.set_defaults(func=cmd_train)
