"""Loading a user's `code/inference.py` with SageMaker's handler functions."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

HOOK_NAMES = ("model_fn", "input_fn", "predict_fn", "output_fn",
              "autoscaling_metrics")  # ours: custom metrics for target tracking (docs/autoscaling.md)
HANDLER_PATH = Path("code") / "inference.py"


def load_user_hooks(model_dir: Path) -> dict[str, Callable[..., Any]]:
    """The hooks defined in `model_dir/code/inference.py`; empty when there is no such file.

    The file's folder goes on sys.path so that it can import its own helper modules,
    as the SageMaker framework containers allow.
    """
    path = model_dir / HANDLER_PATH
    if not path.is_file():
        return {}
    code_dir = str(path.parent)
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    module_name = "serving_user_handler_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return {name: getattr(module, name) for name in HOOK_NAMES if callable(getattr(module, name, None))}
