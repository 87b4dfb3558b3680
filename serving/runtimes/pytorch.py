"""PyTorch stack: TorchScript, `torch.export` programs, or a state dict loaded by the user's
`model_fn`.

Weights never unpickle arbitrary objects: `torch.load(weights_only=True)`, unless the
artifact's own `code/inference.py` loads otherwise or the container opts in with
`SERVING_ALLOW_PICKLE`. A `.pt2` needs that opt-in too: `torch.export.load` falls back to
full unpickling for parts of the archive, hands its shape expressions to `sympy.sympify`
(which evaluates Python) and calls any callable its graph names under `torch.`, so a `.pt2`
is code. Inference runs under `torch.inference_mode()` with the thread count of the
container's CPU share, on CUDA when the container has a GPU.
"""

from __future__ import annotations

import inspect
import logging
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from serving.protocol import ALLOW_PICKLE_ENV
from serving.runtimes import toolkit
from serving.runtimes.tensors import (
    InputSpec,
    ModelInputError,
    TensorRuntime,
    cpu_threads,
    describe_array,
    gpu_share,
)

logger = logging.getLogger("serving.runtimes.pytorch")

EXPORT_SUFFIXES = (".pt2",)
WEIGHT_SUFFIXES = (".pt", ".pth")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _first(model_dir: Path, suffixes: tuple[str, ...]) -> Path | None:
    for suffix in suffixes:
        if (model_dir / f"model{suffix}").is_file():
            return model_dir / f"model{suffix}"
    found = sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix in suffixes)
    return found[0] if found else None


