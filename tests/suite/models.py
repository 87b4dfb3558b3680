"""The models the tests serve, for every tier: the demos trained from scikit-learn's bundled
datasets and a MultiModel prefix of them. Each is made once per session, when a test first asks for
it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory) -> Path:
    """The README demo's models, trained once per test session into a temp folder."""
    out = tmp_path_factory.mktemp("demo-models")
    _example("train_demo").train(out)
    return out


@pytest.fixture(scope="session")
def hetero_models(tmp_path_factory) -> Path:
    """The heterogeneous demo's models (sklearn, PyTorch, TensorFlow, ONNX, Python), trained once
    per session.

    `expected.json` in the folder holds each model's sample request and the answer it must give.
    """
    out = tmp_path_factory.mktemp("hetero-models")
    _example("train_hetero").train(out)
    return out


@pytest.fixture(scope="session")
def hetero_expected(hetero_models) -> dict:
    """Per model folder of `hetero_models`: {"request", "response", "classes"} (see
    examples/train_hetero.py)."""
    return json.loads((hetero_models / "expected.json").read_text())


# it-multi's models: a MultiModel prefix of twelve archives (its `local` container caches 3 of
# them).
MULTI_MODELS = 12


@pytest.fixture(scope="session")
def multi_model_prefix(demo_models, tmp_path_factory) -> Path:
    """A MultiModel prefix: iris-0.tar.gz ... (the demo's iris classifier, as SageMaker archives)
    and echo-model/ (a Python model that answers with its own name)."""
    import tarfile

    root = tmp_path_factory.mktemp("multi-model-prefix")
    for index in range(MULTI_MODELS):
        with tarfile.open(root / f"iris-{index}.tar.gz", "w:gz") as archive:
            archive.add(demo_models / "iris-classifier", arcname=".")
    echo = root / "echo-model" / "code"
    echo.mkdir(parents=True)
    (echo / "inference.py").write_text(
        "def model_fn(model_dir):\n    return 'echo-model'\n\n"
        "def predict_fn(data, model):\n    return {'model': model, 'input': data}\n"
    )
    return root


@pytest.fixture(scope="session")
def transformers_models(tmp_path_factory) -> dict[str, Path]:
    """A tiny causal LM (`tiny-lm`) and text classifier (`tiny-classifier`), made once per session
    from a tokenizer trained on local text (`examples/train_transformers.py`)."""
    return _example("train_transformers").train(tmp_path_factory.mktemp("transformers-models"))


@pytest.fixture(scope="session")
def side_by_side_models(tmp_path_factory) -> dict[str, Path]:
    """`examples/side-by-side.yaml`'s models (MLflow, LightGBM, transformers, skops), each saved by
    its own tool, made once per session (`examples/train_side_by_side.py`)."""
    return _example("train_side_by_side").train(tmp_path_factory.mktemp("side-by-side"))
