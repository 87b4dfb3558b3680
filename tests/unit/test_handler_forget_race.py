"""serving.runtimes.handler: a failed load forgets the model's modules while other threads import."""

from __future__ import annotations

import sys
import threading
import types

from serving.runtimes import handler


def test_forgetting_a_models_modules_survives_imports_on_other_threads() -> None:
    # A MultiModel container loads models on threads: one whose load failed forgot its modules by
    # iterating `sys.modules` while another thread's import added to it ("dictionary changed size
    # during iteration", seen in CI as a 424 naming that instead of the model's own error).
    stop = threading.Event()

    def importer() -> None:
        while not stop.is_set():
            for index in range(50):
                sys.modules[f"_serving_race_{index}"] = types.ModuleType("race")
            for index in range(50):
                sys.modules.pop(f"_serving_race_{index}", None)

    thread = threading.Thread(target=importer, daemon=True)
    thread.start()
    try:
        for _ in range(3000):
            handler._forget("_serving_race_model", "/nowhere")
    finally:
        stop.set()
        thread.join(5)