def _is_torchscript(path: Path) -> bool:
    """TorchScript archives carry compiled code (`*/code/`, `*/constants.pkl`); torch.save archives
    do not."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(
                name.endswith("/constants.pkl") or "/code/" in name for name in archive.namelist()
            )
    except zipfile.BadZipFile:
        return False


class PyTorchRuntime(TensorRuntime):
    """Serves one PyTorch module."""

    name = "pytorch"
    frameworks = ("torch",)

    def __init__(self, model_dir: Path | None, environment) -> None:
        super().__init__(model_dir, environment)
        self.device: Any = None
        self._specs: dict[int, tuple[list[InputSpec], np.dtype | None]] = {}

    def load(self) -> None:
        import torch

        self.load_code()  # its hooks decide the model threads, hence the intra-op threads of each
        threads = cpu_threads(self.environment, self.prediction_threads())
        if threads is not None:
            torch.set_num_threads(threads)
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:  # only settable before the first parallel work in the process
                pass
        use_cuda = gpu_share(self.environment) > 0
        if use_cuda and not torch.cuda.is_available():
            logger.warning(
                "container has a GPU share but torch %s sees no CUDA device: running on CPU",
                torch.__version__,
            )
            use_cuda = False
        self.device = torch.device("cuda" if use_cuda else "cpu")
        super().load()  # user hooks, then model_fn (theirs or ours)
        self.model = self._prepare(self.model)

    def _prepare(self, model: Any) -> Any:
        """Whatever model_fn returned, in eval mode on this replica's device."""
        if hasattr(model, "to") and self.device is not None and self.device.type != "cpu":
            model = model.to(self.device)
        if hasattr(model, "eval") and callable(model.eval):
            try:
                model.eval()
            except (NotImplementedError, RuntimeError):  # torch.export modules refuse mode switches
                pass
        return model

    def model_fn(self, model_dir: Path | None) -> Any:
        import torch

        if model_dir is None:
            raise FileNotFoundError("the pytorch stack needs ModelDataUrl")
        exported = _first(model_dir, EXPORT_SUFFIXES)
        if exported is not None:
            if not _truthy(self.environment.get(ALLOW_PICKLE_ENV)):
                raise PermissionError(
                    f"refusing to load {exported.name}: torch.export.load runs code from the archive (it unpickles "
                    "parts of it and evaluates its shape expressions as Python). Save the model as TorchScript, as "
                    "weights with a code/inference.py model_fn, or for the onnx stack; or set Environment "
                    f"{ALLOW_PICKLE_ENV}: 'true' if you trust this artifact"
                )
            program = torch.export.load(exported)
            if self.device is not None and self.device.type != "cpu":
                from torch.export.passes import move_to_device_pass

                program = move_to_device_pass(program, self.device)
            return program.module()
        weights = _first(model_dir, WEIGHT_SUFFIXES)
        if weights is None:
            raise FileNotFoundError(
                f"no model.pt2 (torch.export), TorchScript model.pt or weights file in {model_dir}; "
                "a state dict also needs code/inference.py with a model_fn"
            )
        if _is_torchscript(weights):
            # TorchScript is deprecated upstream but still what many artifacts are
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.filterwarnings("ignore", message=".*deprecated.*")
                return torch.jit.load(str(weights), map_location=self.device)
        return self._load_weights(torch, weights)

    def _load_weights(self, torch: Any, path: Path) -> Any:
        if _truthy(self.environment.get(ALLOW_PICKLE_ENV)):
            return torch.load(path, map_location=self.device, weights_only=False)
        try:
            loaded = torch.load(path, map_location=self.device, weights_only=True)
        # UnpicklingError: a pickled nn.Module, or not a torch file at all
        except Exception as error:
            raise PermissionError(
                f"{path.name} is not a TorchScript, torch.export or weights-only file ({type(error).__name__}); "
                f"save the model with torch.export or TorchScript, load it in your own code/inference.py model_fn, "
                f"or set Environment {ALLOW_PICKLE_ENV}: 'true' if you trust this artifact (pickle runs arbitrary code)"
            ) from None
        if isinstance(loaded, torch.nn.Module):
            return loaded
        raise ValueError(
            f"{path.name} holds a state dict ({type(loaded).__name__}), not a model: add code/inference.py with a "
            "model_fn(model_dir) that builds the module and loads these weights (the SageMaker PyTorch convention)"
        )

    def script_defaults(self) -> dict[str, Callable[..., Any]]:
        # sagemaker-pytorch-inference-toolkit's DefaultPytorchInferenceHandler. Where the toolkit
        # would fail (a JSON object, input that is not a tensor, a float64 tensor for a float32
        # model) the stack's own handling answers instead; where it answers, the values and bytes
        # are the toolkit's.
        return {
            "input_fn": self._container_input,
            "predict_fn": self._container_predict,
            "output_fn": _container_output,
        }

    def _container_input(self, body: bytes, content_type: str | None) -> Any:
        """A float tensor of JSON/CSV input (`torch.FloatTensor`), NPY as its own dtype
        (`from_numpy`), on the device."""
        import torch

        array = toolkit.decode(toolkit.request_data(body, content_type), content_type)
        if (
            not isinstance(array, np.ndarray)
            or array.dtype == object
            or array.dtype.kind not in "fiub"
        ):
            # named inputs, TF Serving documents: the stack's own decoding
            return self.input_fn(body, content_type)
        tensor = (
            torch.FloatTensor(array)
            if content_type in toolkit.UTF8_TYPES
            else torch.from_numpy(array)
        )
        return tensor.to(self.device or "cpu")

    def _container_predict(self, data: Any, model: Any) -> Any:
        """The model on a tensor, on the device, under no_grad (the toolkit's default); other input
        the stack's way."""
        import torch

        if not isinstance(data, torch.Tensor):
            return self.predict_fn(data, model)
        float_dtype = self._describe(model)[1]
        if float_dtype is not None and data.is_floating_point():
            data = data.to(getattr(torch, float_dtype.name))
        try:
            with torch.no_grad():
                return model(data.to(self.device or "cpu"))
        except (RuntimeError, AssertionError, TypeError, ValueError, IndexError) as error:
            name = self.input_specs(model)[0].name
            given = f"{name} {describe_array(data.detach().cpu().numpy())}"
            raise ModelInputError(f"the model failed on input {given}: {_reason(error)}") from error

    # --- inputs and inference ------------------------------------------------------------
    def input_specs(self, model: Any) -> list[InputSpec]:
        return self._describe(model)[0]

    def _describe(self, model: Any) -> tuple[list[InputSpec], np.dtype | None]:
        cached = self._specs.get(id(model))
        if cached is None:
            specs = _input_specs(model)
            declared = any(spec.dtype is not None for spec in specs)
            cached = self._specs[id(model)] = (specs, None if declared else _parameter_dtype(model))
        return cached

    def run(self, model: Any, inputs: dict[str, np.ndarray]) -> Any:
        import torch

        float_dtype = self._describe(model)[1]
        if float_dtype is not None:
            # A model that does not declare its inputs (TorchScript, nn.Module) gets numbers as its
            # floating dtype, as SageMaker's PyTorch container makes a FloatTensor of them (JSON
            # cannot say 1 is a float).
            inputs = {
                name: array.astype(float_dtype) if array.dtype.kind in "fiub" else array
                for name, array in inputs.items()
            }
        tensors = [
            torch.from_numpy(np.ascontiguousarray(array)).to(self.device or "cpu")
            for array in inputs.values()
        ]
        try:
            with torch.inference_mode():
                output = model(*tensors)
        except (RuntimeError, AssertionError, TypeError, ValueError, IndexError) as error:
            given = ", ".join(f"{name} {describe_array(array)}" for name, array in inputs.items())
            raise ModelInputError(f"the model failed on input {given}: {_reason(error)}") from error
        return _to_numpy(output)


