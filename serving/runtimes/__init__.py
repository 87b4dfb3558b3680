"""Serving stacks, one module each, behind the `Runtime` interface in `base`.

Framework modules are imported only when a container of that stack starts, so a
replica pays only for the framework it serves. The interface itself (`Runtime`,
`InvocationContext`, whose codecs need NumPy) is imported on first use, so the
stack names (`STACKS`, which the spec validates `Image` against) cost nothing.

Modules: `base` (the `Runtime` interface), `answers` (what a hook returns, made into an answer),
`handler` (loading `code/inference.py`), `sourcedir` (where it lies: SAGEMAKER_SUBMIT_DIRECTORY, a
folder or a `sourcedir.tar.gz` unpacked), `script_hooks` (its hooks checked and called), `context`
(the handler context), `toolkit` (what AWS's toolkits do with an unscripted step), `codecs` and
`tensors` (bodies and shapes), `tensor_metadata` (a model's tensors as Open Inference metadata),
`concurrency` (threads and batching settings), `requirements` (a script's requirements checked at
load), one per stack (`sklearn`, `pytorch`, `tensorflow`, `onnx`,
`xgboost`, `lightgbm`, `python`, `huggingface`, `mlflow_pyfunc`), `text_generation` and `llm_wire` (a causal
LM's tokens, and the TGI and OpenAI events they go out in), `skops_trust`, `tf_import`, `tfs` and `tfs_json`
(SageMaker's TF Serving contract), `xgboost_codecs` (SageMaker's XGBoost bodies), `mlflow_artifacts` (an
MLflow model directory loaded, and which flavors may load untrusted) and `mlflow_scoring` (MLflow's scoring
protocol).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.runtimes.base import InvocationContext, Runtime

STACK_CLASSES = {
    "sklearn": "serving.runtimes.sklearn:SklearnRuntime",
    "pytorch": "serving.runtimes.pytorch:PyTorchRuntime",
    "tensorflow": "serving.runtimes.tensorflow:TensorFlowRuntime",
    "onnx": "serving.runtimes.onnx:OnnxRuntime",
    "xgboost": "serving.runtimes.xgboost:XGBoostRuntime",
    "lightgbm": "serving.runtimes.lightgbm:LightGBMRuntime",
    "python": "serving.runtimes.python:PythonRuntime",
    "mlflow": "serving.runtimes.mlflow_pyfunc:MLflowRuntime",
    "huggingface": "serving.runtimes.huggingface:HuggingFaceRuntime",
}


def runtime_class(image: str) -> type[Runtime]:
    """The runtime class of a container's Image (importing its stack's module)."""
    try:
        module_name, class_name = STACK_CLASSES[image].split(":")
    except KeyError:
        raise ValueError(f"unknown serving stack {image!r}") from None
    return getattr(importlib.import_module(module_name), class_name)


def runtime_for(image: str, model_dir: Path | None, environment: Mapping[str, str]) -> Runtime:
    """A not-yet-loaded runtime for a container's Image."""
    return runtime_class(image)(model_dir, environment)


STACKS = tuple(STACK_CLASSES)


def __getattr__(name: str) -> Any:
    # PEP 562: `from serving.runtimes import Runtime` loads base (and NumPy) then, not with the
    # package.
    if name in ("InvocationContext", "Runtime"):
        from serving.runtimes import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["STACKS", "InvocationContext", "Runtime", "runtime_class", "runtime_for"]
