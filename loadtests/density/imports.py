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

# name -> (our stack whose container process it is compared with, or None; the import)
IMPORTS = {
    "nothing": (None, "pass"),
    "numpy": ("python", "import numpy"),
    # as our sklearn stack imports skops: without the PyTorch its estimator walk would import
    "sklearn, skops.io": (
        "sklearn",
        "from serving.runtimes.skops_trust import _import_skops; _import_skops()",
    ),
    "torch": ("pytorch", "import torch"),
    # as our tensorflow stack imports it for a SavedModel: without Keras
    "tensorflow": (
        "tensorflow",
        "from serving.runtimes.tf_import import import_tensorflow; import_tensorflow()",
    ),
    "tensorflow, keras": (None, "import tensorflow, keras"),
    "onnxruntime": ("onnx", "import numpy, onnxruntime"),
}
MEASURE = (
    "import json, os; from loadtests.density import smaps; g = smaps.read(os.getpid()); "
    "print(json.dumps({'pss': sum(v['pss'] for v in g.values()), "
    "'private': sum(v['private'] for v in g.values()), "
    "'shared': sum(v['shared'] for v in g.values()), 'heap': g.get(smaps.HEAP, {}).get('pss', 0)}))"
)
FRAMEWORK_LIBS = ("libtorch_cpu.so", "libtensorflow_framework.so", "onnxruntime_pybind11_state")


def import_costs() -> dict[str, dict[str, int]]:
    """{name: {"pss", "private", "shared", "heap"}} in bytes, of a fresh `python -c "import ..."`."""
    costs = {}
    for name, (_, statement) in IMPORTS.items():
        done = subprocess.run(
            [sys.executable, "-c", f"{statement}\n{MEASURE}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
            env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"},
        )
        if done.returncode == 0:
            costs[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return costs


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def outside_sharers(tree: list[int]) -> int:
    """Processes not in `tree` that map one of the frameworks' main library files the tree maps."""
    files = {
        line.split(None, 5)[5]
        for pid in tree
        for line in _maps(pid).splitlines()
        if any(lib in line for lib in FRAMEWORK_LIBS) and len(line.split(None, 5)) > 5
    }
    inside, count = set(tree), 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in inside:
            maps = _maps(int(entry.name))
            count += bool(files) and any(file in maps for file in files)
    return count
