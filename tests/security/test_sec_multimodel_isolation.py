"""MultiModel models do not share imports: each model's code/ is a private package.

Models are real folders with real `code/` handlers, served through the real MultiModelHandler
(model store + cache + runtime), in this process.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from serving.models.multimodel import MultiModelHandler
from serving.runtimes import InvocationContext, runtime_for

HANDLER = """
import json
import helper                      # at load: must be this model's code/helper.py
from shared.values import COLOUR   # a package in code/, also this model's

def predict_fn(data, model):
    import lazy_helper             # at predict time, after other models were loaded
    return {"helper": helper.VALUE, "lazy": lazy_helper.VALUE, "colour": COLOUR, "module": helper.__name__}

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
"""


def write_model(folder: Path, value: str) -> Path:
    files = {
        "code/inference.py": HANDLER,
        "code/helper.py": f"VALUE = {value!r}\n",
        "code/lazy_helper.py": f"VALUE = {value + '-lazy'!r}\n",
        "code/shared/__init__.py": "",
        # sibling import, nested
        "code/shared/values.py": "from helper import VALUE as _V\nCOLOUR = _V + '-colour'\n",
        "labels.json": "[]",
    }
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def code_modules(root: Path) -> dict[str, str]:
    """sys.modules entries whose file lies under `root`: name -> file."""
    found = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(root.resolve()):
            found[name] = file
    return found


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    root = tmp_path / "prefix"
    write_model(root / "alpha", "A")
    write_model(root / "beta", "B")
    return root


def test_each_model_imports_its_own_helpers_and_nothing_leaks(prefix: Path) -> None:
    path_before, meta_before = list(sys.path), list(sys.meta_path)
    handler = MultiModelHandler("python", str(prefix), {}, hostname="mm", max_models=2)

    async def ask(model: str) -> dict:
        import json

        out, _ = await handler.ainvoke(
            b"[1]", "application/json", None, InvocationContext(target_model=model)
        )
        return json.loads(out)

    async def scenario() -> list[dict]:
        answers = [await ask("alpha"), await ask("beta"), await ask("alpha"), await ask("beta")]
        assert sorted(handler.cache.loaded_models()) == ["alpha", "beta"]
        assert sys.path == path_before, "a model's code/ went on sys.path"
        for name in ("helper", "lazy_helper", "shared", "shared.values", "inference"):
            assert name not in sys.modules, f"{name} was imported process-wide"
        loaded = code_modules(prefix)
        packages = {name.split(".")[0] for name in loaded}
        assert len(packages) == 2 and all(name.startswith("_serving_code_") for name in packages), (
            loaded
        )
        await handler.cache.unload_all()
        return answers

    try:
        answers = asyncio.run(scenario())
    finally:
        handler.close()
    for answer, value in zip(answers, "ABAB"):
        assert {k: answer[k] for k in ("helper", "lazy", "colour")} == {
            "helper": value,
            "lazy": f"{value}-lazy",
            "colour": f"{value}-colour",
        }, answers
    assert answers[0]["module"] != answers[1]["module"]
    assert code_modules(prefix) == {}, "unloaded models left their modules behind"
    assert sys.path == path_before and sys.meta_path == meta_before


def test_eviction_forgets_the_evicted_models_modules(prefix: Path) -> None:
    handler = MultiModelHandler("python", str(prefix), {}, hostname="mm", max_models=1)

    async def scenario() -> None:
        for model in ("alpha", "beta"):  # beta's load evicts alpha
            await handler.ainvoke(
                b"[1]", "application/json", None, InvocationContext(target_model=model)
            )
        assert handler.cache.loaded_models() == ["beta"]
        assert code_modules(prefix / "alpha") == {}
        assert code_modules(prefix / "beta")
        await handler.cache.unload_all()

    try:
        asyncio.run(scenario())
    finally:
        handler.close()


def test_a_failed_load_leaves_no_modules(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", "A")
    (folder / "code" / "inference.py").write_text(
        "import helper\nraise RuntimeError('broken model')\n"
    )
    path_before = list(sys.path)
    with pytest.raises(RuntimeError, match="broken model"):
        runtime_for("python", folder, {}).load()
    assert code_modules(folder) == {} and sys.path == path_before


def test_single_model_sibling_imports_work_and_stay_private(tmp_path: Path) -> None:
    import json

    folder = write_model(tmp_path / "m", "S")
    (folder / "code" / "serving_sec_probe.py").write_text("X = 1\n")
    runtime = runtime_for("python", folder, {})
    runtime.load()
    out, _ = runtime.invoke(b"[1]", "application/json", None, InvocationContext())
    assert json.loads(out)["lazy"] == "S-lazy"
    # Before, code/ was on sys.path: any later import of this name, anywhere in the process, got the
    # model's file.
    with pytest.raises(ModuleNotFoundError):
        __import__("serving_sec_probe")


IMPORT_FORMS = """
import json
import shared.values               # binds `shared`, this model's package
from . import helper as relative   # relative imports work too: code/ is a package
import helper

def predict_fn(data, model):
    from shared import values      # lazily, a submodule through its package
    return [shared.values.COLOUR, values.COLOUR, relative.VALUE, relative is helper]

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
"""


def test_import_forms_resolve_to_the_models_own_modules(tmp_path: Path) -> None:
    import json

    folder = write_model(tmp_path / "m", "F")
    (folder / "code" / "inference.py").write_text(IMPORT_FORMS)
    runtime = runtime_for("python", folder, {})
    runtime.load()
    out, _ = runtime.invoke(b"[1]", "application/json", None, InvocationContext())
    assert json.loads(out) == ["F-colour", "F-colour", "F", True]
    runtime.unload()
    assert code_modules(folder) == {}
