"""Train the fifteen models and build MLServer's model repository in a process of its own, so that
the benchmark's own process never maps a framework's libraries: their file pages' PSS would be split
with it and lower the floor's and ours.

    python -m loadtests.density.prepare MODELS_DIR CONTAINERS_JSON MLSERVER_ROOT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from loadtests.density.mlserver import repository
    from loadtests.harness.models import hetero_models

    models, containers, root = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    hetero_models(models)
    repository(root, json.loads(containers.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
