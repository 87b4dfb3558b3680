"""A container's `Environment` chooses no code that runs outside the sandbox (issue 41, finding 1).

Before the fix a container's `Environment` was its process's environment from `exec` on, and the
sandbox came later, from Python: `LD_PRELOAD` naming a caller's shared object ran it unconfined, as
the server's user (it read Ray's token). Now such variables are refused when a spec or a CreateModel
call is validated, never reach a container process, and the process is confined before anything its
environment chooses can run (`model_server.launcher`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from serving.config.spec import SpecError, parse_spec
from serving.model_server import sandbox
from serving.model_server.container_config import ContainerConfig
from serving.model_server.supervisor import ContainerProcess
from tests.unit.sagemaker_harness import Harness, refused

KEY = b"e" * 32
PRELOAD_SOURCE = r"""
#include <stdio.h>
__attribute__((constructor)) static void hostile(void) {
    FILE *marker = fopen(MARKER, "w");
    if (marker) { fputs("ran unconfined", marker); fclose(marker); }
}
"""


def _shared_object(folder: Path, marker: Path) -> Path | None:
    """A real shared object whose constructor writes `marker` (None without a C compiler)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source, library = folder / "hostile.c", folder / "hostile.so"
    source.write_text(PRELOAD_SOURCE)
    subprocess.run(
        [compiler, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(source)],
        check=True,
    )
    return library


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_a_preloaded_library_never_reaches_the_container_process(tmp_path: Path) -> None:
    # Straight to the supervisor, past validation (as an older state file could): the variable is
    # dropped, and the process is confined before its environment applies.
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = outside / "marker"
    library = _shared_object(tmp_path, marker)
    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    (model / "code" / "inference.py").write_text("def predict_fn(data, model):\n    return data\n")
    environment = {
        "LD_PRELOAD": str(library or "/nonexistent/hostile.so"),
        "LD_LIBRARY_PATH": str(tmp_path),
        "PYTHONSTARTUP": str(tmp_path / "startup.py"),
        "GCONV_PATH": str(tmp_path),
        "FEATURE_FLAG": "kept",
    }
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="preload",
            image="python",
            model_data=str(model),
            environment=environment,
            hop_key=KEY,
        ),
        "127.0.0.1",
    )
    try:
        report = process.start(timeout=60)
        seen = _environ(report["pid"])
    finally:
        process.stop()
    assert not marker.exists(), marker.read_text()
    assert not {"LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONSTARTUP", "GCONV_PATH"} & set(seen), sorted(
        seen
    )
    assert seen["FEATURE_FLAG"] == "kept"  # the rest of the container's Environment still applies


@pytest.mark.skipif(
    sandbox.landlock_abi() == 0, reason="this kernel has no Landlock: no filesystem sandbox"
)
def test_what_the_environment_makes_the_loader_run_runs_confined(tmp_path: Path) -> None:
    # The launcher's order, on its own: a process confined first and then exec'd with LD_PRELOAD
    # runs the library inside the sandbox, so a variable missing from STARTUP_VARIABLES reopens
    # nothing.
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = outside / "marker"
    library = _shared_object(tmp_path, marker)
    if library is None:
        pytest.skip("no C compiler to build a shared object")
    script = (
        "import os, sys\n"
        "from serving.model_server import sandbox\n"
        "sandbox.apply(sandbox.SandboxPolicy(read=sandbox.SYSTEM_READ + tuple(sys.argv[2:])), require=True)\n"
        "os.execve('/bin/true', ['/bin/true'], {'LD_PRELOAD': sys.argv[1]})\n"
    )
    read = [str(library), str(Path(sandbox.__file__).resolve().parents[2])]
    subprocess.run(
        [shutil.which("python3") or "python3", "-c", script, str(library), *read],
        check=True,
        timeout=60,
        env={"PYTHONPATH": read[1]},
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    "variable",
    [
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "GCONV_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "BASH_ENV",
        "OPENSSL_CONF",
        "GLIBC_TUNABLES",
    ],
)
def test_a_spec_setting_a_startup_variable_is_refused_naming_it(
    variable: str, tmp_path: Path
) -> None:
    document = {
        "EndpointName": "e",
        "Containers": [
            {
                "ContainerHostname": "c",
                "Image": "python",
                "Environment": {variable: str(tmp_path), "SAFE": "1"},
            }
        ],
    }
    with pytest.raises(
        SpecError, match=rf"Containers\[0\]\.Environment: {variable} may not be set"
    ):
        parse_spec(document)


def test_harmless_python_variables_pass() -> None:
    # SageMaker's examples set PYTHONUNBUFFERED; it chooses no code.
    parse_spec(
        {
            "EndpointName": "e",
            "Containers": [
                {
                    "ContainerHostname": "c",
                    "Image": "python",
                    "Environment": {"PYTHONUNBUFFERED": "TRUE"},
                }
            ],
        }
    )


def test_create_model_with_a_startup_variable_is_refused_naming_it(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    try:
        environment = {"LD_PRELOAD": "/tmp/hostile.so", "MODEL_FLAG": "x"}
        refused(
            lambda: harness.model("m1", Environment=environment),
            "ValidationException",
            "LD_PRELOAD may not be set",
        )
        assert harness.sm.list_models()["Models"] == []
    finally:
        harness.stop()
