"""A model's `code/requirements.txt`, installed into its container's environment as SageMaker does.

SageMaker's framework containers `pip install -r code/requirements.txt` when they start. Here the
file is read at deploy time from a local model folder or `.tar.gz`, and what it lists that is not
installed goes to the replicas' Ray runtime_env `pip` (a virtualenv per set of requirements, built
once per node) only where the operator allows it (`control.runtime_env` says why). A model in S3 is
not read at deploy time: its container checks at load that what the file lists is installed
(`serving.runtimes.requirements`) and refuses to start, naming what is missing, if it is not.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from serving.runtimes.requirements import REQUIREMENTS_FILE, parse_requirements

MAX_BYTES = 64 * 1024


def model_requirements(model_data: str | None) -> list[str]:
    """The requirement lines of the model's `code/requirements.txt` (local models only; [] when
    none). Raises ValueError for an archive that is not one, a pip option or a file that is not
    UTF-8."""
    if not model_data or "://" in model_data.removeprefix("file://"):
        return []
    path = Path(model_data.removeprefix("file://"))
    text = None
    if path.is_dir():
        candidate = path / "code" / REQUIREMENTS_FILE
        if candidate.is_file():
            text = candidate.read_bytes()[:MAX_BYTES].decode("utf-8")
    elif path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        try:
            with tarfile.open(path, "r:gz") as archive:
                for member in archive:
                    if member.isfile() and member.name.lstrip("./") == f"code/{REQUIREMENTS_FILE}":
                        extracted = archive.extractfile(member)
                        text = extracted.read(MAX_BYTES).decode("utf-8") if extracted else None
                        break
        # not gzip, cut short: the caller's, not a 500
        except (tarfile.TarError, EOFError, OSError) as error:
            raise ValueError(
                f"{path.name} is not a readable gzip-compressed tar archive ({error})"
            ) from None
    return parse_requirements(text) if text else []
