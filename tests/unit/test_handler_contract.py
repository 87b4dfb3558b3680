"""The SageMaker handler contract, with scripts written the way AWS's toolkits and examples write
them.

Each expectation is what the toolkit's source does (sagemaker-inference-toolkit `transformer.py`,
`decoder.py`/`encoder.py`; the PyTorch toolkit's `default_pytorch_inference_handler.py`; the
scikit-learn container's `serving.py`), computed here with the same library calls, so a byte that
differs from SageMaker's answer fails the test.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from serving.config.spec import ContainerSpec
from serving.control.requirements import model_requirements
from serving.control.runtime_env import ray_runtime_env
from serving.runtimes import InvocationContext, runtime_for

if TYPE_CHECKING:
    from conftest import SavedModel

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.2, 3.4, 5.4, 2.3], [5.9, 3.0, 4.2, 1.5]]


def invoke(
    runtime,
    body: bytes,
    content_type: str = "application/json",
    accept: str | None = None,
    context: InvocationContext | None = None,
):
    return runtime.invoke(body, content_type, accept, context or InvocationContext.for_request({}))


# --- transform_fn ---------------------------------------------------------------------------------


def test_transform_fn_does_the_whole_request(handler_dir, loaded) -> None:
    runtime = loaded(
        "python",
        handler_dir(
            """
        import json
        def model_fn(model_dir):
            return {"offset": 0.5}  # not callable: transform_fn alone serves it
        def transform_fn(model, request_body, content_type, accept):
            assert isinstance(request_body, str), type(request_body)
            return json.dumps([sum(row) + model["offset"] for row in json.loads(request_body)]), accept
        """
        ),
    )
    assert invoke(runtime, json.dumps(ROWS).encode(), accept="application/json") == (
        json.dumps([sum(row) + 0.5 for row in ROWS]).encode(),
        "application/json",
    )


def test_transform_fn_with_input_fn_is_refused_as_the_toolkit_refuses_it(handler_dir) -> None:
    folder = handler_dir(
        """
        def transform_fn(model, body, content_type, accept):
            return body
        def input_fn(body, content_type):
            return body
        """
    )
    with pytest.raises(
        ValueError, match="Cannot use transform_fn implementation in conjunction with input_fn"
    ):
        runtime_for("python", folder, {}).load()


# --- the context: by parameter count, whatever its name -------------------------------------------


def test_any_hook_with_one_more_parameter_gets_the_context(handler_dir, loaded) -> None:
    runtime = loaded(
        "python",
        handler_dir(
            """
        import json
        def model_fn(model_dir, ctx):
            assert isinstance(model_dir, str)
            return {"dir": ctx.system_properties["model_dir"], "gpu": ctx.system_properties.get("gpu_id")}
        def input_fn(request_body, request_content_type, request_context):
            props = request_context.request_processor[0].get_request_properties()
            return {"body": request_body, "attrs": props.get("X-Amzn-SageMaker-Custom-Attributes"),
                    "accept": request_context.get_request_header(0, "accept")}
        def predict_fn(data, model, c):
            return {**data, **model}
        def output_fn(prediction, accept, whatever):
            whatever.set_response_header(0, "X-Model-Version", "7")
            return json.dumps(prediction), accept
        """
        ),
    )
    context = InvocationContext.for_request(
        {"x-amzn-sagemaker-custom-attributes": "a=1", "accept": "application/json"}
    )
    out, content_type = invoke(runtime, b'{"x": 1}', accept="application/json", context=context)
    assert json.loads(out) == {
        "body": '{"x": 1}',
        "attrs": "a=1",
        "accept": "application/json",
        "dir": str(runtime.model_dir),
        "gpu": None,
    }
    assert context.response_headers == {"X-Model-Version": "7"}


def test_a_hook_with_too_many_parameters_is_a_type_error_naming_it(handler_dir, loaded) -> None:
    runtime = loaded("python", handler_dir("def predict_fn(data, model, a, b):\n    return data\n"))
    with pytest.raises(TypeError, match="predict_fn takes 4 arguments but 2 were given"):
        invoke(runtime, b"[1]")


def test_pre_model_fn_and_model_warmup_fn_run_around_model_fn(handler_dir, loaded) -> None:
    runtime = loaded(
        "python",
        handler_dir(
            """
        calls = []
        def pre_model_fn(model_dir):
            calls.append("pre")
        def model_fn(model_dir):
            calls.append("model")
            return lambda data: list(calls)
        def model_warmup_fn(model_dir, model):
            calls.append("warmup")
        """
        ),
    )
    assert json.loads(invoke(runtime, b"[0]")[0]) == ["pre", "model", "warmup"]


# --- input_fn's body: str for exactly the toolkit's UTF-8 types -----------------------------------


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        ("application/json", "str"),
        ("text/csv", "str"),
        ("application/octet-stream", "bytes"),
        ("application/json; charset=utf-8", "bytes"),
        ("application/x-npy", "bytes"),
    ],
)
def test_input_fn_gets_str_or_bytes_as_the_toolkit_hands_it(
    handler_dir, loaded, content_type: str, kind: str
) -> None:
    runtime = loaded(
        "python",
        handler_dir(
            """
        def input_fn(body, content_type):
            return type(body).__name__
        def predict_fn(data, model):
            return data
        def output_fn(prediction, accept):
            return prediction
        """
        ),
    )
    assert invoke(runtime, b"[1]", content_type)[0] == kind.encode()


# --- what output_fn may return --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("returned", "expected_body", "expected_type"),
    [
        ("b'raw'", b"raw", "text/csv"),
        ("'text'", b"text", "text/csv"),
        ("('a,b', 'text/plain')", b"a,b", "text/plain"),
        # encoded for the Accept (np.savetxt fmt=%s)
        ("np.array([[1.5, 2.0]])", b"1.5,2.0\n", "text/csv"),
        # Flask / worker.Response
        ("Response('x,y', mimetype='text/x-custom')", b"x,y", "text/x-custom"),
    ],
)
def test_output_fn_results_the_model_servers_accept(
    handler_dir, loaded, returned: str, expected_body: bytes, expected_type: str
) -> None:
    runtime = loaded(
        "python",
        handler_dir(
            f"""
        import numpy as np
        from flask import Response
        def predict_fn(data, model):
            return data
        def output_fn(prediction, accept):
            return {returned}
        """
        ),
    )
    assert invoke(runtime, b"[1]", accept="text/csv") == (expected_body, expected_type)


def test_a_response_object_status_is_the_answer_status(handler_dir, loaded) -> None:
    runtime = loaded(
        "python",
        handler_dir(
            """
        from flask import Response
        def predict_fn(data, model):
            return data
        def output_fn(prediction, accept):
            return Response("teapot", status=418, mimetype="text/plain")
        """
        ),
    )
    context = InvocationContext.for_request({})
    assert invoke(runtime, b"[1]", context=context) == (b"teapot", "text/plain")
    assert context.response_status == 418


# --- streaming ------------------------------------------------------------------------------------


def test_a_generator_predict_fn_answers_in_chunks(handler_dir, loaded) -> None:
    runtime = loaded(
        "python",
        handler_dir(
            """
        def predict_fn(data, model):
            for token in data["tokens"]:
                yield {"token": token}
        """
        ),
    )
    chunks, content_type = runtime.invoke_chunks(
        b'{"tokens": ["a", "b", "c"]}', "application/json", None, InvocationContext.for_request({})
    )
    assert list(chunks) == [b'{"token":"a"}', b'{"token":"b"}', b'{"token":"c"}']
    assert content_type == "application/json"


# --- SAGEMAKER_PROGRAM / SAGEMAKER_SUBMIT_DIRECTORY -----------------------------------------------


def test_the_program_named_by_the_environment_runs_with_its_sibling_modules(
    handler_dir, loaded
) -> None:
    folder = handler_dir(
        "raise RuntimeError('inference.py must not be imported')\n",
        {
            "code/serve.py": "from scaling import factor\ndef predict_fn(data, model):\n    return [x * factor for x in data]\n",
            "code/scaling.py": "factor = 3\n",
        },
    )
    runtime = loaded("python", folder, {"SAGEMAKER_PROGRAM": "serve.py"})
    assert invoke(runtime, b"[1, 2]")[0] == b"[3,6]"


def test_a_shared_submit_directory_serves_bare_models(tmp_path: Path, loaded) -> None:
    shared = tmp_path / "shared-code"
    shared.mkdir()
    (shared / "entry.py").write_text(
        "import os\ndef model_fn(model_dir):\n    return open(os.path.join(model_dir, 'weight.txt')).read()\n"
        "def predict_fn(data, model):\n    return {'weight': model, 'data': data}\n"
    )
    environment = {"SAGEMAKER_PROGRAM": "entry", "SAGEMAKER_SUBMIT_DIRECTORY": str(shared)}
    for weight in ("1", "2"):
        model = tmp_path / f"model-{weight}"
        model.mkdir()
        (model / "weight.txt").write_text(weight)
        assert json.loads(invoke(loaded("python", model, environment), b"[0]")[0]) == {
            "weight": weight,
            "data": [0],
        }


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"SAGEMAKER_PROGRAM": "missing.py"}, "SAGEMAKER_PROGRAM 'missing.py' not found"),
        (
            {"SAGEMAKER_SUBMIT_DIRECTORY": "s3://bucket/sourcedir.tar.gz"},
            "fetched by the container's supervisor before its process starts",
        ),
        ({"SAGEMAKER_PROGRAM": "../escape.py"}, "must name a script in the code folder"),
    ],
)
def test_an_entry_point_the_environment_names_must_exist(
    handler_dir, environment: dict, message: str
) -> None:
    runtime = runtime_for(
        "python", handler_dir("def predict_fn(data, model):\n    return data\n"), environment
    )
    with pytest.raises((FileNotFoundError, ValueError), match=message):
        runtime.load()


# --- hooks of other containers are refused, naming them -------------------------------------------


@pytest.mark.parametrize(
    ("stack", "hook"),
    [("python", "input_handler"), ("sklearn", "handler"), ("python", "execution_parameters_fn")],
)
def test_a_hook_this_stack_does_not_run_is_refused_at_load(
    handler_dir, stack: str, hook: str
) -> None:
    folder = handler_dir(
        f"def {hook}(data, context):\n    return data\ndef predict_fn(data, model):\n    return data\n"
    )
    with pytest.raises(ValueError, match=f"defines {hook}, which this container does not run"):
        runtime_for(stack, folder, {}).load()


# --- requirements.txt -----------------------------------------------------------------------------


def test_requirements_the_environment_lacks_are_refused_at_load(handler_dir) -> None:
    folder = handler_dir(
        "def predict_fn(data, model):\n    return data\n",
        {"code/requirements.txt": "numpy>=1\n# a comment\nsurely-not-installed-pkg==1.0\n"},
    )
    with pytest.raises(ModuleNotFoundError, match="surely-not-installed-pkg==1.0"):
        runtime_for("python", folder, {}).load()


def test_a_local_models_requirements_go_into_its_runtime_env(handler_dir, tmp_path: Path) -> None:
    folder = handler_dir(
        "def predict_fn(data, model):\n    return data\n",
        {"code/requirements.txt": "tinypkg==0.1  # pinned\n\n"},
    )
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder / "code", arcname="code")
    assert model_requirements(str(folder)) == ["tinypkg==0.1"]
    assert model_requirements(str(archive)) == ["tinypkg==0.1"]
    assert model_requirements("s3://bucket/model.tar.gz") == []
    spec = ContainerSpec.model_validate(
        {
            "ContainerHostname": "c",
            "Image": "python",
            "ModelDataUrl": str(archive),
            "RuntimeEnvironment": {"Pip": ["other==2"]},
        }
    )
    assert ray_runtime_env(spec, allow_model_requirements=True)["pip"]["packages"] == [
        "other==2",
        "tinypkg==0.1",
    ]


def test_pip_options_in_requirements_are_refused(handler_dir) -> None:
    folder = handler_dir("", {"code/requirements.txt": "--index-url http://evil.example/simple\n"})
    with pytest.raises(ValueError, match="is a pip option"):
        model_requirements(str(folder))


# --- the framework containers' default steps, byte for byte ---------------------------------------


def test_sklearn_script_with_only_model_fn_answers_as_the_sklearn_container(
    iris_classifier: SavedModel, save_skops, handler_dir, loaded
) -> None:
    folder = handler_dir(
        """
        import os
        from skops.io import load
        def model_fn(model_dir):
            return load(os.path.join(model_dir, "model.skops"))
        """
    )
    save_skops(iris_classifier.estimator, folder)
    runtime = loaded("sklearn", folder)
    # The container: np.array(json.loads(body)).astype(float32) -> model.predict ->
    # json.dumps(default=tolist).
    expected = json.dumps(
        iris_classifier.estimator.predict(np.array(ROWS).astype(np.float32)),
        default=np.ndarray.tolist,
    )
    assert invoke(runtime, json.dumps(ROWS).encode(), accept="application/json") == (
        expected.encode(),
        "application/json",
    )
    csv_body = "\n".join(",".join(map(str, row)) for row in ROWS).encode()
    stream = io.StringIO()
    np.savetxt(
        stream,
        iris_classifier.estimator.predict(np.array(ROWS, dtype=np.float32)),
        delimiter=",",
        fmt="%s",
    )
    assert invoke(runtime, csv_body, "text/csv", "text/csv") == (
        stream.getvalue().encode(),
        "text/csv",
    )


@pytest.mark.frameworks
def test_pytorch_script_gets_the_toolkits_tensor_and_answers_its_bytes(
    hetero_models: Path, handler_dir, loaded
) -> None:
    import shutil

    import torch

    folder = handler_dir(
        """
        import torch
        def model_fn(model_dir):
            return torch.jit.load(model_dir + "/model.pt")
        def predict_fn(data, model):
            assert isinstance(data, torch.Tensor) and data.dtype == torch.float32, (type(data), data.dtype)
            with torch.no_grad():
                return model(data)
        """
    )
    shutil.copy(hetero_models / "hetero-iris-torchscript" / "model.pt", folder / "model.pt")
    runtime = loaded("pytorch", folder)
    reference = torch.jit.load(str(folder / "model.pt"))
    with torch.no_grad():
        expected = json.dumps(reference(torch.FloatTensor(ROWS)).detach().cpu().numpy().tolist())
    assert invoke(runtime, json.dumps(ROWS).encode(), accept="application/json") == (
        expected.encode(),
        "application/json",
    )


def test_an_unsupported_content_type_is_the_toolkits_415(
    handler_dir, loaded, iris_classifier: SavedModel, save_skops
) -> None:
    folder = handler_dir(
        "import os\nfrom skops.io import load\n"
        "def model_fn(model_dir):\n    return load(os.path.join(model_dir, 'model.skops'))\n"
    )
    save_skops(iris_classifier.estimator, folder)
    runtime = loaded("sklearn", folder)
    with pytest.raises(
        Exception, match="Content type application/x-image is not supported by this framework"
    ) as caught:
        invoke(runtime, b"\x89PNG", "application/x-image")
    assert caught.value.status_code == 415
