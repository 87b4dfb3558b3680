"""Run first in every worker process of the embedded Ray (`RAY_preload_python_modules`,
ray_wing/cluster.py).

Ray Serve's utilities import pandas when it is installed (this runtime's SDK needs it), only to
encode DataFrames in the responses of Serve's HTTP proxy, which this runtime does not run. That
import cost CPU at start and memory in every Serve worker: each container replica, the gateway, the
registry and Serve's controller (docs/benchmarks/bench_idle.md). This module makes that one import
find no pandas, which Serve handles as pandas being absent; everyone else gets pandas as usual. It
imports nothing itself, so a worker that never imports Serve (a trainer's, a task's) pays nothing.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

__all__ = ["ServeWithoutPandas", "install"]

# Ray 2.60: `try: import pandas as pd / except ImportError: pd = None`
_SERVE_UTILS = "ray.serve._private.utils"


def _importer(frame: FrameType | None) -> str | None:
    """The module whose code runs the import that reached this finder: the first frame outside
    importlib."""
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return None if frame is None else frame.f_globals.get("__name__")


class ServeWithoutPandas:
    """A meta path finder that answers "no such module" to Serve's import of pandas, once, then
    steps aside."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname != "pandas" or _importer(sys._getframe(1)) != _SERVE_UTILS:
            return None  # every other finder goes on as usual
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # Serve imports it once per process
        raise ModuleNotFoundError(
            f"pandas is not loaded for {_SERVE_UTILS} (serving._worker_preload)", name=fullname
        )


def install() -> None:
    """Put the finder first, unless pandas or Serve's utilities are already imported (then it is too
    late)."""
    if "pandas" in sys.modules or _SERVE_UTILS in sys.modules:
        return
    if not any(isinstance(finder, ServeWithoutPandas) for finder in sys.meta_path):
        sys.meta_path.insert(0, ServeWithoutPandas())


install()