def _reason(error: Exception) -> str:
    """The line that says what went wrong; TorchScript puts it last, after its own traceback."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    for line in reversed(lines):
        if line.startswith(("RuntimeError: ", "ValueError: ", "TypeError: ", "IndexError: ")):
            return line.split(": ", 1)[1]
    return lines[0]


def _input_specs(model: Any) -> list[InputSpec]:
    """Names, and where the model records them shapes and dtypes, of the forward arguments."""
    import torch

    graph = getattr(model, "graph", None)
    if isinstance(model, torch.fx.GraphModule) and graph is not None:
        specs = [
            _spec_from_fake(node.name, node.meta.get("val"))
            for node in graph.nodes
            if node.op == "placeholder"
        ]
        if specs:
            return specs
    names = _forward_names(model)
    return [InputSpec(name) for name in names] or [InputSpec("input")]


def _spec_from_fake(name: str, value: Any) -> InputSpec:
    import torch

    if not isinstance(value, torch.Tensor):
        return InputSpec(name)
    shape = tuple(dim if isinstance(dim, int) else None for dim in value.shape)
    try:
        dtype = np.dtype(torch.empty((), dtype=value.dtype).numpy().dtype)
    except (TypeError, RuntimeError):  # bfloat16 and friends have no NumPy dtype
        dtype = None
    return InputSpec(name, shape, dtype)


def _forward_names(model: Any) -> list[str]:
    forward = getattr(model, "forward", model)
    schema = getattr(forward, "schema", None)
    if schema is not None:  # TorchScript: the first argument is self
        return [argument.name for argument in schema.arguments[1:]]
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _parameter_dtype(model: Any) -> np.dtype | None:
    """Floating inputs take the dtype of the model's first floating parameter (float32 if it has
    none)."""
    import torch

    for parameter in getattr(model, "parameters", lambda: [])():
        if parameter.is_floating_point():
            try:
                return np.dtype(torch.empty((), dtype=parameter.dtype).numpy().dtype)
            except (TypeError, RuntimeError):
                return None
    return None


def _to_numpy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, dict):
        return {key: _to_numpy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_numpy(item) for item in value]
    return value


def _container_output(prediction: Any, accept: str) -> bytes | str:
    """The toolkit's default_output_fn: a tensor as a list, encoded for the first supported Accept
    entry (CSV as UTF-8 bytes); the answer's type is the Accept itself, as the toolkit sets it."""
    import torch

    if type(prediction) is torch.Tensor:
        prediction = prediction.detach().cpu().numpy().tolist()
    for content_type in toolkit.parse_accept(accept):
        if content_type in toolkit.ENCODABLE:
            return toolkit.encode(prediction, content_type)
    raise toolkit.UnsupportedFormatError(accept)
