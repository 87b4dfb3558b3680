"""The package map holds: only the Ray wing imports Ray, the model server never reaches the cluster,
no module is huge."""

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


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if package_of(p) in ("model_server", "models", "runtimes")],
    ids=lambda path: str(path.relative_to(SERVING)),
)
def test_the_model_server_side_reaches_no_control_plane(path: Path) -> None:
    # What runs in the sandboxed container process must need nothing of the gateway, the control
    # plane or Ray.
    forbidden = (
        "serving.ray_wing",
        "serving.gateway",
        "serving.control",
        "serving.access",
        "serving.cli",
    )
    uses = sorted(name for name in imported(path) if name.startswith(forbidden))
    assert not uses, f"{path.relative_to(SERVING)} imports {uses}"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(SERVING)))
def test_no_module_is_over_400_lines(path: Path) -> None:
    # STYLE.md: a file over ~400 lines is a sign to split by concept.
    lines = len(path.read_text().splitlines())
    assert lines <= 400, f"{path.relative_to(SERVING)} has {lines} lines: split it by concept"


def _wire_facts() -> dict[str, str]:
    """Every string value serving.protocol defines (header names, media types, codes, paths,
    variables)."""
    from serving import protocol

    facts = {
        name: value
        for name, value in vars(protocol).items()
        if isinstance(value, str) and name.isupper()
    }
    facts.update(
        {
            f"ErrorCode.{name}": value
            for name, value in vars(protocol.ErrorCode).items()
            if isinstance(value, str) and name.isupper()
        }
    )
    return facts


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if p.name != "protocol.py"],
    ids=lambda path: str(path.relative_to(SERVING)),
)
def test_no_wire_fact_is_written_twice(path: Path) -> None:
    # A header name, media type, error code or container variable is defined once, in
    # serving/protocol.py: a second spelling drifts (it did: the SDK and the server each had their
    # own error-type header). Document field names that double as error fields ("ContainerHostname")
    # are the spec's, not wire facts. "serving" (the Ray namespace) is also the package's and the
    # command's name.
    facts = {
        value.lower(): name
        for name, value in _wire_facts().items()
        if len(value) > 4
        and not value.startswith("^")
        and name not in ("CONTAINER_HOSTNAME", "DEFAULT_VARIANT", "RAY_NAMESPACE")
    }
    tree = ast.parse(path.read_text())
    exported = {
        id(node)
        for assign in ast.walk(tree)
        if isinstance(assign, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in assign.targets)
        for node in ast.walk(assign.value)
    }  # __all__ lists names of classes, not codes
    pieces = {
        id(node)
        for joined in ast.walk(tree)
        if isinstance(joined, ast.JoinedStr)
        for node in joined.values
    }
    copies = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.lower() in facts
            and id(node) not in exported
            and id(node) not in pieces
        ):
            copies.append(
                f"line {node.lineno}: {node.value!r} (protocol.{facts[node.value.lower()]})"
            )
    assert not copies, f"{path.relative_to(SERVING)} spells wire facts itself: {copies}"


# The layer order, top first: a package imports only packages of layers below its own (at any depth,
# lazy imports included), so that no arrow runs back up and no two packages need each other.
# docs/architecture.md draws it.
LAYERS = (
    ("__init__", "cli"),  # serving/__init__.py: the public surface, loaded by name on first use
    ("ray_wing",),
    ("console",),
    ("sagemaker_api", "open_inference"),
    ("gateway", "cloudwatch"),
    ("control",),
    ("config",),
    ("model_server", "training"),
    ("models", "settings"),
    ("access", "http", "loadtest", "runtimes"),
    ("client", "errors", "s3", "trust", "tracing"),
    (
        "_gc",
        "_malloc",
        "_worker_preload",
        "archives",
        "autoscaling",
        "documents",
        "metrics",
        "private_files",
        "protocol",
    ),
)
LAYER_OF = {name: depth for depth, names in enumerate(LAYERS) for name in names}


def _unit(path: Path) -> str:
    """The package (or top-level module) a file belongs to, as LAYERS names it."""
    parts = path.relative_to(SERVING).parts
    return parts[0] if len(parts) > 1 else path.stem


def test_every_package_has_a_layer() -> None:
    units = {_unit(path) for path in MODULES}
    assert units == set(LAYER_OF), (
        f"place these in LAYERS: {sorted(units - set(LAYER_OF))}; gone: {sorted(set(LAYER_OF) - units)}"
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(SERVING)))
def test_imports_follow_the_layer_order(path: Path) -> None:
    # Issue 42: control <-> ray_wing, training <-> ray_wing, config <-> access and settings <-> http
    # were cycles that no test guarded. A new upward import fails here, naming the layers.
    own = _unit(path)
    upward = sorted(
        {
            name
            for name in imported(path)
            if name.startswith("serving.")
            and (other := name.split(".")[1]) != own
            and other in LAYER_OF
            and LAYER_OF[other] <= LAYER_OF[own]
        }
    )
    assert not upward, (
        f"{path.relative_to(SERVING)} (layer {LAYER_OF[own] + 1}, {own}) imports {upward}: a package "
        "may import only the layers below its own (tests/unit/test_layout.py LAYERS)"
    )


# One file name, one concept (issue 42): a module named as another package's is that module's
# concept, seen from the other side, and says so here.
SAME_CONCEPT = {
    "streaming.py": "InvokeEndpointWithResponseStream: the gateway relays the stream a container process makes",
    "requirements.py": "a model's code/requirements.txt: read at deploy time (control), checked at load (runtimes)",
}


def test_no_two_modules_share_a_name_unless_they_are_one_concept() -> None:
    names: dict[str, list[str]] = {}
    for path in MODULES:
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.name, []).append(str(path.relative_to(SERVING)))
    shared = {
        name: paths for name, paths in names.items() if len(paths) > 1 and name not in SAME_CONCEPT
    }
    assert not shared, (
        f"rename one of each, or say in SAME_CONCEPT why they are one concept: {shared}"
    )


def test_the_package_declares_its_public_surface() -> None:
    import importlib

    import serving

    assert serving.__all__, "serving/__init__.py names the public surface in __all__"
    for name in serving.__all__:
        assert getattr(importlib.import_module("serving"), name) is not None, name


@pytest.mark.parametrize(
    "package", sorted(p.parent for p in SERVING.glob("*/__init__.py")), ids=lambda p: p.name
)
def test_each_package_docstring_names_its_modules(package: Path) -> None:
    # Issue 42: module lists lived in three places and drifted (docs/architecture.md missed 14
    # modules); now they live in each package's docstring only, and this keeps them whole.
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = sorted(
        path.stem for path in package.glob("*.py") if path.stem not in ("__init__", "__main__")
    )
    missing = [module for module in modules if f"`{module}`" not in doc]
    assert not missing, (
        f"serving/{package.name}/__init__.py names no {missing}: say in a few words what each owns"
    )


def test_the_protocol_names_each_fact_once() -> None:
    # A second `NAME = ...` in protocol.py silently replaces the first for every importer (a media
    # type redefined there once turned InvokeEndpointWithResponseStream's into server-sent events).
    tree = ast.parse((SERVING / "protocol.py").read_text())
    names = [
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for assigned in node.targets
        for target in (assigned.elts if isinstance(assigned, ast.Tuple) else [assigned])
        if isinstance(target, ast.Name)
    ]
    twice = sorted({name for name in names if names.count(name) > 1})
    assert not twice, f"serving/protocol.py assigns {twice} more than once"
