"""`import tensorflow` without the Keras it imports eagerly, for containers whose model needs no Keras.

TensorFlow's `__init__` ends by importing `keras.src.optimizers` "so that any function/method that needs to
happen at load time will trigger, eg registration of optimizers in the SavedModel registry". That import loads
the whole of Keras 3, and Keras loads scikit-learn for its wrappers: ~3 CPU-seconds, ~1,700 modules and ~140 MiB
in every TensorFlow container process, of the ~7.5-8 CPU-seconds its start costs (docs/performance.md, "Container
process start, one by one"). A SavedModel is loaded and called through `tf.saved_model` alone: an object whose
registered class is not in the registry is revived as TensorFlow's generic object, and a serving signature never
calls an optimizer. Keras still loads, whole and in the usual order, the moment anything imports it: a `.keras`
model, a script's `tf.keras`.
"""

from __future__ import annotations

import sys
from typing import Any

# The one module TensorFlow's __init__ imports for Keras (in a try that tolerates ImportError).
EAGER_KERAS_MODULE = "keras.src.optimizers"


def import_tensorflow() -> Any:
    """The `tensorflow` module, imported without Keras unless something imported Keras already."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    defer = "keras" not in sys.modules and EAGER_KERAS_MODULE not in sys.modules
    if defer:
        sys.modules[EAGER_KERAS_MODULE] = None  # type: ignore[assignment]  # importlib: "import halted", an ImportError
    try:
        import tensorflow
    finally:
        if defer and sys.modules.get(EAGER_KERAS_MODULE, False) is None:
            del sys.modules[EAGER_KERAS_MODULE]  # a later `import keras` loads it as usual
    return tensorflow
