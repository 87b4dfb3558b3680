"""`serving train`, for real: example recipes trained on Ray Train (own embedded Ray, in a
subprocess, as a user runs it), their artifacts served by an endpoint server, a killed run resumed
to the same weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from suite.endpoint_server import EndpointServer

from serving.config.spec import parse_spec
from serving.settings import ServerSettings

# Each test may pay for trainings of a minute each (the module's store: six), on 2 CPUs. Slow: `make
# test-slow` runs it; `make test` covers a 2-worker training through the README demo. func_only: the
# store's trainings (bounded by TRAIN_TIMEOUT_S each) and the endpoint server's start (bounded by
# READY_TIMEOUT_S) are set-up, not the test's own 900 s.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900, func_only=True)]

ENDPOINTS: dict = {}  # this module deploys nothing on the session server

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "recipes"
TINY = {"Cpus": 0.01}
TRAIN_TIMEOUT_S = 360


def _train(recipe: str, store: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "serving.cli",
            "train",
            str(RECIPES / recipe),
            "--store",
            str(store),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=TRAIN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _record(store: Path, name: str) -> dict:
    return json.loads((store / name / "latest" / "model.json").read_text())


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> Path:
    """Every example recipe but the TensorFlow one's twin, trained once for the module (about a
    minute each)."""
    root = tmp_path_factory.mktemp("model-store")
    for recipe in (
        "digits-cnn.yaml",
        "tabular-mlp.yaml",
        "customers-multimodel.yaml",
        "iris-sklearn.yaml",
        "wine-tensorflow.yaml",
        "cancer-xgboost.yaml",
        "cancer-lightgbm.yaml",
    ):
        _train(recipe, root)
    return root


@pytest.mark.own_ray
def test_two_workers_train_the_digits_cnn_and_the_tabular_mlp_to_their_accuracies(
    store: Path,
) -> None:
    digits, mlp = _record(store, "digits-cnn"), _record(store, "cancer-mlp")
    assert digits["workers"] == mlp["workers"] == 2
    assert digits["metrics"]["val_accuracy"] >= 0.93  # 360 held-out digits; ~0.96 measured
    assert mlp["metrics"]["val_accuracy"] >= 0.93  # 114 held-out tumours; ~0.98 measured
    assert digits["signature"]["inputs"][0]["shape"] == [-1, 64]
    assert digits["signature"]["classes"] == list(range(10))
    assert (
        digits["data"]["fingerprint"].startswith("sha256:")
        and digits["recipe"]["framework"] == "pytorch"
    )
    assert (
        digits["timing"]["per_step"]["compute_ms"] > 0
        and digits["timing"]["per_step"]["allreduce_busy_ms"] > 0
    )
    assert os.readlink(store / "digits-cnn" / "latest") == str(digits["version"])


def _in_memory_digits(store: Path) -> tuple[np.ndarray, np.ndarray]:
    """The trained weights (the run's final state) in the recipe's model, and what it answers on 40
    digits."""
    import torch

    from serving.training.data import sklearn_frame
    from serving.training.torch_models import build_model

    record = _record(store, "digits-cnn")
    state = torch.load(
        store / "digits-cnn" / "latest" / "checkpoint" / "state.pt", weights_only=True
    )
    stats = {
        "mean": [0.0] * 64,
        "std": [1.0] * 64,
        "image_shape": record["recipe"]["data"]["image_shape"],
    }
    model = build_model("cnn", record["recipe"]["model"]["hyperparameters"], 64, 10, stats)
    model.load_state_dict(state["model"])
    model.eval()
    rows = sklearn_frame("digits").drop(columns="target").to_numpy(dtype=np.float32)[:40]
    with torch.no_grad():
        return rows, model(torch.from_numpy(rows)).numpy()


@pytest.fixture
def endpoint_server(server) -> Iterator[EndpointServer]:
    """Where the trained artifacts are served: the session's endpoint server, which deploys nothing
    for this module (ENDPOINTS is empty): the test deploys it-trained itself."""
    yield server


def test_the_served_artifacts_answer_what_the_trained_model_predicts(
    endpoint_server: EndpointServer, store: Path
) -> None:
    from serving import ray_wing

    server = endpoint_server

    latest = store / "digits-cnn" / "latest"
    spec = parse_spec(
        {
            "EndpointName": "it-trained",
            "Containers": [
                {
                    "ContainerHostname": "torchscript",
                    "Image": "pytorch",
                    "ModelDataUrl": str(latest),
                    "Resources": TINY,
                },
                {
                    "ContainerHostname": "onnx",
                    "Image": "onnx",
                    "ModelDataUrl": str(latest),
                    "Resources": TINY,
                },
                {
                    "ContainerHostname": "customers",
                    "Image": "sklearn",
                    "Mode": "MultiModel",
                    "ModelDataUrl": str(store / "customers" / "latest") + "/",
                    "Resources": TINY,
                },
            ],
        }
    )
    settings = ServerSettings(
        port=int(server.url.rsplit(":", 1)[1]), max_payload_mb=1.0, invocation_timeout_s=3.0
    )
    ray_wing.deploy_endpoint(spec, settings)
    deadline = time.monotonic() + 300
    while server.client.describe_endpoint("it-trained").get("EndpointStatus") != "InService":
        assert server.client.describe_endpoint("it-trained").get("EndpointStatus") != "Failed", (
            server.client.describe_endpoint("it-trained")
        )
        assert time.monotonic() < deadline, server.client.describe_endpoint("it-trained")
        time.sleep(1)

    rows, expected = _in_memory_digits(store)
    for target in ("torchscript", "onnx"):
        answer = server.client.invoke("it-trained", rows.tolist(), target=target)
        assert answer.status_code == 200
        served = np.asarray(answer.body, dtype=np.float32)
        # Same weights, other kernels and thread counts (the replica runs on its CPU share, ONNX
        # Runtime on its own): sums in another order, so equal to float32 rounding, and the same
        # digit for every row.
        np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-4)
        assert (served.argmax(axis=1) == expected.argmax(axis=1)).all()

    # The MultiModel prefix one recipe filled: each customer's model answers from its own archive.
    customers = _record(store, "customers")
    assert customers["groups"] == [f"customer-{i}" for i in range(5)]
    for group in customers["groups"]:
        answer = server.client.invoke(
            "it-trained",
            [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]],
            target="customers",
            model=f"{group}.tar.gz",
        )
        assert answer.status_code == 200
        assert answer.body[0] == "setosa"

    ray_wing.delete_endpoint("it-trained")


def test_the_sklearn_tensorflow_xgboost_and_lightgbm_artifacts_load_in_their_stacks(
    store: Path,
) -> None:
    # Loaded from STORE/NAME/latest by each stack's runtime as a container process loads it
    # (materialize, then load), here in the test process: beside a session server of ~60 replicas
    # (as the suite once had), three more framework replicas took the node past Ray's memory
    # threshold (its OOM killer then took the Serve controller). They answer as the model read back
    # from the archive does (scikit-learn: the same labels; XGBoost: the same probabilities) or, for
    # the TensorFlow MLP, classify the wine rows as well as model.json says it did.
    _check_sklearn(store)
    _check_tensorflow(store)
    _check_xgboost(store)
    _check_lightgbm(store)


def _invoke(
    stack: str,
    model_data: Path,
    body,
    content_type: str = "application/json",
    accept: str | None = None,
):
    from serving.models.artifacts import materialize
    from serving.runtimes import InvocationContext, runtime_for

    runtime = runtime_for(stack, materialize(str(model_data)), {})
    runtime.load()
    data = body if isinstance(body, str) else json.dumps(body)
    answer, _ = runtime.invoke(
        data.encode(), content_type, accept or content_type, InvocationContext()
    )
    return answer.decode()


def _unpacked(store: Path, name: str, tmp: Path) -> Path:
    import tarfile

    folder = tmp / name
    with tarfile.open(store / name / "latest" / "model.tar.gz") as archive:
        archive.extractall(folder, filter="data")
    return folder


def _check_sklearn(store: Path) -> None:
    import tempfile

    import skops.io

    from serving.training.data import sklearn_frame

    rows = sklearn_frame("iris").drop(columns="target").to_numpy()[::7]
    with tempfile.TemporaryDirectory() as tmp:
        path = _unpacked(store, "iris-sklearn", Path(tmp)) / "model.skops"
        model = skops.io.load(path, trusted=skops.io.get_untrusted_types(file=path))
        expected = model.predict(rows).tolist()
    assert (
        json.loads(_invoke("sklearn", store / "iris-sklearn" / "latest", rows.tolist())) == expected
    )


def _check_tensorflow(store: Path) -> None:
    from serving.training.data import sklearn_frame

    frame = sklearn_frame("wine")
    rows, labels = (
        frame.drop(columns="target").to_numpy(dtype=np.float32),
        frame["target"].to_numpy(),
    )
    answer = _invoke("tensorflow", store / "wine-tf" / "latest", {"instances": rows.tolist()})
    scores = np.asarray(json.loads(answer)["predictions"])
    assert scores.shape == (len(rows), 3)
    assert (scores.argmax(axis=1) == labels).mean() >= 0.9, (
        "the served SavedModel does not classify wine"
    )
    assert _record(store, "wine-tf")["metrics"]["val_accuracy"] >= 0.9


def _check_xgboost(store: Path) -> None:
    import tempfile

    import xgboost

    from serving.training.data import sklearn_frame

    rows = sklearn_frame("breast_cancer").drop(columns="target").to_numpy(dtype=np.float32)[:20]
    with tempfile.TemporaryDirectory() as tmp:
        booster = xgboost.Booster()
        booster.load_model(str(_unpacked(store, "cancer-xgboost", Path(tmp)) / "xgboost-model"))
        expected = booster.predict(xgboost.DMatrix(rows, feature_names=booster.feature_names))
    body = "\n".join(",".join(repr(float(v)) for v in row) for row in rows)
    answer = _invoke("xgboost", store / "cancer-xgboost" / "latest", body, content_type="text/csv")
    served = np.asarray([float(line) for line in answer.split()], dtype=np.float32)
    np.testing.assert_allclose(served, expected, rtol=1e-6)
    assert _record(store, "cancer-xgboost")["metrics"]["val_accuracy"] >= 0.93


def _check_lightgbm(store: Path) -> None:
    import tempfile

    import lightgbm

    from serving.training.data import sklearn_frame

    # trained by two workers' data-parallel learner; served as `Booster.predict` answers
    rows = sklearn_frame("breast_cancer").drop(columns="target").to_numpy()[:20]
    with tempfile.TemporaryDirectory() as tmp:
        folder = _unpacked(store, "cancer-lightgbm", Path(tmp))
        expected = lightgbm.Booster(model_file=str(folder / "model.txt")).predict(rows)
    answer = _invoke("lightgbm", store / "cancer-lightgbm" / "latest", rows.tolist())
    assert json.loads(answer) == expected.tolist()
    assert _record(store, "cancer-lightgbm")["metrics"]["val_accuracy"] >= 0.93


@pytest.mark.own_ray
def test_a_killed_run_resumes_from_its_checkpoint_to_the_weights_of_an_uninterrupted_run(
    store, tmp_path
) -> None:
    import torch

    interrupted = tmp_path / "interrupted"
    command = [
        sys.executable,
        "-m",
        "serving.cli",
        "train",
        str(RECIPES / "tabular-mlp.yaml"),
        "--store",
        str(interrupted),
    ]
    log = tmp_path / "interrupted.log"
    with log.open("w") as output:
        run = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 420
        while not _checkpointed(interrupted):
            assert run.poll() is None, (
                "the run ended before its first checkpoint:\n" + log.read_text()[-3000:]
            )
            assert time.monotonic() < deadline, (
                "no checkpoint within 420 s:\n" + log.read_text()[-3000:]
            )
            time.sleep(0.2)
    finally:
        # the run and the Ray it started: its own session, started here
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    assert (
        not (interrupted / "cancer-mlp" / "1").exists()
        and (interrupted / "cancer-mlp" / ".1.partial").is_dir()
    )

    resumed = _train("tabular-mlp.yaml", interrupted, "--resume")
    step = int((resumed.stdout + resumed.stderr).split("resumed from step ")[1].split()[0])
    assert 0 < step < 60 * 15, step  # from a mid-run checkpoint, not the end
    final = torch.load(
        interrupted / "cancer-mlp" / "latest" / "checkpoint" / "state.pt", weights_only=True
    )
    reference = torch.load(
        store / "cancer-mlp" / "latest" / "checkpoint" / "state.pt", weights_only=True
    )
    assert final["step"] == reference["step"] == 60 * 15
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name


def _checkpointed(store: Path) -> bool:
    """Ray Train has registered a checkpoint of the run (its snapshot is written after the folder is
    complete)."""
    return bool(list((store / ".ray-train").glob("*/checkpoint_manager_snapshot.json")))


def _workers_of(session_id: int) -> list[int]:
    """PIDs of the Ray Train workers that a run we started (session `session_id`) runs."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getsid(process.pid) == session_id and "RayTrainWorker" in " ".join(
                process.info["cmdline"] or []
            ):
                found.append(process.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return sorted(found)


@pytest.mark.own_ray
def test_a_worker_killed_mid_run_is_replaced_and_the_run_finishes(tmp_path) -> None:
    # training.max_failures: 1 lets Ray Train start a new worker group, which resumes from the last
    # checkpoint. Forty epochs of the digits CNN (~900 steps, a checkpoint every 20) leave time to
    # kill a worker mid-run.
    import yaml

    recipe = yaml.safe_load((RECIPES / "digits-cnn.yaml").read_text())
    recipe["training"].update(epochs=40, max_failures=1)
    path = tmp_path / "digits-long.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "store"
    log = tmp_path / "worker-killed.log"
    with log.open("w") as output:
        run = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "train", str(path), "--store", str(out)],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 420
        while not _checkpointed(out):
            assert run.poll() is None, (
                "the run ended before its first checkpoint:\n" + log.read_text()[-3000:]
            )
            assert time.monotonic() < deadline, (
                "no checkpoint within 420 s:\n" + log.read_text()[-3000:]
            )
            time.sleep(0.2)
        workers = _workers_of(run.pid)
        assert len(workers) == 2, workers
        os.kill(workers[1], signal.SIGKILL)  # rank 0 or 1: either takes the worker group down
        assert run.wait(timeout=TRAIN_TIMEOUT_S) == 0, log.read_text()[-3000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=30)
    text = log.read_text()
    assert "resumed from step" in text, text[-3000:]
    record = _record(out, "digits-cnn")
    assert record["metrics"]["step"] == 40 * 23 and record["metrics"]["val_accuracy"] >= 0.93
