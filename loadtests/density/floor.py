"""The floor: one plain Python process that loads the fifteen models of examples/fifteen.yaml with
their frameworks and answers each one's sample request in-process (no server, no isolation).

    python -m loadtests.density.floor MODELS_DIR CONTAINERS_JSON

Prints one JSON line, {"answers": {hostname: answer}}, once every model answered, then idles until
its stdin closes: the benchmark measures it meanwhile.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> int:
    from loadtests.density.loaders import bare, load

    models = Path(sys.argv[1])
    containers = json.loads(Path(sys.argv[2]).read_text())
    expected = json.loads((models / "expected.json").read_text())
    answers = {}
    for container in containers:
        path = Path(container["ModelDataUrl"])
        predict = load(container["Image"], path)
        answers[container["ContainerHostname"]] = predict(bare(expected[path.name]["request"]))
    print(json.dumps({"answers": answers}), flush=True)
    sys.stdin.read()  # until the benchmark closes it
    return 0


if __name__ == "__main__":
    sys.exit(main())
