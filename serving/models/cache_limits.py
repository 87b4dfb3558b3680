"""A MultiModel container's cache settings: the spec sets them (`config.container`), its handler
obeys them (`multimodel.MultiModelHandler`'s keywords). Apart from both so that the spec's side
imports no model code."""

from __future__ import annotations

from typing import TypedDict


class CacheLimits(TypedDict):
    cache_enabled: bool  # False: a model is loaded for each request and dropped after it
    max_models: int
    max_bytes: int | None  # memory the loaded models may hold; None: no byte limit
    max_disk_bytes: int | None  # the disk cache of downloaded artifacts
