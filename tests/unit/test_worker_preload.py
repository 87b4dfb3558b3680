"""serving._worker_preload: Serve's utilities load without pandas in a Ray worker, and Ray without
pyarrow until something else imports it; everyone else still gets both.

Each case runs in a fresh interpreter, as a Ray worker runs the module first
(RAY_preload_python_modules).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "preload":
    import serving._worker_preload
import ray.serve._private.utils as serve_utils
serve_had_pandas = serve_utils.pd is not None
loaded_with_serve = "pandas" in sys.modules
finders = [type(finder).__name__ for finder in sys.meta_path]
import pandas
frame = pandas.DataFrame({"a": [1, 2]})
print(serve_had_pandas, loaded_with_serve, "ServeWithoutPandas" in finders, int(frame["a"].sum()))
"""


def _probe(mode: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-I", "-c", _PROBE, str(ROOT), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_serve_loads_without_pandas_and_pandas_still_loads_for_others() -> None:
    # the finder stepped aside after Serve's import
    assert _probe("preload") == ["False", "False", "False", "3"]


def test_without_the_preload_serve_loads_pandas() -> None:
    # The control: what the preload changes (if Ray stops importing pandas there, the module can
    # go).
    assert _probe("plain") == ["True", "True", "False", "3"]


def test_install_leaves_a_process_that_already_has_pandas_alone() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import pandas; import serving._worker_preload; "
        "import ray.serve._private.utils as u; print(u.pd is pandas, len([f for f in sys.meta_path "
        "if type(f).__name__ == 'ServeWithoutPandas']))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "0"]


_ARROW_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "preload":
    import serving._worker_preload
from ray import cloudpickle
from ray._private.worker import global_worker
global_worker.get_serialization_context()  # what a worker's first deserialization makes
loaded_with_ray = "pyarrow" in sys.modules
import pyarrow as pa
registered = pa.Table in cloudpickle.CloudPickler.dispatch and pa.Schema in cloudpickle.CloudPickler.dispatch
table = cloudpickle.loads(cloudpickle.dumps(pa.table({"a": [1, 2]}).slice(1)))
finders = [type(finder).__name__ for finder in sys.meta_path]
print(loaded_with_ray, registered, "ArrowOnFirstUse" in finders, table.column("a").to_pylist())
"""


def _arrow_probe(mode: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-I", "-c", _ARROW_PROBE, str(ROOT), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_ray_serializes_without_pyarrow_until_something_imports_it() -> None:
    # Ray's Arrow serializers are registered the moment pyarrow is imported, and the finder steps
    # aside; a table sliced then sent carries only its slice (what Ray's reducer is for)
    assert _arrow_probe("preload") == ["False", "True", "False", "[2]"]


def test_without_the_preload_ray_imports_pyarrow_at_once() -> None:
    # The control: if Ray stops importing pyarrow there, the finder can go.
    assert _arrow_probe("plain") == ["True", "True", "False", "[2]"]
