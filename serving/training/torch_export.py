"""A trained PyTorch model in the formats the serving stacks load: TorchScript (`pytorch`) and ONNX
(`onnx`)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from serving.training.run_records import ModelSetup, Signature

__all__ = ["INPUT_NAME", "OUTPUT_NAME", "export_model"]

INPUT_NAME = "input"
OUTPUT_NAME = "output"


def export_model(
    model: torch.nn.Module, folder: Path, setup: ModelSetup, sample: np.ndarray
) -> Signature:
    """Write model.pt (TorchScript) and/or model.onnx into `folder`; returns the input/output
    signature."""
    folder.mkdir(parents=True, exist_ok=True)
    formats = setup["recipe"]["output"]["formats"]
    example = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32))
    with torch.no_grad():
        outputs = model(example).shape[1]
    with warnings.catch_warnings():
        # TorchScript's and the exporter's notices about their own futures
        warnings.simplefilter("ignore")
        if "torchscript" in formats:
            scripted = torch.jit.trace(model, example)
            scripted.save(str(folder / "model.pt"))
        if "onnx" in formats:
            batch = torch.export.Dim("batch")
            torch.onnx.export(
                model,
                (example,),
                str(folder / "model.onnx"),
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_shapes={"x": {0: batch}},
                dynamo=True,
                optimize=False,
                verbose=False,
                external_data=False,  # one self-contained model.onnx
            )
    classification = setup["task"] == "classification"
    return {
        "inputs": [
            {
                "name": INPUT_NAME,
                "dtype": "float32",
                "shape": [-1, int(sample.shape[1])],
                "columns": setup["features"],
            }
        ],
        "outputs": [
            {
                "name": OUTPUT_NAME,
                "dtype": "float32",
                "shape": [-1, int(outputs)],
                "meaning": "class scores (logits), in the order of `classes`"
                if classification
                else "the predicted value",
            }
        ],
        "classes": setup["classes"] if classification else None,
    }
