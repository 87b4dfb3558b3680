"""A TargetModel must itself be a model: an archive, or a folder holding the model's files directly.

Otherwise a policy that denies `secret/*` is bypassed by `TargetModel: secret` when the stack
(TensorFlow) looks for the model in a folder below. Real folders and a real SavedModel.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from serving.errors import ContainerError, ValidationError
from serving.models.multimodel import MultiModelHandler
from serving.models.store import ModelStore
from serving.runtimes import InvocationContext, runtime_for


def write_model(folder: Path) -> Path:
    for name, text in {
        "code/inference.py": "def predict_fn(data, model):\n    return data\n",
        "code/helper.py": "",
        "labels.json": "[]",
    }.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_a_folder_holding_only_a_sub_model_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "prefix"
    write_model(root / "secret" / "inner")  # secret/ holds only a folder: secret/inner is the model
    store = ModelStore(str(root), tmp_path / "cache")
    for action in (store.check, store.fetch):
        with pytest.raises(ValidationError) as caught:
            action("secret")
        error = caught.value
        assert error.status == 400 and "model 'secret'" in error.message
        assert str(tmp_path) not in error.message and "/work/" not in error.message
    assert (store.fetch("secret/inner") / "code" / "inference.py").is_file()
    assert store.list_models() == ["secret/inner"]


def test_a_part_of_a_model_is_not_a_model(tmp_path: Path) -> None:
    root = tmp_path / "prefix"
    write_model(root / "secret")  # secret/code/ holds files, but it is part of the model secret
    store = ModelStore(str(root), tmp_path / "cache")
    with pytest.raises(ValidationError, match="model 'secret/code' is inside model 'secret'"):
        store.check("secret/code")
    store.check("secret")


def test_a_folder_holding_only_its_handler_is_a_model(tmp_path: Path) -> None:
    # The python stack's usual model: code/inference.py and nothing else.
    root = tmp_path / "prefix"
    (root / "echo" / "code").mkdir(parents=True)
    (root / "echo" / "code" / "inference.py").write_text(
        "def predict_fn(data, model):\n    return data\n"
    )
    store = ModelStore(str(root), tmp_path / "cache")
    store.check("echo")
    with pytest.raises(ValidationError, match="model 'echo/code' is inside model 'echo'"):
        store.check("echo/code")
    assert store.list_models() == ["echo"]


def test_multimodel_refuses_the_folder_through_the_handler(tmp_path: Path) -> None:
    root = tmp_path / "prefix"
    write_model(root / "secret" / "inner")
    handler = MultiModelHandler("python", str(root), {}, hostname="mm")

    async def scenario() -> None:
        with pytest.raises(ValidationError, match="model 'secret'"):
            await handler.ainvoke(
                b"[1]", "application/json", None, InvocationContext(target_model="secret")
            )
        assert handler.cache.loaded_models() == []

    try:
        asyncio.run(scenario())
    finally:
        handler.close()


def test_multimodel_tensorflow_does_not_descend_into_a_sub_model(
    hetero_models: Path, tmp_path: Path
) -> None:
    # secret/ holds a file of its own, so the store takes it as a model; its SavedModel sits in a
    # model folder below it (secret/inner/1/), which a SingleModel container would descend into. A
    # MultiModel folder TargetModel is exactly its folder: no SavedModel at its top or in a version
    # folder, so no model.
    root = tmp_path / "prefix"
    shutil.copytree(hetero_models / "hetero-tf-features" / "1", root / "secret" / "inner" / "1")
    (root / "secret" / "README").write_text("notes")
    handler = MultiModelHandler("tensorflow", str(root), {}, hostname="mm")

    async def scenario() -> None:
        # the model failed to load: its own error (ModelError 500 for the caller), not a platform
        # refusal
        with pytest.raises(ContainerError, match="FileNotFoundError: no SavedModel") as raised:
            await handler.ainvoke(
                b"[[1, 2, 3]]", "application/json", None, InvocationContext(target_model="secret")
            )
        assert raised.value.status == 500 and isinstance(raised.value.__cause__, FileNotFoundError)
        assert handler.cache.loaded_models() == []

    try:
        asyncio.run(scenario())
    finally:
        handler.close()
    # SingleModel keeps SageMaker's <model>/<version>/ layout
    single = runtime_for("tensorflow", root / "secret", {})
    single.load()
