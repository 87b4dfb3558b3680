"""The lightgbm stack on real boosters trained here, over a container's app.

Boosters are trained with LightGBM on scikit-learn's bundled datasets (binary on breast cancer,
multiclass on iris, regression on diabetes) and saved as LightGBM's text model
(`Booster.save_model`). Every answer is compared with `Booster.predict` on the same rows, in this
process: bit-exact, since the stack calls that very function on the same values.
"""

from __future__ import annotations

import asyncio
import io
import json
import pickle
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris

from serving import protocol
from serving.errors import ValidationError
from serving.model_server.app import ContainerApp, build_container_app
from serving.runtimes import STACKS, InvocationContext, Runtime, runtime_for
from serving.runtimes.concurrency import BatchSettings

# imports a framework: not in `make test-unit`
pytestmark = pytest.mark.frameworks
lightgbm = pytest.importorskip("lightgbm")

JSON, CSV, NPY = protocol.JSON, protocol.CSV, protocol.NPY
DATA = {"binary": load_breast_cancer, "multi": load_iris, "regression": load_diabetes}
PARAMS = {
    "binary": {"objective": "binary"},
    "multi": {"objective": "multiclass", "num_class": 3},
    "regression": {"objective": "regression"},
}


def train_booster(task: str, rounds: int = 5) -> tuple[Any, np.ndarray]:
    """A small booster for `task` and the rows it was trained on."""
    x, y = DATA[task](return_X_y=True)
    params = {**PARAMS[task], "num_leaves": 7, "seed": 0, "num_threads": 1, "verbose": -1}
    return lightgbm.train(params, lightgbm.Dataset(x, label=y), num_boost_round=rounds), x


@pytest.fixture(scope="module")
def boosters(tmp_path_factory) -> dict[str, tuple[Any, np.ndarray, Path]]:
    root = tmp_path_factory.mktemp("lightgbm")
    out = {}
    for task in DATA:
        booster, x = train_booster(task)
        (root / task).mkdir()
        booster.save_model(str(root / task / "model.txt"))
        out[task] = (booster, x, root / task)
    return out


def loaded(folder: Path, **environment: str) -> Runtime:
    runtime = runtime_for("lightgbm", folder, environment)
    runtime.load()
    return runtime


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def csv_rows(x: np.ndarray) -> bytes:
    return "\n".join(",".join(repr(float(v)) for v in row) for row in x).encode()


async def post_all(
    app: ContainerApp, requests: list[tuple[bytes, str, str]]
) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://container") as client:
        return await asyncio.gather(
            *(
                client.post(
                    "/invocations", content=body, headers={"content-type": kind, "accept": accept}
                )
                for body, kind, accept in requests
            )
        )


def post(runtime: Runtime, body: bytes, kind: str, accept: str = JSON) -> httpx.Response:
    (response,) = asyncio.run(post_all(build_container_app(runtime, "lgb"), [(body, kind, accept)]))
    return response


def test_lightgbm_is_a_stack():
    assert "lightgbm" in STACKS


@pytest.mark.parametrize("task", list(DATA))
def test_json_csv_and_npy_answers_are_booster_predict(boosters, task):
    booster, x, folder = boosters[task]
    rows = x[:7]
    expected = booster.predict(rows)
    runtime = loaded(folder)
    for body, kind in (
        (json.dumps(rows.tolist()).encode(), JSON),
        (json.dumps({"instances": rows.tolist()}).encode(), JSON),
        (json.dumps({"inputs": rows.tolist()}).encode(), JSON),
        (csv_rows(rows), CSV),
        (npy(rows), NPY),
    ):
        response = post(runtime, body, kind)
        assert response.status_code == 200, response.text
        assert json.loads(response.content) == expected.tolist()
    response = post(runtime, npy(rows.astype(np.float32)), NPY, NPY)
    assert response.headers["content-type"] == NPY
    np.testing.assert_array_equal(
        np.load(io.BytesIO(response.content)), booster.predict(rows.astype(np.float32))
    )
    # one flat row is one instance
    response = post(runtime, json.dumps(rows[0].tolist()).encode(), JSON)
    assert json.loads(response.content) == booster.predict(rows[:1]).tolist()


