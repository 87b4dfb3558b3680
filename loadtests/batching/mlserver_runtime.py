"""MLServer runtimes for the batching benchmark's TorchScript and ONNX models (MLServer 1.7.1 ships
neither).

Copied into each MLServer model folder and named by its model-settings.json (`implementation`); it
runs in MLServer's own virtual environment, never imported by this project. What a user would write:
decode the V2 tensor with NumpyCodec, run the model, encode the answer. MLServer's adaptive batching
(`max_batch_size`, `max_batch_time`) merges concurrent requests along the first axis before
`predict` and splits the answer after. The frameworks' thread pools get what ours get (over_http:
BENCH_NUM_THREADS intra-op threads, ONNX Runtime's pool not spinning, OMP_WAIT_POLICY=PASSIVE): the
comparison is of the servers, not of framework settings.
"""

import os

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class TorchScriptModel(MLModel):
    async def load(self) -> bool:
        import torch

        torch.set_num_threads(int(os.environ.get("BENCH_NUM_THREADS", "1")))
        self._torch = torch
        self._model = torch.jit.load(await get_model_uri(self.settings)).eval()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        rows = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        with self._torch.inference_mode():
            out = self._model(self._torch.from_numpy(rows)).numpy()
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("output", out)]
        )


class OnnxModel(MLModel):
    async def load(self) -> bool:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = int(os.environ.get("BENCH_NUM_THREADS", "1"))
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = onnxruntime.InferenceSession(
            await get_model_uri(self.settings), options, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        rows = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        out = self._session.run(None, {self._input: rows})[0]
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("output", out)]
        )
