"""Which folders may be model roots: none that holds what the server runs, its state or its secrets.

A model root is where CreateModel's callers pick what a container reads (`translate._inside_roots`).
A root that held this `serving` package or its Python environment let a caller's container read the
server's code (and, with a writable sandbox path, rewrite it for the next replica to run), one that
held the identities or the state let it read keys and what the server deploys. So the operator names
each root (no default), and a root that holds, or lies inside, any of those is refused when the
server starts.
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

from serving.settings import ServerSettings

__all__ = ["ModelRootError", "check_model_roots", "protected_paths"]


class ModelRootError(ValueError):
    """A model root holds (or lies in) what the server runs, its state or its secrets."""


def protected_paths(settings: ServerSettings, extra: tuple[str | None, ...] = ()) -> list[Path]:
    """What no model root may hold: the server's code and Python, its state, identities and
    tokens."""
    home = Path.home()
    paths = [
        Path(__file__).resolve().parents[1],  # the `serving` package
        Path(sys.prefix),
        Path(sys.base_prefix),
        *(Path(p) for p in site.getsitepackages()),
        home / ".serving",  # state files and control tokens by default
        home / ".ray",  # Ray's token by default
        home / ".aws",
        home / ".ssh",
    ]
    named = (
        settings.state_file,
        settings.api_identities,
        os.environ.get("SERVING_STATE_DIR"),
        os.environ.get("RAY_AUTH_TOKEN_PATH"),
        *extra,
    )
    paths += [Path(p).expanduser() for p in named if p]
    return [path.resolve() for path in paths]


def check_model_roots(settings: ServerSettings, extra: tuple[str | None, ...] = ()) -> None:
    """Raise ModelRootError naming the first local root that holds or lies in a protected path
    (`extra`: more, such as the identities files of `serving up`'s specs)."""
    protected = protected_paths(settings, extra)
    for root in (
        r for r in settings.model_roots.split(os.pathsep) if r and not r.startswith("s3://")
    ):
        resolved = Path(root).expanduser().resolve()
        for path in protected:
            if path.is_relative_to(resolved):
                raise ModelRootError(
                    f"model root {root} holds {path}, which a container could then read as model data: name a "
                    "folder that holds only models (--model-root)"
                )
            if resolved.is_relative_to(path):
                raise ModelRootError(
                    f"model root {root} lies inside {path}: name a folder that holds only models"
                )
