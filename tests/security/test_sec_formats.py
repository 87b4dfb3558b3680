"""Artifacts in "safe" formats that would run code: crafted skops files and torch.export archives.

Every hostile artifact here is a real file of its format, edited the way an attacker would edit it,
and each gadget leaves a marker file if it ever runs.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import skops.io
from sklearn.datasets import load_iris, load_wine
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler
from sklearn.tree import DecisionTreeClassifier
from sklearn.utils.validation import column_or_1d

from serving.runtimes import InvocationContext, runtime_for

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.3, 3.3, 6.0, 2.5]]


def invoke(runtime, body) -> object:
    out, _ = runtime.invoke(
        json.dumps(body).encode(), "application/json", None, InvocationContext()
    )
    return json.loads(out)


# --- skops --------------------------------------------------------------------------------------


def rewrite_zip(path: Path, edit) -> None:
    """Rewrite every member of a zip archive through `edit(name, data) -> data`."""
    with zipfile.ZipFile(path) as source:
        members = [(info.filename, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w") as out:
        for name, data in members:
            out.writestr(name, edit(name, data))


def gadget_skops(folder: Path, gadget: str) -> Path:
    """A model.skops: a pipeline flattening the request rows, then calling `gadget` on them
    (FunctionTransformer).

    Saved with a harmless function in the gadget's place, then the file's schema is edited to name
    the gadget: skops stores a function as its module and name only.
    """
    shell = {"shell": True} if gadget.endswith("check_output") else None
    pipeline = make_pipeline(
        FunctionTransformer(column_or_1d),
        FunctionTransformer(subprocess.check_output, kw_args=shell),
    )
    folder.mkdir(parents=True, exist_ok=True)
    skops.io.dump(pipeline, folder / "model.skops")
    module, _, name = gadget.rpartition(".")

    def aim(node: object) -> int:
        if isinstance(node, list):
            return sum(aim(item) for item in node)
        if not isinstance(node, dict):
            return 0
        if node.get("__loader__") == "FunctionNode" and node.get("__module__") == "subprocess":
            node.update({"__module__": module, "__class__": name})
            return 1
        return sum(aim(value) for value in node.values())

    def edit(member: str, data: bytes) -> bytes:
        if member != "schema.json":
            return data
        schema = json.loads(data)
        assert aim(schema) == 1
        return json.dumps(schema).encode()

    rewrite_zip(folder / "model.skops", edit)
    return folder


GADGETS = [
    "sklearn.utils._testing.check_output",
    "subprocess.check_output",
    "os.system",
    "builtins.eval",
]


@pytest.mark.parametrize("gadget", GADGETS)
@pytest.mark.parametrize(
    "environment",
    [{}, {"SERVING_SKOPS_TRUSTED_TYPES": "sklearn., sklearn.utils, sklearn.*"}],
    ids=["defaults", "prefixes listed"],
)
def test_skops_function_gadget_is_refused_at_load_and_never_runs(
    tmp_path: Path, gadget: str, environment: dict
) -> None:
    marker = tmp_path / "gadget-ran"
    runtime = runtime_for("sklearn", gadget_skops(tmp_path / "model", gadget), environment)
    refusal = None
    try:
        runtime.load()
        invoke(runtime, [[f"touch {marker}"]])  # reached only if the load was wrongly allowed
    except PermissionError as error:
        refusal = error
    except Exception:  # what a gadget returns need not encode; the marker says whether it ran
        pass
    assert not marker.exists(), f"{gadget} ran the request's command"
    assert refusal is not None, "the load was allowed"
    message = str(refusal)
    assert gadget in message and "SERVING_SKOPS_TRUSTED_TYPES" in message
    # no function is trusted by default, sklearn's neither
    assert "sklearn.utils.validation.column_or_1d" in message
    assert not marker.exists()


def test_an_operator_may_trust_an_exact_function(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    model = make_pipeline(
        FunctionTransformer(np.log1p), StandardScaler(), LogisticRegression(max_iter=1000)
    )
    iris = load_iris()
    skops.io.dump(model.fit(iris.data, iris.target), folder / "model.skops")
    assert (
        invoke(runtime_loaded("sklearn", folder, {}), ROWS) == model.predict(ROWS).tolist()
    )  # a ufunc: skops trusts it

    skops.io.dump(make_pipeline(FunctionTransformer(column_or_1d)), folder / "model.skops")
    with pytest.raises(PermissionError, match="column_or_1d"):
        runtime_loaded("sklearn", folder, {})
    runtime = runtime_loaded(
        "sklearn", folder, {"SERVING_SKOPS_TRUSTED_TYPES": "sklearn.utils.validation.column_or_1d"}
    )
    assert invoke(runtime, [[1.0], [2.0]]) == [1.0, 2.0]


def runtime_loaded(image: str, folder: Path, environment: dict):
    runtime = runtime_for(image, folder, environment)
    runtime.load()
    return runtime


def _fitted():
    iris, wine = load_iris(), load_wine()
    return {
        "random forest": RandomForestClassifier(n_estimators=5, random_state=0).fit(
            wine.data, wine.target
        ),
        "gradient boosting": GradientBoostingClassifier(n_estimators=5, random_state=0).fit(
            iris.data, iris.target
        ),
        "decision tree": DecisionTreeClassifier(max_leaf_nodes=6, random_state=0).fit(
            iris.data, iris.target
        ),
        "pipeline": make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(
            iris.data, iris.target
        ),
    }


@pytest.mark.parametrize("name", list(_fitted()))
def test_plain_scikit_learn_models_load_without_any_trust_listed(tmp_path: Path, name: str) -> None:
    model = _fitted()[name]
    skops.io.dump(model, tmp_path / "model.skops")
    rows = load_wine().data[:3] if name == "random forest" else np.array(ROWS)
    assert (
        invoke(runtime_loaded("sklearn", tmp_path, {}), rows.tolist())
        == model.predict(rows).tolist()
    )


def test_the_demo_models_load_without_any_trust_listed(demo_models: Path) -> None:
    for folder in ("iris-classifier", "wine-classifier", "iris-preprocess", "iris-on-features"):
        runtime_loaded("sklearn", demo_models / folder, {})


def _edit_tree_nodes(path: Path, change) -> None:
    """Apply `change(nodes)` to every decision-tree node array stored in a .skops file."""

    def edit(member: str, data: bytes) -> bytes:
        if not member.endswith(".npy"):
            return data
        array = np.load(io.BytesIO(data), allow_pickle=False)
        if array.dtype.names is None or "left_child" not in array.dtype.names:
            return data
        change(array)
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return buffer.getvalue()

    rewrite_zip(path, edit)


@pytest.mark.parametrize(
    ("field", "value"),
    [("left_child", 10**6), ("right_child", 0), ("feature", 10**6), ("feature", -5)],
)
def test_a_tree_with_out_of_range_nodes_is_refused_before_it_predicts(
    tmp_path: Path, field: str, value: int
) -> None:
    # scikit-learn follows these indices in C without bounds checks: predicting would read out of
    # bounds.
    iris = load_iris()
    skops.io.dump(
        DecisionTreeClassifier(random_state=0).fit(iris.data, iris.target), tmp_path / "model.skops"
    )

    def corrupt(nodes: np.ndarray) -> None:
        nodes[field][0] = value  # the root is a split node

    _edit_tree_nodes(tmp_path / "model.skops", corrupt)
    with pytest.raises(ValueError, match="node indices are out of range"):
        runtime_loaded("sklearn", tmp_path, {})


def test_a_tree_wider_than_its_estimator_is_refused(tmp_path: Path) -> None:
    iris = load_iris()
    model = DecisionTreeClassifier(random_state=0).fit(iris.data, iris.target)
    skops.io.dump(model, tmp_path / "model.skops")

    # the estimator checks requests for 1 feature; its tree reads 4
    def narrow(member: str, data: bytes) -> bytes:
        if member != "schema.json":
            return data
        schema = json.loads(data)
        attributes = schema["content"]["content"]
        assert attributes["n_features_in_"]["content"] == "4"
        # skops stores equal ints once and refers to them by __id__: a fresh id detaches the tree's
        # own count.
        attributes["n_features_in_"].update(content="1", __id__=1)
        return json.dumps(schema).encode()

    rewrite_zip(tmp_path / "model.skops", narrow)
    with pytest.raises(ValueError, match="feature count does not match"):
        runtime_loaded("sklearn", tmp_path, {})


# --- torch.export (.pt2) --------------------------------------------------------------------------


class _WritesMarker:
    """Unpickling this writes the marker: what any pickle may do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.write_text, (self.marker, "pickle ran")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """A legit torch.export program (Linear + softmax, dynamic batch) in model.pt2, and the module
    it came from."""
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softmax(dim=-1)).eval()
    program = torch.export.export(
        module, (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    folder = tmp_path_factory.mktemp("export")
    torch.export.save(program, str(folder / "model.pt2"))
    return folder, module


def hostile_pt2(exported_folder: Path, target: Path, marker: Path, how: str) -> Path:
    """A copy of the legit archive with one member replaced by a gadget."""
    import torch

    target.mkdir()
    archive = target / "model.pt2"
    archive.write_bytes((exported_folder / "model.pt2").read_bytes())

    def edit(member: str, data: bytes) -> bytes:
        if how == "pickle" and member.endswith("/sample_inputs/model.pt"):
            buffer = io.BytesIO()
            # torch tries weights_only, then falls back to full unpickling
            torch.save(_WritesMarker(marker), buffer)
            return buffer.getvalue()
        if how == "shape expression" and member.endswith("/models/model.json"):
            # torch.export.load hands every symbolic size to sympy.sympify, which evaluates Python.
            code = f"__import__('pathlib').Path({str(marker)!r}).write_text('sympify ran')"
            doc, count = re.subn(
                r'"expr_str": "(?:[^"\\]|\\.)*"',
                lambda _: json.dumps({"expr_str": code})[1:-1],
                data.decode(),
            )
            assert count
            return doc.encode()
        return data

    rewrite_zip(archive, edit)
    return target


@pytest.mark.parametrize("how", ["pickle", "shape expression"])
def test_hostile_pt2_is_refused_without_the_opt_in_and_never_runs(
    exported, tmp_path: Path, how: str
) -> None:
    marker = tmp_path / "gadget-ran"
    folder = hostile_pt2(exported[0], tmp_path / "model", marker, how)
    refusal = None
    try:
        runtime_for("pytorch", folder, {}).load()
    except PermissionError as error:
        refusal = error
    except Exception:  # a gadget may break the rest of the load; the marker says whether it ran
        pass
    assert not marker.exists(), f"the archive's {how} ran"
    assert refusal is not None and "SERVING_ALLOW_PICKLE" in str(refusal)


def test_pt2_needs_the_opt_in_and_then_answers(exported) -> None:
    import torch

    folder, module = exported
    with pytest.raises(PermissionError, match="refusing to load model.pt2.*SERVING_ALLOW_PICKLE"):
        runtime_for("pytorch", folder, {}).load()
    runtime = runtime_loaded("pytorch", folder, {"SERVING_ALLOW_PICKLE": "true"})
    with torch.no_grad():
        expected = module(torch.tensor(ROWS, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(np.asarray(invoke(runtime, ROWS)), expected, rtol=1e-5, atol=1e-6)
