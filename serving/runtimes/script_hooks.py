"""A user's script as SageMaker's inference toolkit runs it: which hooks a stack allows, the checks
made before its model loads, and how a hook is called (with the context when it takes one)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from serving.runtimes.context import InvocationContext
from serving.runtimes.handler import UserCode
from serving.runtimes.requirements import missing_requirements

__all__ = [
    "BATCH_OPT_IN",
    "SCRIPT_HOOKS",
    "call_hook",
    "check_hooks",
    "check_requirements",
    "parameter_count",
]

# The inference toolkit's hooks, which every stack runs (the TensorFlow stack adds the TFS
# container's).
SCRIPT_HOOKS = (
    "model_fn",
    "input_fn",
    "predict_fn",
    "output_fn",
    "transform_fn",
    "pre_model_fn",
    "model_warmup_fn",
)
TFS_HOOKS = ("input_handler", "output_handler", "handler")
# A script's module-level `accepts_batches = True`: its hooks take a batch of several requests'
# rows.
BATCH_OPT_IN = "accepts_batches"
_WHY_NOT = {
    **{name: "a TensorFlow Serving container hook: use Image tensorflow" for name in TFS_HOOKS},
    "execution_parameters_fn": "the scikit-learn container's batch-transform hook: batch transform is not offered",
}


def check_hooks(hooks: Iterable[str], supported: Iterable[str], stack: str) -> None:
    """Refuse, naming it, a hook the stack would not run, and transform_fn mixed with the other
    steps."""
    hooks, supported = set(hooks), set(supported)
    for name in hooks:
        if name not in supported:
            why = _WHY_NOT.get(name, f"not run by the {stack} stack")
            raise ValueError(
                f"the handler script defines {name}, which this container does not run ({why})"
            )
    if "transform_fn" in hooks and {"input_fn", "predict_fn", "output_fn"} & hooks:
        raise ValueError(
            "Cannot use transform_fn implementation in conjunction with input_fn, predict_fn, "
            "and/or output_fn implementation"
        )


def check_requirements(code: UserCode | None) -> None:
    """Refuse to start when the script's requirements.txt lists what this environment lacks:
    SageMaker installs it at start; here the control plane installs it from local models
    (`control.requirements`)."""
    if code is None:
        return
    missing = missing_requirements(Path(code.folder))
    if missing:
        raise ModuleNotFoundError(
            f"code/requirements.txt lists what this container's environment lacks: {', '.join(missing)}. "
            "A model read from S3 is not inspected at deploy time: list them in RuntimeEnvironment.Pip"
        )


def parameter_count(function: Callable[..., Any]) -> int | None:
    """How many parameters a hook declares (None when Python cannot say)."""
    try:
        return len(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def call_hook(
    hook: str,
    function: Callable[..., Any],
    count: int | None,
    context: InvocationContext,
    *args: Any,
) -> Any:
    """Call a user's hook as the toolkit does: with the context when it takes one argument more
    (`count`: its `parameter_count`)."""
    if count is None:
        count = len(args)
    if count == len(args) + 1:
        return function(*args, context)
    if count == len(args):
        return function(*args)
    raise TypeError(f"{hook} takes {count} arguments but {len(args)} were given")
