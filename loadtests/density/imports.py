"""What importing each stack's framework costs a fresh Python process, before any model: the part of
a container process that every container of the stack repeats (and a process forked after the import
would share copy-on-write). Also: how many processes outside a measured tree map the frameworks'
libraries, since their file pages' PSS is split with those too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from loadtests.harness.results import ROOT

IMPORTS = {
    "python (nothing imported)": "pass",
    "numpy": "import numpy",
    # as our sklearn stack imports skops: without the PyTorch that its estimator walk would import
    "sklearn": "from serving.runtimes.skops_trust import _import_skops; _import_skops()",
    "pytorch": "import torch",
    "tensorflow": "import tensorflow, keras",
    "onnx": "import numpy, onnxruntime",
}
MEASURE = (
    "import json, os; from loadtests.density import smaps; g = smaps.read(os.getpid()); "
    "print(json.dumps({'pss': sum(v['pss'] for v in g.values()), "
    "'private': sum(v['private'] for v in g.values()), "
    "'shared': sum(v['shared'] for v in g.values()), 'heap': g.get(smaps.HEAP, {}).get('pss', 0)}))"
)
FRAMEWORK_LIBS = ("libtorch_cpu.so", "libtensorflow_framework.so", "onnxruntime_pybind11_state")


def import_costs() -> dict[str, dict[str, int]]:
    """{stack: {"pss", "private", "shared", "heap"}} in bytes, of a fresh `python -c "import ..."`."""
    costs = {}
    for stack, statement in IMPORTS.items():
        done = subprocess.run(
            [sys.executable, "-c", f"{statement}\n{MEASURE}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
            env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"},
        )
        if done.returncode == 0:
            costs[stack] = json.loads(done.stdout.strip().splitlines()[-1])
    return costs


def outside_sharers(tree: list[int]) -> int:
    """Processes not in `tree` that map one of the frameworks' main libraries."""
    count, inside = 0, set(tree)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in inside:
            continue
        try:
            maps = (entry / "maps").read_text()
        except OSError:
            continue
        count += any(lib in maps for lib in FRAMEWORK_LIBS)
    return count
