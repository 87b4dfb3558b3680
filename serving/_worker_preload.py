"""Run first in every worker process of the embedded Ray (`RAY_preload_python_modules`,
ray_wing/cluster.py), and by `serving up` before it imports Ray.

Two imports Ray makes in every process only for features this runtime's Serve processes never use;
each cost memory and start-up CPU in every Serve worker (each container replica, the gateway, the
control plane, the registry and Serve's controller; docs/benchmarks/bench_idle.md):

- Ray Serve's utilities import pandas when it is installed (this runtime's SDK needs it), only to
  encode DataFrames in the responses of Serve's HTTP proxy, which this runtime does not run. That
  one import finds no pandas, which Serve handles as pandas being absent; everyone else gets pandas
  as usual.
- Ray registers its serializers for Arrow tables (Ray Data's) in each process's first
  serialization context, importing pyarrow to do so. That import finds no pyarrow; the serializers
  are registered the moment anything else in the process imports pyarrow (a trainer's Ray Data, a
  model's pandas), which is before the process can hold an Arrow table to send. A process that
  receives one needs none: what the sender's serializer writes names its own decoder.

It imports nothing itself, so a worker that never imports Serve or pyarrow pays nothing.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

__all__ = ["ArrowOnFirstUse", "ServeWithoutPandas", "install"]

# Ray 2.60: `try: import pandas as pd / except ImportError: pd = None`
_SERVE_UTILS = "ray.serve._private.utils"
# Ray 2.60: `try: import pyarrow / except ModuleNotFoundError: return` (no Arrow, no serializers)
_ARROW_SERIALIZERS = "ray._private.arrow_serialization"


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


class ArrowOnFirstUse:
    """A meta path finder that answers "no such module" to Ray's import of pyarrow for its Arrow
    serializers, and registers them once anything else imports pyarrow, then steps aside."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "pyarrow":
            return None
        if _importer(sys._getframe(1)) == _ARROW_SERIALIZERS:
            raise ModuleNotFoundError(
                f"pyarrow is not loaded for {_ARROW_SERIALIZERS} until first used (serving._worker_preload)",
                name=fullname,
            )
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # from now on Ray's own import finds pyarrow too
        spec = next(
            (
                found
                for finder in sys.meta_path
                if (found := getattr(finder, "find_spec", lambda *_: None)(fullname, path, target))
            ),
            None,
        )
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                load(module)
                _register_arrow_serializers()

            spec.loader.exec_module = exec_module  # this spec's loader only
        return spec


def _register_arrow_serializers() -> None:
    """What Ray would have registered in each serialization context this process made so far (it
    registers them itself in any later one). Nothing was skipped if Ray never asked."""
    serializers, worker = (
        sys.modules.get(_ARROW_SERIALIZERS),
        sys.modules.get("ray._private.worker"),
    )
    if serializers is None or worker is None:
        return
    for context in list(worker.global_worker.serialization_context_map.values()):
        serializers._register_custom_datasets_serializers(context)


def install() -> None:
    """Put the finders first, each unless what it guards is already imported (then it is too
    late)."""
    if "pandas" not in sys.modules and _SERVE_UTILS not in sys.modules:
        if not any(isinstance(finder, ServeWithoutPandas) for finder in sys.meta_path):
            sys.meta_path.insert(0, ServeWithoutPandas())
    if "pyarrow" not in sys.modules and _ARROW_SERIALIZERS not in sys.modules:
        if not any(isinstance(finder, ArrowOnFirstUse) for finder in sys.meta_path):
            sys.meta_path.insert(0, ArrowOnFirstUse())


install()
