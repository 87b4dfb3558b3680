"""serving: up to fifteen model containers behind one HTTP endpoint on Ray Serve, speaking
SageMaker's protocols.

The public surface, importable from here (each loaded on first use: importing `serving` runs
nothing, so a container process or a Ray worker that imports a module of this package pays for that
module only):

- `Client`, `AsyncClient`: the SDK (`serving.client`; docs/client.md).
- `EndpointSpec`, `parse_spec`, `load_spec`: the endpoint spec (`serving.config.spec`;
  docs/spec.md).
- `ServerSettings`: the server's settings (`serving.settings`; docs/api.md).
- `EmbeddedServer`: Ray, the gateway and endpoints as a context manager (`serving.ray_wing`;
  docs/architecture.md).
- `train`: one run of a training recipe on Ray (`serving.ray_wing.training`; docs/training.md).

Everything else is the implementation: its packages say what each owns (docs/architecture.md,
"Package map").
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "Client": "serving.client",
    "AsyncClient": "serving.client",
    "EndpointSpec": "serving.config.spec",
    "parse_spec": "serving.config.spec",
    "load_spec": "serving.config.spec",
    "ServerSettings": "serving.settings",
    "EmbeddedServer": "serving.ray_wing",
    "train": "serving.ray_wing.training",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


__all__ = [
    "AsyncClient",
    "Client",
    "EmbeddedServer",
    "EndpointSpec",
    "ServerSettings",
    "load_spec",
    "parse_spec",
    "train",
]
