"""A container's steps for one traced hop, carried back on its answer (`protocol.HOP_STEPS_HEADER`).

The container process cannot export spans itself: it runs tenant code in a sandbox with no network
and must never hold the exporter's endpoint or headers. So when a hop arrives with a signed
`traceparent`, the container times its steps (queue, decode, predict, encode; a batch's size) in
wall-clock nanoseconds and returns them in one header, and the gateway records them as child spans of
the hop's attempt (`spans.record`). The header is the tenant's to write, so the gateway reads it
deny-by-default: only the step names below, at most one of each, integer times clamped into the
attempt's own window. A container can misstate its own request's steps, nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["BATCH", "STEPS", "Step", "parse", "render"]

# The steps a container reports, in the order they run.
STEPS = ("queue", "decode", "transform", "predict", "encode")
BATCH = "batch"  # requests whose rows went into the model call that answered this one
MAX_HEADER = 512  # a longer header is not ours: ignored whole
_ENTRY = re.compile(r"([a-z]+)=(\d{1,20})(?:-(\d{1,20}))?")

Step = tuple[str, int, int]  # name, start and end in nanoseconds since the epoch


def render(steps: Iterable[Step], batch: int | None) -> str:
    """The header's value: `decode=START-END,predict=START-END,...,batch=N`."""
    entries = [f"{name}={start}-{end}" for name, start, end in steps]
    if batch is not None:
        entries.append(f"{BATCH}={batch}")
    return ",".join(entries)


def parse(value: str, earliest_ns: int, latest_ns: int) -> tuple[list[Step], int | None]:
    """The steps a container reported, each clamped into [earliest_ns, latest_ns] (the attempt's
    window), and its batch size; whatever is not a known step, a repeat, or malformed is dropped."""
    steps: list[Step] = []
    batch: int | None = None
    if len(value) > MAX_HEADER:
        return steps, batch
    seen: set[str] = set()
    for entry in value.split(","):
        match = _ENTRY.fullmatch(entry.strip())
        if match is None or match[1] in seen:
            continue
        name = match[1]
        seen.add(name)
        if name == BATCH and match[3] is None:
            batch = min(int(match[2]), 1 << 20)
        elif name in STEPS and match[3] is not None:
            start = min(max(int(match[2]), earliest_ns), latest_ns)
            end = min(max(int(match[3]), start), latest_ns)
            steps.append((name, start, end))
    return steps, batch
