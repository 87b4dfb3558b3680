"""A TensorFlow container serving a SavedModel imports TensorFlow without Keras; Keras models still load.

TensorFlow's own `__init__` imports Keras 3 whole (and Keras imports scikit-learn): ~2 s of CPU in every
TensorFlow container process, for models that never call it (`serving.runtimes.tf_import`). Each check runs
in a fresh interpreter, since this test process has imported TensorFlow and Keras already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
runtime.load()
out, _ = runtime.invoke({body!r}.encode(), "application/json", "application/json", InvocationContext())
result = {{"answer": json.loads(out)}}
"""


def _probe(how: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(how=how)], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _serve(model: Path, request) -> str:
    return _SERVE.format(model=str(model), body=json.dumps(request))


@pytest.mark.parametrize("name", ["hetero-tf-features", "hetero-tf-wine.tar.gz"])
def test_a_savedmodel_is_served_without_keras(hetero_models: Path, hetero_expected: dict, answer_matches,
                                             name: str) -> None:
    from serving.models.artifacts import materialize

    expected = hetero_expected[name]
    got = _probe(_serve(materialize(str(hetero_models / name)), expected["request"]))
    answer = got["answer"]
    if not isinstance(expected["response"], dict):  # a bare list was TF Serving's "instances": it answers so
        answer = answer["predictions"]
    assert answer_matches(answer, expected["response"])
    assert not got["keras"] and not got["sklearn"]


def test_plain_tensorflow_still_imports_keras() -> None:
    """The reason for the workaround: when this fails, TensorFlow no longer loads Keras itself and it can go."""
    assert _probe("import tensorflow\nresult = {}")["keras"]


def test_a_keras_model_loads_and_keras_imports_whole_afterwards(hetero_models: Path, hetero_expected: dict,
                                                               answer_matches) -> None:
    expected = hetero_expected["hetero-tf-iris"]
    how = _serve(hetero_models / "hetero-tf-iris", expected["request"]) + (
        "import tensorflow as tf\n"
        "result['adam'] = type(tf.keras.optimizers.Adam()).__name__\n"
        "result['optimizers'] = type(sys.modules['keras.src.optimizers']).__name__\n"
    )
    got = _probe(how)
    assert answer_matches(got["answer"], expected["response"])
    assert got["keras"] and got["adam"] == "Adam" and got["optimizers"] == "module"
