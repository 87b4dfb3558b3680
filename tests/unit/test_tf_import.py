"""A TensorFlow container serving a SavedModel imports TensorFlow without Keras; Keras models still
load.

TensorFlow's own `__init__` imports Keras 3 whole (and Keras imports scikit-learn): ~2 s of CPU in
every TensorFlow container process, for models that never call it (`serving.runtimes.tf_import`).
Each check runs in a fresh interpreter, since this test process has imported TensorFlow and Keras
already. A `.keras` model alone in its container process, with no script, loads Keras without the
scikit-learn its wrappers import.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# imports torch, TensorFlow, ONNX Runtime or XGBoost: not in `make test-unit`
pytestmark = pytest.mark.frameworks

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

_PROBE = """
import json, sys
{how}
print(json.dumps({{"keras": "keras" in sys.modules, "sklearn": "sklearn" in sys.modules, **result}}))
"""
_SERVE = """
from pathlib import Path
from serving.runtimes import InvocationContext, runtime_for
runtime = runtime_for("tensorflow", Path({model!r}), {{}})
runtime.only_model_in_process = {alone!r}
runtime.load()
out, _ = runtime.invoke({body!r}.encode(), "application/json", "application/json", InvocationContext())
result = {{"answer": json.loads(out)}}
"""


def _probe(how: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(how=how)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _serve(model: Path, request, alone: bool = False) -> str:
    return _SERVE.format(model=str(model), body=json.dumps(request), alone=alone)


@pytest.mark.parametrize("name", ["hetero-tf-features", "hetero-tf-wine.tar.gz"])
def test_a_savedmodel_is_served_without_keras(
    hetero_models: Path, hetero_expected: dict, answer_matches, name: str
) -> None:
    from serving.models.artifacts import materialize

    expected = hetero_expected[name]
    got = _probe(_serve(materialize(str(hetero_models / name)), expected["request"]))
    answer = got["answer"]
    # a bare list was TF Serving's "instances": it answers so
    if not isinstance(expected["response"], dict):
        answer = answer["predictions"]
    assert answer_matches(answer, expected["response"])
    assert not got["keras"] and not got["sklearn"]


def test_plain_tensorflow_still_imports_keras() -> None:
    """The reason for the workaround: when this fails, TensorFlow no longer loads Keras itself and
    it can go."""
    assert _probe("import tensorflow\nresult = {}")["keras"]


def test_a_keras_model_loads_and_keras_imports_whole_afterwards(
    hetero_models: Path, hetero_expected: dict, answer_matches
) -> None:
    expected = hetero_expected["hetero-tf-iris"]
    how = _serve(hetero_models / "hetero-tf-iris", expected["request"]) + (
        "import tensorflow as tf\n"
        "result['adam'] = type(tf.keras.optimizers.Adam()).__name__\n"
        "result['optimizers'] = type(sys.modules['keras.src.optimizers']).__name__\n"
    )
    got = _probe(how)
    assert answer_matches(got["answer"], expected["response"])
    assert got["keras"] and got["adam"] == "Adam" and got["optimizers"] == "module"


# Used after the model answered: Keras' wrappers behave as without scikit-learn, everyone else
# imports it as usual.
_AFTERWARDS = """
result["sklearn_with_model"] = "sklearn" in sys.modules
import keras
try:
    keras.wrappers.SKLearnClassifier(model=None)
    result["wrapper"] = "built"
except ImportError as error:
    result["wrapper"] = "ImportError"
from sklearn.linear_model import LogisticRegression
result["sklearn_after"] = LogisticRegression.__name__
"""


_PASS_THROUGH = """
def input_handler(data, context):
    return data.read().decode("utf-8")

def output_handler(response, context):
    return response.content, context.accept_header
"""


@pytest.mark.parametrize(
    ("alone", "script", "trimmed"),
    [(True, False, True), (False, False, False), (True, True, False)],
)
def test_a_lone_keras_model_without_a_script_loads_keras_without_sklearn(
    hetero_models: Path,
    hetero_expected: dict,
    answer_matches,
    tmp_path: Path,
    alone: bool,
    script: bool,
    trimmed: bool,
) -> None:
    """Alone in its process (a container process without MultiModel) and with no script, a `.keras`
    model loads Keras without scikit-learn; with a script, or beside other models (MultiModel),
    Keras' wrappers keep it."""
    expected = hetero_expected["hetero-tf-iris"]
    model = tmp_path / "model"
    shutil.copytree(hetero_models / "hetero-tf-iris", model)
    if script:
        (model / "code").mkdir()
        (model / "code" / "inference.py").write_text(_PASS_THROUGH)
    got = _probe(_serve(model, expected["request"], alone=alone) + _AFTERWARDS)
    assert answer_matches(got["answer"], expected["response"])
    assert got["keras"]
    assert got["sklearn_with_model"] is not trimmed
    assert got["wrapper"] == ("ImportError" if trimmed else "built")
    assert got["sklearn_after"] == "LogisticRegression"