def test_a_classifier_answers_probabilities_unless_raw(boosters):
    for task in ("binary", "multi"):
        booster, x, folder = boosters[task]
        body = json.dumps(x[:4].tolist()).encode()
        probabilities = json.loads(post(loaded(folder), body, JSON).content)
        assert probabilities == booster.predict(x[:4]).tolist()
        assert np.all((np.asarray(probabilities) >= 0) & (np.asarray(probabilities) <= 1))
        raw = json.loads(post(loaded(folder, SERVING_LIGHTGBM_OUTPUT="raw"), body, JSON).content)
        assert raw == booster.predict(x[:4], raw_score=True).tolist()
        assert raw != probabilities
    # the default, spelled out
    booster, x, folder = boosters["binary"]
    explicit = loaded(folder, SERVING_LIGHTGBM_OUTPUT="Probability")
    assert (
        json.loads(post(explicit, csv_rows(x[:2]), CSV).content) == booster.predict(x[:2]).tolist()
    )


def test_a_bad_output_setting_fails_the_load_naming_it(boosters):
    runtime = runtime_for("lightgbm", boosters["binary"][2], {"SERVING_LIGHTGBM_OUTPUT": "labels"})
    with pytest.raises(ValueError, match="SERVING_LIGHTGBM_OUTPUT must be one of probability, raw"):
        runtime.load()


def test_null_is_a_missing_value(boosters):
    booster, x, folder = boosters["multi"]
    row = [5.1, None, 1.4, 0.2]
    response = post(loaded(folder), json.dumps([row]).encode(), JSON)
    assert (
        json.loads(response.content)
        == booster.predict(np.array([[5.1, np.nan, 1.4, 0.2]])).tolist()
    )


@pytest.mark.parametrize(
    ("body", "kind", "words"),
    [
        (b"[[1, 2, 3]]", JSON, "rows have 3 features; the model takes 4"),
        (b'{"rows": [[1, 2, 3, 4]]}', JSON, '"instances" or "inputs"'),
        (b"[[1, 2, 3, 4], [1, 2]]", JSON, "not a rectangular array"),
        (b'[["a", "b", "c", "d"]]', JSON, "not a rectangular array"),
        (b"[]", JSON, "rows of features"),
    ],
)
def test_bad_rows_are_a_validation_error(boosters, body, kind, words):
    runtime = loaded(boosters["multi"][2])
    with pytest.raises(ValidationError, match=words):
        runtime.invoke(body, kind, JSON, InvocationContext())
    assert post(runtime, body, kind).status_code == 400


def test_a_pickled_model_needs_the_opt_in(boosters, tmp_path):
    booster, x, _ = boosters["binary"]
    y = load_breast_cancer().target
    classifier = lightgbm.LGBMClassifier(n_estimators=3, num_leaves=7, verbose=-1).fit(x, y)
    for name, model in (("model.pkl", booster), ("model.joblib", classifier)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).write_bytes(pickle.dumps(model))
        with pytest.raises(PermissionError, match="SERVING_ALLOW_PICKLE"):
            loaded(folder)
        runtime = loaded(folder, SERVING_ALLOW_PICKLE="true")
        reference = model if isinstance(model, lightgbm.Booster) else model.booster_
        answer = json.loads(post(runtime, json.dumps(x[:3].tolist()).encode(), JSON).content)
        assert answer == reference.predict(x[:3]).tolist()


def test_model_file_names(boosters, tmp_path):
    booster, x, folder = boosters["regression"]
    text = (folder / "model.txt").read_text()
    expected = booster.predict(x[:2]).tolist()
    body = json.dumps(x[:2].tolist()).encode()
    # any one *.txt / *.lgb that is a text model; other text files are not models
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "notes.txt").write_text("not a model\n")
    (tmp_path / "one" / "diabetes.lgb").write_text(text)
    assert json.loads(post(loaded(tmp_path / "one"), body, JSON).content) == expected
    # two are ambiguous: the error names both
    (tmp_path / "one" / "other.txt").write_text(text)
    with pytest.raises(FileNotFoundError, match="diabetes.lgb, other.txt"):
        loaded(tmp_path / "one")
    # model.txt wins over the others
    (tmp_path / "one" / "model.txt").write_text(text)
    assert json.loads(post(loaded(tmp_path / "one"), body, JSON).content) == expected
    (tmp_path / "none").mkdir()
    with pytest.raises(FileNotFoundError, match="no model.txt"):
        loaded(tmp_path / "none")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.txt").write_text("tree\nnot really\n")
    with pytest.raises(ValueError, match="not a LightGBM text model"):
        loaded(tmp_path / "bad")


