"""The package map holds: only the Ray wing imports Ray, the model server never reaches the cluster, no module is huge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVING = Path(__file__).resolve().parents[2] / "serving"
MODULES = sorted(path for path in SERVING.rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every module name `path` imports, at any depth (lazy imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def package_of(path: Path) -> str:
    return path.relative_to(SERVING).parts[0] if len(path.relative_to(SERVING).parts) > 1 else ""


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(SERVING)))
def test_only_the_ray_wing_imports_ray(path: Path) -> None:
    if package_of(path) == "ray_wing":
        return
    uses = sorted(name for name in imported(path) if name == "ray" or name.startswith("ray."))
    assert not uses, f"{path.relative_to(SERVING)} imports {uses}: Ray belongs in serving/ray_wing/"


@pytest.mark.parametrize("path", [p for p in MODULES if package_of(p) in ("model_server", "models", "runtimes")],
                         ids=lambda path: str(path.relative_to(SERVING)))
def test_the_model_server_side_reaches_no_control_plane(path: Path) -> None:
    # What runs in the sandboxed container process must need nothing of the gateway, the control plane or Ray.
    forbidden = ("serving.ray_wing", "serving.gateway", "serving.control", "serving.access", "serving.cli")
    uses = sorted(name for name in imported(path) if name.startswith(forbidden))
    assert not uses, f"{path.relative_to(SERVING)} imports {uses}"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(SERVING)))
def test_no_module_is_over_500_lines(path: Path) -> None:
    # STYLE.md: a file over ~400 lines is a sign to split by concept; 500 is where this test stops waiting.
    lines = len(path.read_text().splitlines())
    assert lines <= 500, f"{path.relative_to(SERVING)} has {lines} lines: split it by concept"
