"""`serving loadtest`: drive an endpoint with Locust and write a JSON + HTML report.

Locust monkey-patches the whole process with gevent when it is imported, and that patching breaks
(RecursionError in ssl) once urllib3 or botocore have been imported unpatched, which `serving.cli`
already has. So the load test runs in a fresh interpreter (`python -m serving.loadtest`, see
`__main__`) that imports Locust before anything else, and only `locust_driver` and `__main__` import
Locust. Everything else here (scenario math, options, the report) is plain Python, testable without
Locust.

Modules: `command` (start to finish), `arguments` (each flag's text parsed), `options` (arguments to
a plan), `scenarios` (what each scenario sends), `locust_driver` (every use of Locust), `recorder`
(raw outcomes), `report` and `plots` (report.json, the summary, report.html), `report_types`
(report.json's shape), `probe` (the server's description and metrics).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

# the parsed arguments, as JSON, for the child (not argv: it holds keys)
ARGS_VARIABLE = "SERVING_LOADTEST_ARGS"


def main(args: argparse.Namespace) -> int:
    """Run the load test `args` describe (from `serving loadtest ...`) in a child interpreter; its
    exit code."""
    parser = getattr(args, "_parser", None)
    options = {k: v for k, v in vars(args).items() if k not in ("func", "_parser")}
    options["_usage"] = parser.format_usage() if parser else ""
    options["_prog"] = parser.prog if parser else "serving loadtest"
    child = subprocess.Popen(
        [sys.executable, "-m", "serving.loadtest"],
        env={**os.environ, ARGS_VARIABLE: json.dumps(options)},
    )
    # Ctrl-C reaches the child from the terminal (same process group) and it stops the run cleanly;
    # a SIGTERM to this process is passed on.
    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: child.terminate()),
    }
    try:
        return child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


__all__ = ["ARGS_VARIABLE", "main"]
