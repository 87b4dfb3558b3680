"""The operator console's weight and speed with 3 endpoints of 15 containers each.

    .venv/bin/python -m loadtests.bench_console [--loads 5] [--write-docs]

Starts an embedded server (its own Ray, in this process: `harness.servers.in_process`) with three endpoints
of fifteen Python echo containers each (the cheapest stack), sends a steady trickle of invocations to
every container of the first one, and waits until the console's JSON for it has a datapoint. Then, in
Debian's headless Chromium (Playwright, `executable_path=/usr/bin/chromium`), a fresh browser context
each time (nothing cached):

- **overview, first load**: `/console` until its endpoint table is drawn;
- **endpoint, first load**: `/console#/endpoints/bench-console-a` (16 chart rows: the variant and 15
  containers, 4 charts each) until its first chart has a point.

Page weight is every byte the browser received for that load (HTML, JS, CSS and JSON bodies, headers
left out); the time is from `goto` to the condition. Then the JSON routes alone, from this process over
HTTP (httpx, keep-alive): their size and the median time of `--loads` calls each, against `GET
/endpoints/{name}` (the gateway's own description of the same endpoint, no control-plane call) as the
baseline of the same run. Medians of `--loads` loads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section
from loadtests.harness.servers import in_process

RESULTS = ROOT / "loadtests" / "results" / "bench_console.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_console.md"
ENDPOINTS, CONTAINERS = ("bench-console-a", "bench-console-b", "bench-console-c"), 15
CHROMIUM = "/usr/bin/chromium"
DATA_WAIT_S = 180
ECHO = """
import json

def input_fn(body, content_type):
    return body if isinstance(body, str) else body.decode()

def predict_fn(data, model):
    return data

def output_fn(prediction, accept):
    return json.dumps({"echo": prediction}), "application/json"
"""


def specs(model: Path) -> list[dict[str, Any]]:
    # SERVING_SANDBOX_READ: a container process imports `serving` from this checkout; a git
    # worktree's root is not otherwise readable in its sandbox (a clone's is the installed one).
    environment = {"SERVING_SANDBOX_READ": str(ROOT)}
    return [
        {
            "EndpointName": name,
            "Containers": [
                {
                    "ContainerHostname": f"echo-{index:02d}",
                    "Image": "python",
                    "ModelDataUrl": str(model),
                    "Resources": {"Cpus": 0.01},
                    "Environment": environment,
                }
                for index in range(CONTAINERS)
            ],
        }
        for name in ENDPOINTS
    ]


class Trickle:
    """Invocations round-robin over the first endpoint's containers, about 5 a second."""

    def __init__(self, url: str) -> None:
        self.url, self.sent, self.failed = url, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Trickle:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.wait(0.2):
                host = f"echo-{self.sent % CONTAINERS:02d}"
                try:
                    answer = client.post(
                        f"/endpoints/{ENDPOINTS[0]}/invocations",
                        content=b'{"x": 1}',
                        headers={
                            "Content-Type": "application/json",
                            "X-Amzn-SageMaker-Target-Container-Hostname": host,
                        },
                    )
                    self.failed += answer.status_code != 200
                except httpx.HTTPError:
                    self.failed += 1
                self.sent += 1


def wait_for_data(url: str) -> None:
    """Until the first endpoint's JSON has an invocation datapoint (bounded)."""
    deadline = time.monotonic() + DATA_WAIT_S
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < deadline:
            document = client.get(f"/console/api/endpoints/{ENDPOINTS[0]}").json()
            if any(
                v is not None
                for chart in document["Charts"]
                for v in chart["Series"]["InvocationsPerSecond"]
            ):
                return
            time.sleep(2)
    raise RuntimeError(f"no datapoint in the console's JSON after {DATA_WAIT_S} s")


