"""`import tensorflow` without the Keras it imports eagerly, for containers whose model needs no
Keras.

TensorFlow's `__init__` ends by importing Keras' optimizers to register them, which loads the whole
of Keras 3 and, through its wrappers, scikit-learn: a large share of a TensorFlow container
process's start (docs/benchmarks/bench_idle.md). A SavedModel loads and runs through
`tf.saved_model` alone (an object whose registered class is missing is revived as a generic object;
a serving signature never calls an optimizer). Keras still loads, whole, the moment anything imports
it: a `.keras` model, a script's `tf.keras`. A `.keras` model alone in its process (no script, no
other model) needs Keras but not its scikit-learn wrappers: `import_keras(without_sklearn=True)`
leaves them out.
"""

from __future__ import annotations

import importlib.abc
import sys
from types import FrameType
from typing import Any

# The one module TensorFlow's __init__ imports for Keras (in a try that tolerates ImportError).
EAGER_KERAS_MODULE = "keras.src.optimizers"
# Keras' scikit-learn wrappers: `try: import sklearn / except ImportError: sklearn = None`, with
# stand-in base classes.
KERAS_SKLEARN_WRAPPERS = "keras.src.wrappers"


def import_tensorflow() -> Any:
    """The `tensorflow` module, imported without Keras unless something imported Keras already."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    defer = "keras" not in sys.modules and EAGER_KERAS_MODULE not in sys.modules
    if defer:
        # importlib: "import halted", an ImportError
        sys.modules[EAGER_KERAS_MODULE] = None  # type: ignore[assignment]
    try:
        import tensorflow
    finally:
        if defer and sys.modules.get(EAGER_KERAS_MODULE, False) is None:
            del sys.modules[EAGER_KERAS_MODULE]  # a later `import keras` loads it as usual
    return tensorflow


def _importer(frame: FrameType | None) -> str:
    """The module whose code runs an import that reached a finder: the first frame outside
    importlib."""
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return "" if frame is None else frame.f_globals.get("__name__") or ""


class _KerasWrappersWithoutSklearn(importlib.abc.MetaPathFinder):
    """Answers "no such module" to the scikit-learn imports of Keras' scikit-learn wrappers, and to
    no one else."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.partition(".")[0] != "sklearn":
            return None
        importer = _importer(sys._getframe(1))
        if importer == KERAS_SKLEARN_WRAPPERS or importer.startswith(KERAS_SKLEARN_WRAPPERS + "."):
            raise ModuleNotFoundError(
                f"{fullname} is not loaded for Keras' wrappers (serving.runtimes.tf_import)",
                name=fullname,
            )
        return None


def import_keras(without_sklearn: bool) -> Any:
    """The `keras` module. With `without_sklearn`, and unless Keras or scikit-learn is loaded
    already, Keras loads without the scikit-learn its wrappers import (~1.3 CPU-seconds and ~60 MiB
    here): its `SKLearnClassifier` and the like then raise ImportError when used, as where
    scikit-learn is not installed. Only for a process that will load no script and no other
    model."""
    if without_sklearn and "keras" not in sys.modules and "sklearn" not in sys.modules:
        finder = _KerasWrappersWithoutSklearn()
        sys.meta_path.insert(0, finder)
        try:
            import keras
        finally:
            sys.meta_path.remove(finder)
    import keras

    return keras
