"""ONNX stack: an onnxruntime `InferenceSession` on the CPU, or on CUDA when the container has a
GPU.

Input names, shapes and element types come from the model; a request's arrays are
cast to them, and a model with several inputs takes a JSON object keyed by input name.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from serving.runtimes.tensor_metadata import TensorMetadata
from serving.runtimes.tensors import (
    InputSpec,
    ModelInputError,
    TensorRuntime,
    cpu_threads,
    describe_array,
    gpu_share,
    v2_tensor,
)

logger = logging.getLogger("serving.runtimes.onnx")

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"

# ONNX tensor element types (as onnxruntime names them) and their NumPy dtypes.
ELEMENT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.object_,
}


class OnnxRuntime(TensorRuntime):
    """Serves one ONNX model with onnxruntime."""

    name = "onnx"
    frameworks = ("onnxruntime",)

    def model_fn(self, model_dir: Path | None) -> Any:
        import onnxruntime as ort

        if model_dir is None:
            raise FileNotFoundError("the onnx stack needs ModelDataUrl")
        path = model_dir / "model.onnx"
        if not path.is_file():
            found = sorted(model_dir.glob("*.onnx"))
            if not found:
                raise FileNotFoundError(f"no model.onnx (or other *.onnx file) in {model_dir}")
            path = found[0]
        options = ort.SessionOptions()
        # Intra-op threads sleep between calls instead of spinning: a server's calls come with gaps,
        # and each spin burns a core for nothing (a 1-row MLP, calls 2 ms apart: 2.8 ms of CPU per
        # call spinning, 0.5 ms not), CPU the replica's HTTP work and the node's other containers
        # need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        threads = cpu_threads(self.environment, self.prediction_threads())
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), sess_options=options, providers=self.providers(ort))

    def providers(self, ort: Any) -> list[str]:
        """CUDA first when the container has a GPU and onnxruntime was built with it; CPU always."""
        if gpu_share(self.environment) > 0:
            if CUDA_PROVIDER in ort.get_available_providers():
                return [CUDA_PROVIDER, CPU_PROVIDER]
            logger.warning(
                "container has a GPU share but this onnxruntime has no CUDA provider: running on CPU"
            )
        return [CPU_PROVIDER]

    def input_specs(self, model: Any) -> list[InputSpec]:
        return [
            InputSpec(
                node.name,
                None
                if node.shape is None
                else tuple(d if isinstance(d, int) and d >= 0 else None for d in node.shape),
                np.dtype(ELEMENT_TYPES[node.type]) if node.type in ELEMENT_TYPES else None,
            )
            for node in model.get_inputs()
        ]

    def output_tensors(self, model: Any) -> list[TensorMetadata]:
        return [
            v2_tensor(
                node.name,
                np.dtype(ELEMENT_TYPES[node.type]) if node.type in ELEMENT_TYPES else None,
                None
                if node.shape is None
                else tuple(d if isinstance(d, int) and d >= 0 else None for d in node.shape),
            )
            for node in model.get_outputs()
        ]

    def run(self, model: Any, inputs: dict[str, np.ndarray]) -> Any:
        try:
            values = model.run(None, inputs)
        # onnxruntime raises its own InvalidArgument / Fail / RuntimeException types
        except Exception as error:
            given = ", ".join(f"{name} {describe_array(array)}" for name, array in inputs.items())
            detail = " ".join(str(error).split())
            raise ModelInputError(f"the model failed on input {given}: {detail}") from error
        return {node.name: value for node, value in zip(model.get_outputs(), values)}
