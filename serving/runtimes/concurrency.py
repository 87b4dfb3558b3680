"""How many predictions one replica runs at once, and how it batches them: settings read from its
environment.

Pure and light (no NumPy, no framework): the spec validates a container's `Environment` with it, and
the container process reads its settings with it once at start-up, so both agree on names, defaults
and errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from serving.protocol import (
    CPUS_ENV,
    INLINE_BUDGET_ENV,
    MAX_BATCH_DELAY_ENV,
    MAX_BATCH_SIZE_ENV,
    MODEL_THREADS_ENV,
    PREFERRED_BATCH_SIZES_ENV,
)

# Stacks whose predictions release the GIL inside the framework (C++/CUDA kernels), so that
# predictions on several threads of one process run at once. scikit-learn mostly holds it (NumPy
# glue, Python loops); the python stack runs the user's own code, which may not be thread-safe.
GIL_RELEASING = frozenset({"pytorch", "onnx", "tensorflow", "xgboost", "lightgbm"})
MAX_THREADS = 1024


@dataclass(frozen=True)
class BatchSettings:
    """A container's dynamic batching: at most `max_batch_size` rows per predict_fn call, the first
    request waiting at most `max_delay_s` for others; `preferred` sizes to cut at when possible
    (ascending)."""

    max_batch_size: int
    max_delay_s: float = 0.0
    preferred: tuple[int, ...] = ()


def _whole(name: str, value: str) -> int:
    value = value.strip()
    if not (value.isdigit() and 1 <= int(value) <= 1_000_000):
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    return int(value)


def batch_settings(environment: Mapping[str, str]) -> BatchSettings | None:
    """The container's batching, or None when it does not batch (no SERVING_MAX_BATCH_SIZE, or
    1)."""
    size = environment.get(MAX_BATCH_SIZE_ENV)
    delay = environment.get(MAX_BATCH_DELAY_ENV)
    preferred_text = environment.get(PREFERRED_BATCH_SIZES_ENV)
    if size is None:
        given = [
            name
            for name, value in (
                (MAX_BATCH_DELAY_ENV, delay),
                (PREFERRED_BATCH_SIZES_ENV, preferred_text),
            )
            if value is not None
        ]
        if given:
            raise ValueError(f"{', '.join(given)} needs {MAX_BATCH_SIZE_ENV}")
        return None
    max_batch_size = _whole(MAX_BATCH_SIZE_ENV, size)
    delay_ms = 0.0
    if delay is not None:
        try:
            delay_ms = float(delay)
        except ValueError:
            delay_ms = -1.0
        if not (math.isfinite(delay_ms) and 0 <= delay_ms <= 60_000):
            raise ValueError(
                f"{MAX_BATCH_DELAY_ENV} must be milliseconds from 0 to 60000, got {delay!r}"
            )
    preferred: tuple[int, ...] = ()
    if preferred_text:
        preferred = tuple(
            sorted({_whole(PREFERRED_BATCH_SIZES_ENV, part) for part in preferred_text.split(",")})
        )
        too_big = [size for size in preferred if size > max_batch_size]
        if too_big:
            raise ValueError(
                f"{PREFERRED_BATCH_SIZES_ENV} {too_big} exceed {MAX_BATCH_SIZE_ENV} {max_batch_size}"
            )
    if max_batch_size == 1:
        return None  # one row per call is what an unbatched container does
    return BatchSettings(max_batch_size, delay_ms / 1000.0, preferred)


def model_threads(image: str, environment: Mapping[str, str], scripted: bool = False) -> int:
    """Predictions one replica runs at once: SERVING_MODEL_THREADS, else ceil(Cpus) for a stack that
    releases the GIL and runs no user hooks, else 1 (a user's hooks are thread-safe only when the
    user says so)."""
    override = environment.get(MODEL_THREADS_ENV)
    if override is not None:
        threads = _whole(MODEL_THREADS_ENV, override)
        if threads > MAX_THREADS:
            raise ValueError(f"{MODEL_THREADS_ENV} must be at most {MAX_THREADS}, got {override!r}")
        return threads
    if image not in GIL_RELEASING or scripted:
        return 1
    try:
        cpus = float(environment.get(CPUS_ENV) or 1)
    except ValueError:
        cpus = 1.0
    return max(1, min(MAX_THREADS, math.ceil(cpus)))


# 3x a 0.5 ms pipeline's p99 CPU in this VM's slow phases (docs/benchmarks/bench_invoke.md)
DEFAULT_INLINE_BUDGET_MS = 5.0
# a longer stall of the event loop would delay /ping and other requests noticeably
MAX_INLINE_BUDGET_MS = 50.0


def inline_budget_s(environment: Mapping[str, str]) -> float:
    """How long a prediction may take and still run on the container process's event loop
    (SERVING_INLINE_BUDGET_MS, default 5; 0: never), in seconds (`model_server.inline`)."""
    text = environment.get(INLINE_BUDGET_ENV)
    if text is None:
        return DEFAULT_INLINE_BUDGET_MS / 1000.0
    try:
        budget = float(text)
    except ValueError:
        budget = -1.0
    if not (math.isfinite(budget) and 0 <= budget <= MAX_INLINE_BUDGET_MS):
        raise ValueError(
            f"{INLINE_BUDGET_ENV} must be milliseconds from 0 to {MAX_INLINE_BUDGET_MS:g}, got {text!r}"
        )
    return budget / 1000.0


__all__ = ["GIL_RELEASING", "BatchSettings", "batch_settings", "inline_budget_s", "model_threads"]