def counting(runtime: Runtime) -> list[int]:
    """Record the rows of every predict call of `runtime`."""
    sizes: list[int] = []
    predict = runtime.predict

    def recorded(data: Any, context: InvocationContext) -> Any:
        sizes.append(len(data))
        return predict(data, context)

    runtime.predict = recorded  # type: ignore[method-assign]
    return sizes


@pytest.mark.parametrize("task", ["binary", "multi"])
def test_batching_merges_rows_and_each_caller_gets_its_own(boosters, task):
    booster, x, folder = boosters[task]
    runtime = loaded(folder)
    assert runtime.accepts_batches()
    sizes = counting(runtime)
    # cut on size (10 rows), not on the delay: arrivals may be far apart on a loaded machine
    app = build_container_app(runtime, "lgb", batching=BatchSettings(10, max_delay_s=30.0))
    parts = [x[i : i + n] for i, n in ((0, 1), (50, 3), (100, 2), (10, 4))]
    # one content type: requests merge only with their kind (`batching.batch_key`)
    requests = [(json.dumps(p.tolist()).encode(), JSON, JSON) for p in parts]
    responses = asyncio.run(post_all(app, requests))
    assert [r.status_code for r in responses] == [200] * 4
    for response, sent in zip(responses, parts):
        assert json.loads(response.content) == booster.predict(sent).tolist()
    assert sizes == [10]


def test_model_threads_answer_concurrent_requests_alike(boosters):
    booster, x, folder = boosters["multi"]
    runtime = loaded(folder, SERVING_CPUS="2")
    assert runtime.prediction_threads() == 2  # LightGBM predicts without the GIL
    app = build_container_app(runtime, "lgb", threads=2)
    parts = [x[i : i + 5] for i in range(0, 150, 5)]
    responses = asyncio.run(post_all(app, [(npy(p), NPY, JSON) for p in parts]))
    for response, sent in zip(responses, parts):
        assert json.loads(response.content) == booster.predict(sent).tolist()


def test_open_inference_metadata(boosters):
    for task, outputs in (("binary", [-1]), ("multi", [-1, 3]), ("regression", [-1])):
        booster, _, folder = boosters[task]
        response = asyncio.run(_signature(build_container_app(loaded(folder), "lgb")))
        assert response == {
            "platform": "lightgbm",
            "inputs": [
                {"name": "input-0", "datatype": "FP64", "shape": [-1, booster.num_feature()]}
            ],
            "outputs": [{"name": "output-0", "datatype": "FP64", "shape": outputs}],
            "content_type": NPY,
            "accept": f"{NPY}, {JSON}",
        }


async def _signature(app: ContainerApp) -> Any:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://container") as client:
        response = await client.get(protocol.SIGNATURE_PATH)
        assert response.status_code == 200
        return response.json()


SCRIPT = """
import numpy as np

def output_fn(prediction, accept):
    return {"top": np.argmax(prediction, axis=1).tolist()}
"""


def test_a_script_overrides_a_step_and_the_stack_keeps_the_rest(boosters, tmp_path):
    booster, x, folder = boosters["multi"]
    (tmp_path / "model.txt").write_text((folder / "model.txt").read_text())
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(SCRIPT)
    runtime = loaded(tmp_path)
    assert not runtime.accepts_batches()  # its output_fn did not say it takes batches
    body, _ = runtime.invoke(csv_rows(x[:3]), CSV, JSON, InvocationContext())
    assert json.loads(body) == {"top": np.argmax(booster.predict(x[:3]), axis=1).tolist()}
