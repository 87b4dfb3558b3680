"""A recipe's data, checked before anything starts: which files, which columns, what the label is, a
fingerprint.

The rows themselves are read by Ray Data (serving/ray_wing/training.py) and sharded across the
workers; this module only opens what it must to refuse a bad recipe early (an unreadable file, a
missing label column) and to fingerprint the exact bytes the model was trained on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.training.recipe import SKLEARN_PREFIX, DataSection, RecipeError
from serving.training.run_records import DataExtra, DataRecord

__all__ = ["DataPlan", "plan_data", "sklearn_frame"]

SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True)
class DataPlan:
    """What the trainer reads: a scikit-learn dataset by name, or CSV/Parquet files, and the columns
    it uses."""

    kind: str  # "sklearn", "csv" or "parquet"
    source: str
    files: tuple[str, ...]
    columns: tuple[str, ...]
    label: str
    features: tuple[str, ...]
    group_by: str | None
    fingerprint: str
    extra: DataExtra = field(default_factory=DataExtra)

    def record(self) -> DataRecord:
        """The data's part of model.json."""
        return {
            "source": self.source,
            "format": self.kind,
            "files": len(self.files) or None,
            "label": self.label,
            "features": list(self.features),
            "fingerprint": self.fingerprint,
        }


def sklearn_frame(name: str) -> Any:
    """A scikit-learn bundled dataset as a DataFrame: feature columns plus `target` (no
    download)."""
    from sklearn import datasets

    loader = getattr(datasets, f"load_{name}")
    frame = loader(as_frame=True).frame
    frame.columns = [
        str(c).replace(" ", "_").replace("(", "").replace(")", "") for c in frame.columns
    ]
    return frame


def _files(source: Path) -> tuple[str, list[Path]]:
    if source.is_file():
        kind = SUFFIXES.get(source.suffix.lower())
        if kind is None:
            raise RecipeError(f"data.source: {source} is neither .csv nor .parquet")
        return kind, [source]
    if source.is_dir():
        found = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
        kinds = {SUFFIXES[p.suffix.lower()] for p in found}
        if not found:
            raise RecipeError(f"data.source: folder {source} holds no .csv or .parquet file")
        if len(kinds) > 1:
            raise RecipeError(
                f"data.source: folder {source} mixes CSV and Parquet files; use one format"
            )
        return kinds.pop(), found
    raise RecipeError(f"data.source: {source} does not exist")


def _columns(kind: str, path: Path) -> list[str]:
    """The column names of one file, read without loading its rows."""
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        import pyarrow.csv as pcsv

        with pcsv.open_csv(path) as reader:
            return list(reader.schema.names)
    except PermissionError:
        raise RecipeError(f"data.source: cannot read {path}: permission denied") from None
    except Exception as error:  # pyarrow's ArrowInvalid / ArrowIOError: not a CSV / Parquet file
        reason = " ".join(str(error).split())[:300]
        raise RecipeError(f"data.source: cannot read {path} as {kind.upper()}: {reason}") from None


def _digest(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def plan_data(data: DataSection) -> DataPlan:
    """Check the recipe's data and fingerprint it; RecipeError names the field at fault."""
    extra: DataExtra = {}
    files: list[Path]
    if data.source.startswith(SKLEARN_PREFIX):
        name = data.source.removeprefix(SKLEARN_PREFIX)
        frame = sklearn_frame(name)
        kind, files, columns = "sklearn", [], list(frame.columns)
        import pandas as pd

        fingerprint = (
            "sha256:"
            + hashlib.sha256(pd.util.hash_pandas_object(frame, index=False).values).hexdigest()
        )
        extra["dataset"] = name
    else:
        kind, files = _files(Path(data.source))
        columns = _columns(kind, files[0])
        for other in files[1:]:
            if _columns(kind, other) != columns:
                raise RecipeError(f"data.source: {other} has other columns than {files[0]}")
        fingerprint = _digest(files)
    if data.label not in columns:
        raise RecipeError(
            f"data.label: no column {data.label!r} in {data.source} (columns: {_listed(columns)})"
        )
    if data.group_by is not None and data.group_by not in columns:
        raise RecipeError(
            f"data.group_by: no column {data.group_by!r} in {data.source} (columns: {_listed(columns)})"
        )
    reserved = {data.label, data.group_by}
    if data.features is not None:
        missing = [c for c in data.features if c not in columns]
        if missing:
            raise RecipeError(f"data.features: no column {_listed(missing)} in {data.source}")
        clash = [c for c in data.features if c in reserved]
        if clash:
            raise RecipeError(f"data.features: {_listed(clash)} is the label or group column")
        features = list(data.features)
    else:
        features = [c for c in columns if c not in reserved]
    if not features:
        raise RecipeError(f"data.features: {data.source} has no feature column besides the label")
    return DataPlan(
        kind=kind,
        source=data.source,
        files=tuple(str(p) for p in files),
        columns=tuple(columns),
        label=data.label,
        features=tuple(features),
        group_by=data.group_by,
        fingerprint=fingerprint,
        extra=extra,
    )


def _listed(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")
