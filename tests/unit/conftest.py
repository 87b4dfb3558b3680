"""Shared helpers of the unit suite: trained iris models on disk and user handler folders.

Unit tests never start Ray: they exercise the data plane (runtimes, container data
ports, router) in this process, over loopback HTTP where a hop is involved.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skops.io
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from serving.runtimes import Runtime, runtime_for


@dataclass(frozen=True)
class SavedModel:
    """A fitted estimator and the folder holding its `model.skops`."""

    path: Path
    estimator: Any


@dataclass(frozen=True)
class Iris:
    """The iris dataset as plain arrays."""

    data: np.ndarray
    target: np.ndarray
    target_names: list[str]


def _save_skops(estimator: Any, folder: Path, filename: str = "model.skops") -> Path:
    """Write `estimator` with skops into `folder` (created); returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    skops.io.dump(estimator, folder / filename)
    return folder


@pytest.fixture(scope="session")
def save_skops() -> Callable[..., Path]:
    """`save_skops(estimator, folder, filename="model.skops")`: write a model folder."""
    return _save_skops


@pytest.fixture(scope="session")
def iris() -> Iris:
    dataset = load_iris()
    return Iris(dataset.data, dataset.target, [str(name) for name in dataset.target_names])


@pytest.fixture(scope="session")
def iris_classifier(iris: Iris, tmp_path_factory: pytest.TempPathFactory) -> SavedModel:
    """StandardScaler + LogisticRegression on the four iris features."""
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(
        iris.data, iris.target
    )
    return SavedModel(_save_skops(model, tmp_path_factory.mktemp("iris-classifier")), model)


@pytest.fixture(scope="session")
def iris_scaler(iris: Iris, tmp_path_factory: pytest.TempPathFactory) -> SavedModel:
    """A bare transformer: no `predict`, so the sklearn stack calls `transform`."""
    model = StandardScaler().fit(iris.data)
    return SavedModel(_save_skops(model, tmp_path_factory.mktemp("iris-scaler")), model)


@pytest.fixture(scope="session")
def iris_on_scaled(
    iris: Iris, iris_scaler: SavedModel, tmp_path_factory: pytest.TempPathFactory
) -> SavedModel:
    """LogisticRegression trained on the scaler's output: the second step of a pipeline."""
    model = LogisticRegression(max_iter=1000).fit(
        iris_scaler.estimator.transform(iris.data), iris.target
    )
    return SavedModel(_save_skops(model, tmp_path_factory.mktemp("iris-on-scaled")), model)


@pytest.fixture
def handler_dir(tmp_path: Path) -> Callable[..., Path]:
    """Write a model folder with `code/inference.py` (dedented) and any extra files."""
    count = 0

    def make(source: str, files: Mapping[str, str | bytes] | None = None) -> Path:
        nonlocal count
        count += 1
        folder = tmp_path / f"handler-{count}"
        (folder / "code").mkdir(parents=True)
        (folder / "code" / "inference.py").write_text(textwrap.dedent(source))
        for name, content in (files or {}).items():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content)
        return folder

    return make


@pytest.fixture
def loaded() -> Callable[..., Runtime]:
    """Build a runtime for an Image and load it, as a container replica does."""

    def load(
        image: str, model_dir: Path | None, environment: Mapping[str, str] | None = None
    ) -> Runtime:
        runtime = runtime_for(image, model_dir, environment or {})
        runtime.load()
        return runtime

    return load


@pytest.fixture(scope="session")
def s3_url() -> Iterator[str]:
    """moto's S3 server on a loopback port (no cloud is reachable from the tests): a real HTTP
    server speaking the S3 API, so boto3 goes through its whole stack. Tests use buckets of their
    own."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(autouse=True)
def _restore_sys_path():
    """Loading a handler must leave sys.path alone (tests/security checks it); restore it anyway."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved
