"""A MultiModel container replica's models: fetched from the prefix, loaded on first use, cached.

Each TargetModel becomes its own runtime of the container's stack (the same loading code and
SageMaker hooks as a SingleModel container, with the model's own `code/inference.py`), fetched by
`store.ModelStore` into the replica's disk cache and kept loaded by `cache.ModelCache`. Runs in the
container process, behind `model_server.app.ContainerApp`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from serving.errors import ContainerError, ValidationError
from serving.models.artifacts import ARCHIVE_SUFFIXES
from serving.models.cache import CacheObserver, ModelCache
from serving.models.memory import approximate_memory, process_memory
from serving.models.store import DownloadObserver, ModelStore
from serving.protocol import TARGET_MODEL
from serving.runtimes import InvocationContext, Runtime, runtime_class, runtime_for

logger = logging.getLogger("serving.multimodel")


class MultiModelHandler:
    """Serves `POST /invocations` for many models: the request's TargetModel picks one."""

    def __init__(
        self,
        image: str,
        prefix: str,
        environment: Mapping[str, str],
        *,
        hostname: str,
        cache_enabled: bool = True,
        max_models: int = 16,
        max_bytes: int | None = None,
        max_disk_bytes: int | None = None,
        s3_client: Any = None,
        observer: CacheObserver | None = None,
        downloaded: DownloadObserver | None = None,
        model_latency: Callable[[float], None] | None = None,
    ) -> None:
        self.image = image
        self.model_latency = model_latency
        self.environment = dict(environment)
        self.hostname = hostname
        self.cache_dir = Path(tempfile.mkdtemp(prefix=f"serving-models-{hostname}-"))
        self.store = ModelStore(
            prefix,
            self.cache_dir,
            max_disk_bytes=max_disk_bytes,
            s3_client=s3_client,
            downloaded=downloaded,
        )
        # The exact measure walks the page tables twice per load (~25 ms in a replica); it is needed
        # only where a byte bound depends on it. Otherwise sizes (the loaded-bytes gauge) are
        # approximate.
        measure = process_memory if max_bytes is not None else approximate_memory
        self.cache = ModelCache(
            self._load,
            self._unload,
            max_models=max_models,
            max_bytes=max_bytes,
            measure=measure,
            enabled=cache_enabled,
            observer=observer,
        )
        runtime_class(image).import_frameworks()  # before the first request

    async def ainvoke(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> tuple[bytes, str]:
        target = context.target_model
        if not target:
            raise ValidationError(
                f"{TARGET_MODEL} is required: container {self.hostname} is MultiModel"
            )
        if not self.cache.holds(target):
            # Refuse an unknown model before the cache makes room for it by evicting a loaded one.
            await asyncio.to_thread(self.store.check, target)
        async with self.cache.acquire(target) as runtime:
            context.model_resolved = True  # from here on, an answer is about this model
            started = time.perf_counter()
            answer = runtime.invoke(body, content_type, accept, context)
            if self.model_latency is not None:  # the model's own time: loading is measured apart
                self.model_latency(time.perf_counter() - started)
            return answer

    def _load(self, target: str) -> Runtime:
        """In a worker thread: fetch the model (download, unpack) and load it with the stack's
        runtime."""
        with self.store.hold(target) as model_dir:  # not evicted from disk while it loads
            runtime = runtime_for(self.image, model_dir, self.environment)
            # the hooks' context.model_name, as MMS names a multi-model endpoint's model
            runtime.model_name = target
            # An unpacked archive is one model whatever its layout; a folder is the model only at
            # its top.
            runtime.nested_layouts = target.endswith(ARCHIVE_SUFFIXES) and model_dir.is_relative_to(
                self.cache_dir
            )
            try:
                runtime.load()
            # the model's own code failed: its error, never a platform refusal
            except Exception as error:
                logger.exception("container %s: model %s failed to load", self.hostname, target)
                raise ContainerError.of(error) from error
        return runtime

    def _unload(self, runtime: Runtime) -> None:
        """Drop the model and its code's modules, and give its memory back (framework caches
        included)."""
        runtime.unload()
        # Reference counting frees a model as soon as the last reference goes; a young-generation
        # collection catches the usual short cycles. A full collection would cost ~150 ms per
        # eviction in a process holding a framework, paid by the request that caused it.
        gc.collect(1)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    async def load(self, target: str) -> None:
        """Load `target` into the cache now, as its first invocation would (the V2 repository's
        load)."""
        if not self.cache.enabled:
            raise ValidationError(
                f"container {self.hostname} has ModelCacheSetting Disabled: each request loads its own model"
            )
        if not self.cache.holds(target):
            await asyncio.to_thread(self.store.check, target)
        async with self.cache.acquire(target):
            pass

    def repository(self) -> dict[str, list[str]]:
        """The models under the prefix and those loaded now (the V2 repository's index)."""
        return {"available": self.store.list_models(), "loaded": self.cache.loaded_models()}

    def close(self) -> None:
        """Forget the disk cache (the process is going away; loaded models go with it)."""
        shutil.rmtree(self.cache_dir, ignore_errors=True)
