"""Custom Python stack: the user's `code/inference.py` does the work.

Without a `model_fn` the model is None; without a `predict_fn` (or `transform_fn`) the model
must be callable. Input the default decoder cannot read reaches a user `input_fn` as raw bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.runtimes.base import Runtime


class PythonRuntime(Runtime):
    """Serves whatever the user's handler functions define."""

    name = "python"

    def load(self) -> None:
        super().load()
        if not {"predict_fn", "transform_fn"} & set(self._hooks) and not callable(self.model):
            self.unload()
            raise RuntimeError(
                "the python stack needs code/inference.py defining predict_fn or transform_fn "
                "(or a model_fn returning a callable)"
            )

    def accepts_batches(self) -> bool:
        # The user's code is all there is: it batches only when it says so (`accepts_batches =
        # True`).
        return "transform_fn" not in self._hooks and self._declares_batches()

    def model_fn(self, model_dir: Path | None) -> Any:
        return None

    def predict_fn(self, data: Any, model: Any) -> Any:
        return model(data)
