"""The echo model the simulated cluster's tests and benchmarks serve: a `python` container whose handler
answers with its process ID (so a caller sees which host answered) and the request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ECHO = """
import json, os

def input_fn(body, content_type):
    return json.loads(body)

def predict_fn(data, model):
    return {"pid": os.getpid(), "input": data}

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
"""


def echo_model(root: Path) -> Path:
    """The echo's model folder under `root` (its `code/inference.py`)."""
    model = root / "echo"
    (model / "code").mkdir(parents=True, exist_ok=True)
    (model / "code" / "inference.py").write_text(ECHO)
    return model


def echo_container(
    model: Path, name: str, custom: dict[str, float], replicas: int = 1
) -> dict[str, Any]:
    """A spec's container serving the echo at `model`, on nodes with the `custom` resources, with a
    fixed count of `replicas`."""
    return {
        "ContainerHostname": name,
        "Image": "python",
        "ModelDataUrl": str(model),
        "Resources": {"Cpus": 0.1, "Custom": custom},
        "AutoScaling": {"MinCapacity": replicas, "MaxCapacity": replicas},
    }
