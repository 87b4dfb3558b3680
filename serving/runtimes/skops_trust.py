"""Which types a `.skops` file may build: skops' own defaults, a reviewed list, and the operator's.

skops refuses every type it does not trust by default (functions included: only NumPy and SciPy
ufuncs are). Plain scikit-learn models need one more, `sklearn.tree._tree.Tree` (decision trees,
forests, gradient boosting), which skops leaves out because a crafted Tree's node indices make
scikit-learn read out of bounds; so it is trusted here only together with `check_trees`, which
refuses such indices. Anything else, a function above all, must be named in
`SERVING_SKOPS_TRUSTED_TYPES`: a trusted function is called with request data (FunctionTransformer).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from serving.protocol import SKOPS_TRUSTED_TYPES_ENV as TRUSTED_TYPES_ENV

# Reviewed data holders: the type, and why trusting it cannot run code.
REVIEWED_TYPES = {
    # Cython tree storage (node and value arrays only, rebuilt by its own __setstate__); its indices
    # are bounds-checked by `check_trees` after loading.
    "sklearn.tree._tree.Tree",
}


def operator_types(environment: Mapping[str, str]) -> set[str]:
    """The exact type names the container's Environment trusts."""
    return {
        name.strip() for name in environment.get(TRUSTED_TYPES_ENV, "").split(",") if name.strip()
    }


# sklearn's array-API shims for other frameworks: `sklearn.externals.array_api_compat.<framework>`
# imports it whole.
_ARRAY_API_SHIMS = ("torch", "cupy", "dask", "jax")
_SHIM_PREFIX = "sklearn.externals.array_api_compat."
_FIRST_IMPORT = threading.Lock()


class _SkipUnusedArrayApiShims(importlib.abc.MetaPathFinder):
    """Refuses the shim of a framework this process has not imported (ImportError, which a package
    walk skips)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        framework = name.removeprefix(_SHIM_PREFIX)
        if (
            name.startswith(_SHIM_PREFIX)
            and framework in _ARRAY_API_SHIMS
            and framework not in sys.modules
        ):
            raise ImportError(f"{name}: not needed to list scikit-learn's estimators", name=name)
        return None


def import_skops() -> Any:
    """`skops.io`, imported without PyTorch.

    skops lists scikit-learn's estimators when first imported (`all_estimators()`), and that walk
    imports every subpackage of sklearn, `sklearn.externals.array_api_compat.torch` among them,
    which imports all of PyTorch (~2 s of CPU per container process here) although no estimator
    lives there. For that first import only, the shims of frameworks this process has not imported
    are refused; skops' trusted names come out the same (tests/unit/test_skops_import.py), and the
    shims import normally afterwards (an ImportError leaves nothing in sys.modules).
    """
    with _FIRST_IMPORT:  # a MultiModel container may load models on several threads
        if "skops.io" not in sys.modules:
            finder = _SkipUnusedArrayApiShims()
            sys.meta_path.insert(0, finder)
            try:
                import skops.io
            finally:
                sys.meta_path.remove(finder)
        import skops.io
    return skops.io


def load_skops(path: Path, environment: Mapping[str, str]) -> Any:
    """The object in a `.skops` file, or PermissionError naming every type it would build that is
    not trusted."""
    skops_io = import_skops()

    trusted = REVIEWED_TYPES | operator_types(environment)
    refused = [name for name in skops_io.get_untrusted_types(file=path) if name not in trusted]
    if refused:
        raise PermissionError(
            f"{path.name} would build types that are not trusted: {', '.join(refused)}. A type or function listed "
            f"in Environment {TRUSTED_TYPES_ENV} is trusted to run with request data: list it only if you trust "
            "this artifact"
        )
    # skops audits the file again against the same list
    model = skops_io.load(path, trusted=sorted(trusted))
    check_trees(model, path.name)
    return model


def check_trees(model: Any, name: str) -> None:
    """Refuse decision trees whose node indices scikit-learn would follow out of bounds (no bounds
    checks in C)."""
    from sklearn.ensemble._gb import BaseGradientBoosting
    from sklearn.tree._tree import Tree

    for obj in _objects(model):
        if isinstance(obj, Tree) and not _nodes_in_range(obj):
            raise ValueError(
                f"{name}: a decision tree's node indices are out of range (corrupt or crafted file)"
            )
        attributes = getattr(obj, "__dict__", None)
        if not isinstance(attributes, dict):
            continue
        tree = attributes.get("tree_")
        if isinstance(tree, Tree) and attributes.get("n_features_in_") != tree.n_features:
            # The estimator checks a request's width against n_features_in_; the tree reads up to
            # n_features.
            raise ValueError(
                f"{name}: a decision tree's feature count does not match its estimator's"
            )
        # predicts from its trees' nodes without their own checks
        if isinstance(obj, BaseGradientBoosting):
            if any(
                getattr(stage, "tree_", None) is None
                or stage.tree_.n_features != obj.n_features_in_
                for stage in np.ravel(obj.estimators_)
            ):
                raise ValueError(
                    f"{name}: a gradient-boosting stage does not match the model's feature count"
                )


def _nodes_in_range(tree: Any) -> bool:
    nodes = tree.__getstate__()["nodes"]
    ids = np.arange(len(nodes))
    left, right, feature = nodes["left_child"], nodes["right_child"], nodes["feature"]
    leaf = (left == -1) & (right == -1)
    # scikit-learn adds children after their parent: ids only grow along a path, so no cycles
    # either.
    split = (
        (left > ids)
        & (left < len(nodes))
        & (right > ids)
        & (right < len(nodes))
        & (feature >= 0)
        & (feature < tree.n_features)
    )
    return bool(np.all(leaf | split))


def _objects(root: Any) -> Iterator[Any]:
    """Every object reachable from `root` through attributes, containers and object arrays (once
    each)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, np.ndarray):
            if obj.dtype == object:
                stack.extend(obj.ravel())
        elif isinstance(getattr(obj, "__dict__", None), dict):
            stack.extend(vars(obj).values())
