"""Generation throughput of the huggingface stack: time to first token and output tokens/s at 1, 8 and
32 concurrent streams, with continuous batching on and off, in one run.

The model is the tiny causal LM of `examples/train_transformers.py` (made here, nothing downloaded),
served by the stack's container app in this process (its data port's ASGI app, driven over httpx's
ASGI transport: what a container process runs, without the gateway's hop). Each stream is an OpenAI
completions request streamed to the end (greedy, `max_tokens` new tokens, `ignore_eos` not offered,
so a stream may end early at the end token: tokens are counted from each stream's `usage`).
Ratios are against one stream alone, measured in the same run.

    python -m loadtests.bench_generation [--max-tokens 64] [--out docs/benchmarks/bench_generation.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COMPLETIONS = "application/vnd.serving.openai.completions+json"
PROMPTS = ["hello world", "the quick brown", "a model serves", "user: hello", "fox jumps", "good"]


async def one_stream(client: Any, prompt: str, max_tokens: int) -> tuple[float, int]:
    """(time to first token, tokens) of one streamed completion."""
    body = {
        "model": "bench.lm",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with client.stream(
        "POST", "/invocations", content=json.dumps(body), headers={"content-type": COMPLETIONS}
    ) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if first is None and event["choices"] and event["choices"][0]["text"]:
                first = time.perf_counter() - started
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return (first if first is not None else time.perf_counter() - started), tokens


async def measure(app: Any, streams: int, max_tokens: int) -> dict[str, float]:
    import httpx

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://c", timeout=600) as client:
        await one_stream(client, "warm up", 4)
        started = time.perf_counter()
        results = await asyncio.gather(
            *(one_stream(client, PROMPTS[i % len(PROMPTS)], max_tokens) for i in range(streams))
        )
        wall = time.perf_counter() - started
    first = [r[0] for r in results]
    tokens = sum(r[1] for r in results)
    return {
        "streams": streams,
        "ttft_p50_ms": 1000 * statistics.median(first),
        "ttft_max_ms": 1000 * max(first),
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
    }


def run(max_tokens: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import train_transformers

    from serving.model_server.app import build_container_app
    from serving.runtimes.huggingface import HuggingFaceRuntime

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model = train_transformers.train(Path(folder))["tiny-lm"]
        for batching in ("true", "false"):
            runtime = HuggingFaceRuntime(model, {"SERVING_HF_CONTINUOUS_BATCHING": batching})
            runtime.load()
            app = build_container_app(runtime, "lm", threads=runtime.prediction_threads())
            for streams in (1, 8, 32):
                row = asyncio.run(measure(app, streams, max_tokens))
                row["continuous_batching"] = batching == "true"
                rows.append(row)
                print(json.dumps(row), flush=True)
            runtime.unload()
    return rows


def report(rows: list[dict[str, Any]], max_tokens: int) -> str:
    alone = {r["continuous_batching"]: r["tokens_per_s"] for r in rows if r["streams"] == 1}
    lines = [
        "| continuous batching | streams | TTFT p50 (ms) | TTFT max (ms) | tokens/s | × one stream |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {'on' if r['continuous_batching'] else 'off'} | {r['streams']} "
            f"| {r['ttft_p50_ms']:.0f} | {r['ttft_max_ms']:.0f} | {r['tokens_per_s']:.0f} "
            f"| {r['tokens_per_s'] / alone[r['continuous_batching']]:.2f} |"
        )
    return "\n".join(lines) + f"\n\n(greedy, `max_tokens` {max_tokens})\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    print(report(run(args.max_tokens), args.max_tokens))


if __name__ == "__main__":
    main()
