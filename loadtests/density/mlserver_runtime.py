"""An MLServer runtime for the stacks MLServer 1.7.1 has none for (PyTorch, TensorFlow, ONNX, a
SageMaker-style Python script), as a user would write one: decode the V2 inputs, call the framework,
encode the answer.

Copied into each MLServer model folder next to `density_loaders.py` (a copy of `loaders`, which
loads the artifact with its framework) and named by its model-settings.json (`implementation`,
`parameters.extra.stack`); it runs in MLServer's own virtual environment, never imported by this
project.
"""

import importlib.util
from pathlib import Path

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


def _loaders():
    """density_loaders.py from this file's folder (MLServer's workers do not have it on the path)."""
    spec = importlib.util.spec_from_file_location(
        "density_loaders", Path(__file__).with_name("density_loaders.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FrameworkModel(MLModel):
    async def load(self) -> bool:
        stack = self.settings.parameters.extra["stack"]
        self._predict = _loaders().load(stack, Path(await get_model_uri(self.settings)))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        named = {i.name: NumpyCodec.decode_input(i).tolist() for i in payload.inputs}
        answer = self._predict(named if len(named) > 1 else next(iter(named.values())))
        if isinstance(answer, dict):  # a script's {"labels": names}
            answer = next(iter(answer.values()))
        if answer and isinstance(answer[0], str):
            output = StringCodec.encode_output("output", answer)
        else:
            output = NumpyCodec.encode_output("output", np.asarray(answer))
        return InferenceResponse(model_name=self.name, outputs=[output])