def browser_load(browser: Any, url: str, condition: str) -> dict[str, Any]:
    """One cold load of `url` in a fresh context: bytes by kind, seconds until `condition`
    holds."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    received: list[tuple[str, int]] = []
    errors: list[str] = []

    def on_response(response: Any) -> None:
        try:
            kind = response.headers.get("content-type", "").split(";")[0]
            received.append((kind, len(response.body())))
        except Exception:  # a response without a body (a redirect)
            pass

    page.on("response", on_response)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    started = time.perf_counter()
    page.goto(url)
    page.wait_for_function(condition, timeout=60_000)
    seconds = time.perf_counter() - started
    page.wait_for_load_state("networkidle", timeout=30_000)
    context.close()
    by_kind: dict[str, int] = {}
    for kind, size in received:
        by_kind[kind] = by_kind.get(kind, 0) + size
    return {
        "seconds": seconds,
        "bytes": sum(by_kind.values()),
        "by_kind": by_kind,
        "errors": errors,
    }


def json_route(client: httpx.Client, path: str, loads: int) -> dict[str, Any]:
    times, size = [], 0
    for _ in range(loads):
        started = time.perf_counter()
        answer = client.get(path)
        times.append(time.perf_counter() - started)
        answer.raise_for_status()
        size = len(answer.content)
    return {"median_ms": statistics.median(times) * 1000, "bytes": size}


def measure(url: str, loads: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    first_chart = (
        "() => [...document.querySelectorAll('[data-chart]')]"
        ".some((c) => Number(c.dataset.points) > 0)"
    )
    table = "() => document.querySelectorAll('#overview tbody tr').length >= 3"
    results: dict[str, Any] = {"overview": [], "endpoint": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            for _ in range(loads):
                results["overview"].append(browser_load(browser, f"{url}/console", table))
                results["endpoint"].append(
                    browser_load(browser, f"{url}/console#/endpoints/{ENDPOINTS[0]}", first_chart)
                )
        finally:
            browser.close()
    with httpx.Client(base_url=url, timeout=30) as client:
        results["json"] = {
            "overview": json_route(client, "/console/api/overview", loads),
            "endpoint": json_route(client, f"/console/api/endpoints/{ENDPOINTS[0]}", loads),
            "baseline: GET /endpoints/{name}": json_route(
                client, f"/endpoints/{ENDPOINTS[0]}", loads
            ),
        }
    return results


def docs_section(saved: dict[str, Any]) -> str:
    rows = []
    for view, label in (
        ("overview", "overview (`/console`)"),
        ("endpoint", "one endpoint, 64 charts"),
    ):
        loads = saved["results"][view]
        kinds = ", ".join(
            f"{kind or 'other'} {size / 1024:,.1f}"
            for kind, size in sorted(loads[0]["by_kind"].items())
        )
        rows.append(
            f"| {label} | {statistics.median(load['bytes'] for load in loads) / 1024:,.1f} "
            f"| {kinds} "
            f"| {statistics.median(load['seconds'] for load in loads) * 1000:,.0f} |"
        )
    routes = saved["results"]["json"]
    baseline = routes["baseline: GET /endpoints/{name}"]["median_ms"]
    json_rows = [
        f"| `{name}` | {route['bytes'] / 1024:,.1f} | {route['median_ms']:,.1f} | {route['median_ms'] / baseline:.1f} |"
        for name, route in routes.items()
    ]
    return "\n".join(
        [
            "## First load, 3 endpoints × 15 containers",
            "",
            f"{len(ENDPOINTS)} endpoints of {CONTAINERS} Python echo containers each on one embedded server (2 CPUs), "
            f"about 5 invocations/s spread over the first one's containers; median of {saved['loads']} cold loads, each in "
            "a fresh headless Chromium context (nothing cached). Weight: every response body the browser received "
            "for the load, in KiB; time: from navigation to the table drawn (overview) or to the first chart with a "
            "point (endpoint). Method: `loadtests/bench_console.py`.",
            "",
            "| view | page weight, KiB | by type, KiB | time to drawn, ms |",
            "|---|---|---|---|",
            *rows,
            "",
            "The JSON routes alone (httpx, keep-alive), against the gateway's own `GET /endpoints/{name}` (no "
            "control-plane call) in the same run:",
            "",
            "| route | KiB | median ms | × baseline |",
            "|---|---|---|---|",
            *json_rows,
            "",
            f"Invocations sent during the run: {saved['sent']}, failed: {saved['failed']}; console errors in the "
            f"browser: {saved['console_errors']}.",
            "",
            run_line(saved, RESULTS),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    saved = run_meta(__file__, loads=args.loads)
    clock = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-console-") as scratch:
        model = Path(scratch) / "echo"
        (model / "code").mkdir(parents=True)
        (model / "code" / "inference.py").write_text(ECHO)
        with in_process(*specs(model), ready_timeout_s=1200) as server:
            url = server.url
            print("serving at", url, flush=True)
            with Trickle(url) as trickle:
                wait_for_data(url)
                saved["results"] = measure(url, args.loads)
            saved["sent"], saved["failed"] = trickle.sent, trickle.failed
    saved["console_errors"] = sum(
        len(load["errors"]) for view in ("overview", "endpoint") for load in saved["results"][view]
    )
    saved["seconds"] = time.perf_counter() - clock
    write_results(RESULTS, saved)
    print(json.dumps(saved["results"]["json"], indent=2))
    if args.write_docs:
        write_section(DOCS, "bench_console", docs_section(saved), title="# Operator console")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
