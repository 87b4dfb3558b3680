"""Loading a `.skops` file imports skops without PyTorch, and skops trusts exactly the types it
would otherwise.

skops' first import lists scikit-learn's estimators by walking every sklearn subpackage; the walk
used to import `sklearn.externals.array_api_compat.torch`, and with it all of PyTorch, in every
scikit-learn container process. Each check runs in a fresh interpreter, since this test process may
have imported torch or skops already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# imports torch, TensorFlow, ONNX Runtime or XGBoost: not in `make test-unit`
pytestmark = pytest.mark.frameworks

pytest.importorskip("skops")
# the shim is only costly where torch is installed, as it is with the pytorch extra
pytest.importorskip("torch")

_PROBE = """
import json, sys
{how}
from skops.io._trusted_types import SKLEARN_ESTIMATOR_TYPE_NAMES
print(json.dumps({{"torch": "torch" in sys.modules, "names": sorted(SKLEARN_ESTIMATOR_TYPE_NAMES)}}))
"""
_OURS = "from serving.runtimes.skops_trust import import_skops; import_skops()"
_PLAIN = "import skops.io"


def _probe(how: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(how=how)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_skops_imports_without_torch_and_trusts_the_same_estimators() -> None:
    ours, plain = _probe(_OURS), _probe(_PLAIN)
    assert plain["torch"], (
        "a plain `import skops.io` no longer imports torch: this workaround can go"
    )
    assert not ours["torch"]
    assert len(ours["names"]) > 100
    assert ours["names"] == plain["names"]


def test_the_torch_shim_still_imports_afterwards() -> None:
    how = (
        _OURS + "\nimport sklearn.externals.array_api_compat.torch as shim; assert shim is not None"
    )
    assert _probe(how)["torch"]  # refused only while skops was first imported
