"""Loading a user's `code/inference.py` with SageMaker's handler functions, its imports private to
its model.

A model's `code/` folder becomes a package of its own, `_serving_code_<n>` (unique per load), never
put on `sys.path`, so two models' `helper.py` never meet and a later load of the same name gets
fresh code (docs/security.md). The user's files stay as written (`import helper`, not `from . import
helper`): the package's modules get builtins whose `__import__` sends an absolute import of a name
`code/` holds into the package.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.machinery
import importlib.util
import itertools
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.runtimes.sourcedir import CodeFolder, code_folder

# Every hook any SageMaker serving container looks for; each stack says which of them it runs
# (`Runtime`).
HOOK_NAMES = (
    "model_fn",
    "input_fn",
    "predict_fn",
    "output_fn",
    "transform_fn",
    "pre_model_fn",
    "model_warmup_fn",
    "input_handler",  # the TensorFlow Serving container's
    "output_handler",
    "handler",
    "execution_parameters_fn",  # the scikit-learn container's, for batch transform
    "autoscaling_metrics",  # ours: custom metrics for target tracking (docs/autoscaling.md)
)
DEFAULT_PROGRAM = "inference.py"
PACKAGE_PREFIX = "_serving_code_"

_ids = itertools.count(1)
_lock = threading.Lock()
# A module's builtins: every name Python's `builtins` has, and whatever a user's code adds; open by
# nature.
Builtins = dict[str, Any]
_packages: dict[str, Builtins] = {}  # package name -> the builtins its modules run with


@dataclass
class UserCode:
    """A model's loaded `code/` package and the hooks its `inference.py` defines."""

    package: str
    folder: str
    hooks: dict[str, Callable[..., Any]]
    # the imported handler module, for stacks that read other names from it (tensorflow)
    module: Any = None
    # where it came from: a folder, or a sourcedir.tar.gz unpacked for this load
    source: CodeFolder | None = None

    def unload(self) -> None:
        """Forget the package's modules and delete what was unpacked for them (the model is gone;
        its functions keep working if still referenced)."""
        _forget(self.package, self.folder)
        if self.source is not None:
            self.source.remove()


def entry_point(
    folder: CodeFolder | None, program: str | None = None, submit_directory: str | None = None
) -> Path | None:
    """The handler script as SageMaker finds it: `SAGEMAKER_PROGRAM` (default inference.py) in
    the code folder (`sourcedir.code_folder`). None when the default script is absent; a script or
    folder the environment names explicitly must exist."""
    if folder is None:
        return None
    name = program or DEFAULT_PROGRAM
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(
            f"SAGEMAKER_PROGRAM {name!r} must name a script in the code folder, not a path"
        )
    script = folder.path / (name if name.endswith(".py") else f"{name}.py")
    if script.is_file():
        return script
    if program or submit_directory:
        where = (
            f"SAGEMAKER_SUBMIT_DIRECTORY {submit_directory!r}"
            if submit_directory
            else "the model's code/"
        )
        raise FileNotFoundError(f"SAGEMAKER_PROGRAM {name!r} not found in {where}")
    return None


def load_user_code(
    model_dir: Path | None, program: str | None = None, submit_directory: str | None = None
) -> UserCode | None:
    """Import the handler script (`entry_point`) as a module of a private package made of its
    folder; None when there is none. A `sourcedir.tar.gz` is unpacked for this load, and removed
    when it unloads (or fails)."""
    folder = code_folder(model_dir, submit_directory)
    try:
        path = entry_point(folder, program, submit_directory)
    except BaseException:
        if folder is not None:
            folder.remove()
        raise
    if path is None:
        return None
    assert folder is not None
    resolved = str(path.parent.resolve())
    package = f"{PACKAGE_PREFIX}{next(_ids)}"
    spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
    spec.submodule_search_locations = [resolved]
    with _lock:
        _packages[package] = _builtins_for(package, _local_names(resolved))
        sys.modules[package] = importlib.util.module_from_spec(spec)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    try:
        module = importlib.import_module(f"{package}.{path.stem}")
    except BaseException:
        _forget(package, resolved)
        folder.remove()
        raise
    hooks = {
        name: getattr(module, name) for name in HOOK_NAMES if callable(getattr(module, name, None))
    }
    return UserCode(package, resolved, hooks, module, folder)


# How `import helper` in a model's code finds that model's helper: Python looks `__import__` up in
# the importing module's builtins each time an import statement runs, so the redirect holds for
# imports inside hooks at predict time too, and every other import is untouched. A meta-path finder,
# installed while any model's code is loaded, gives modules of these packages those builtins;
# `UserCode.unload` removes the package's modules and the finder (when no model is left). Not
# redirected: `importlib.import_module("helper")` (not an import statement; use
# `importlib.import_module(".helper", __package__)`), and unpickling objects whose classes were
# pickled as `helper.X` by another process (pickle imports `helper` itself).
def _local_names(folder: str) -> frozenset[str]:
    """Top-level module names `code/` provides: `.py` and extension files, and regular packages."""
    names = set()
    suffixes = importlib.machinery.all_suffixes()
    for entry in os.scandir(folder):
        if entry.is_dir():
            if entry.name.isidentifier() and os.path.isfile(
                os.path.join(entry.path, "__init__.py")
            ):
                names.add(entry.name)
            continue
        for suffix in suffixes:
            stem = entry.name[: -len(suffix)]
            if entry.name.endswith(suffix) and stem.isidentifier():
                names.add(stem)
    return frozenset(names)


def _builtins_for(package: str, local: frozenset[str]) -> Builtins:
    """The builtins of `package`'s modules: the real ones, with imports of local names sent into the
    package."""
    real_import = builtins.__import__

    def __import__(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A001 (the builtin's own name)
        top = name.partition(".")[0]
        if level == 0 and top in local:
            module = real_import(f"{package}.{name}", globals, locals, fromlist, 0)
            # `import a.b` binds `a`: the package's `a`, not the package itself.
            return module if fromlist else sys.modules[f"{package}.{top}"]
        return real_import(name, globals, locals, fromlist, level)

    namespace = dict(vars(builtins))
    namespace["__import__"] = __import__
    return namespace


class _CodeLoader(importlib.machinery.SourceFileLoader):
    """Executes a module of a model's code/ package with that package's builtins."""

    def __init__(self, fullname: str, path: str, namespace: Builtins) -> None:
        super().__init__(fullname, path)
        self.namespace = namespace

    def exec_module(self, module: Any) -> None:
        module.__builtins__ = self.namespace
        super().exec_module(module)


class _CodeFinder:
    """Finds the modules of loaded models' code/ packages as usual, and loads them with
    `_CodeLoader`."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        package, dot, _ = fullname.partition(".")
        namespace = _packages.get(package) if dot else None
        if namespace is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if (
            spec is not None
            and spec.origin
            and type(spec.loader) is importlib.machinery.SourceFileLoader
        ):
            spec.loader = _CodeLoader(fullname, spec.origin, namespace)
        return spec

    @staticmethod
    def invalidate_caches() -> None:
        """Nothing cached here (importlib.invalidate_caches calls this)."""


_finder = _CodeFinder()


def _forget(package: str, folder: str) -> None:
    with _lock:
        _packages.pop(package, None)
        # a copy of the names first: another thread's import may add to sys.modules meanwhile
        for name in [
            name for name in list(sys.modules) if name == package or name.startswith(package + ".")
        ]:
            sys.modules.pop(name, None)
        sys.path_importer_cache.pop(folder, None)
        if not _packages and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
