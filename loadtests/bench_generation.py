"""Generation throughput of the huggingface stack against `transformers serve` (Hugging Face's own
OpenAI-compatible server), same model, same machine, one run: time to first token and output
tokens/s at 1, 8 and 32 concurrent streams, each with continuous batching on and off.

The model is the tiny causal LM of `examples/train_transformers.py` (made here, nothing downloaded).
Every server runs in a process of its own on loopback and is driven by the same client: streamed,
greedy OpenAI completions of at most `--max-tokens` new tokens (a stream may end earlier at the end
token: tokens are counted from each stream's `usage`). Ours is the stack's container app (what a
container process serves, without the gateway's hop) under uvicorn; `transformers serve` needs
`accelerate`, which the benchmark installs into `.bench/transformers-serve` on first use (not a
dependency of this project). Ratios are against one stream alone of the same server.

    python -m loadtests.bench_generation [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPLETIONS = "application/vnd.serving.openai.completions+json"
EVENT_STREAM_TYPE = "application/vnd.amazon.eventstream"
# what the gateway sends a container for InvokeEndpointWithResponseStream: its answer streams
HOP_STREAM = {"x-serving-hop-stream": "true"}
PROMPTS = ["hello world", "the quick brown", "a model serves", "user: hello", "fox jumps", "good"]
ACCELERATE = ROOT / ".bench" / "transformers-serve"  # `transformers serve`'s one missing package


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve_ours(model: str, port: int, batching: str) -> None:
    """The stack's container app under uvicorn (run in a process of its own)."""
    import uvicorn

    from serving.model_server.app import build_container_app
    from serving.runtimes.huggingface import HuggingFaceRuntime

    runtime = HuggingFaceRuntime(Path(model), {"SERVING_HF_CONTINUOUS_BATCHING": batching})
    runtime.load()
    app = build_container_app(runtime, "lm", threads=runtime.prediction_threads())
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class Server:
    """One server process and how to ask it for a streamed completion."""

    def __init__(
        self, name: str, command: list[str], path: str, headers: dict[str, str], model: str
    ):
        self.name, self.path, self.headers, self.model = name, path, headers, model
        self.port = _free_port()
        environment = {**os.environ, "PYTHONPATH": f"{ACCELERATE}:{ROOT}"}
        self.process = subprocess.Popen(
            [part.replace("{port}", str(self.port)) for part in command],
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def servers(model: Path) -> list[tuple[str, list[str], str, dict[str, str]]]:
    ours = [
        sys.executable,
        "-m",
        "loadtests.bench_generation",
        "--serve-ours",
        str(model),
        "{port}",
    ]
    theirs = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model)]
    theirs += ["--host", "127.0.0.1", "--port", "{port}", "--device", "cpu"]
    # the container's streaming answer, as the gateway asks for it on a streamed call (the
    # gateway's own hop and relay are left out, as they are for transformers serve)
    ours_headers = {"content-type": COMPLETIONS, **HOP_STREAM}
    json_headers = {"content-type": "application/json"}
    return [
        ("ours, batching on", [*ours, "true"], "/invocations", ours_headers),
        ("ours, batching off", [*ours, "false"], "/invocations", ours_headers),
        (
            "transformers serve --continuous-batching",
            [*theirs, "--continuous-batching"],
            "/v1/completions",
            json_headers,
        ),
        ("transformers serve", theirs, "/v1/completions", json_headers),
    ]


async def one_stream(
    client: Any, server: Server, prompt: str, max_tokens: int
) -> tuple[float, int]:
    """(time to first token, tokens) of one streamed completion."""
    body = {
        "model": server.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    tokens = chunks = 0
    url = server.url() + server.path
    async with client.stream(
        "POST", url, content=json.dumps(body), headers=server.headers
    ) as response:
        response.raise_for_status()
        async for line in _lines(response):
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("text"):
                chunks += 1
                if first is None:
                    first = time.perf_counter() - started
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return (first if first is not None else time.perf_counter() - started), tokens or chunks


async def _lines(response: Any) -> Any:
    """The server-sent event lines of a response, out of SageMaker's event stream when the
    container streams in it (a streaming hop's answer), as they arrive."""
    if not response.headers.get("content-type", "").startswith(EVENT_STREAM_TYPE):
        async for line in response.aiter_lines():
            yield line
        return
    from botocore.eventstream import EventStreamBuffer

    buffer, pending = EventStreamBuffer(), b""
    async for data in response.aiter_raw():
        buffer.add_data(data)
        for message in buffer:
            pending += message.payload
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode()


async def wait_ready(client: Any, server: Server, deadline_s: float = 180) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}")
        try:
            await one_stream(client, server, "warm up", 4)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def measure(server: Server, counts: tuple[int, ...], max_tokens: int) -> list[dict[str, Any]]:
    import httpx

    rows = []
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await wait_ready(client, server)
        for streams in counts:
            started = time.perf_counter()
            results = await asyncio.gather(
                *(
                    one_stream(client, server, PROMPTS[i % len(PROMPTS)], max_tokens)
                    for i in range(streams)
                )
            )
            wall = time.perf_counter() - started
            first = [r[0] for r in results]
            tokens = sum(r[1] for r in results)
            row = {
                "server": server.name,
                "streams": streams,
                "ttft_p50_ms": 1000 * statistics.median(first),
                "ttft_max_ms": 1000 * max(first),
                "tokens": tokens,
                "tokens_per_s": tokens / wall,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def ensure_accelerate() -> None:
    if not (ACCELERATE / "accelerate").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(ACCELERATE),
                "accelerate==1.15.0",
            ],
            check=True,
        )


def run(max_tokens: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "examples"))
    import train_transformers

    ensure_accelerate()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        model = train_transformers.train(Path(folder))["tiny-lm"]
        for name, command, path, headers in servers(model):
            server = Server(name, command, path, headers, str(model))
            try:
                rows += asyncio.run(measure(server, (1, 8, 32), max_tokens))
            finally:
                server.stop()
    return rows


def report(rows: list[dict[str, Any]], max_tokens: int) -> str:
    alone = {r["server"]: r["tokens_per_s"] for r in rows if r["streams"] == 1}
    lines = [
        "| server | streams | TTFT p50 (ms) | TTFT max (ms) | tokens/s | × one stream |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['server']} | {r['streams']} | {r['ttft_p50_ms']:.0f} | {r['ttft_max_ms']:.0f} "
            f"| {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / alone[r['server']]:.2f} |"
        )
    return "\n".join(lines) + f"\n\n(greedy, `max_tokens` {max_tokens})\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--serve-ours", nargs=3, metavar=("MODEL", "PORT", "BATCHING"))
    args = parser.parse_args()
    if args.serve_ours:
        model, port, batching = args.serve_ours
        serve_ours(model, int(port), batching)
        return
    print(report(run(args.max_tokens), args.max_tokens))


if __name__ == "__main__":
    main()
