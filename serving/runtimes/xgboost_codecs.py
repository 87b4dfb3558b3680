"""Request and response bodies of SageMaker's XGBoost container (`sagemaker-xgboost-container`).

Its algorithm mode (`algorithm_mode/serve.py`, `serve_utils.py`) reads CSV (no header, no label; an
empty field is a missing value), LIBSVM (`label idx:value ...`; an absent feature is missing;
indices are taken as 1-based, and shifted to 0-based, when the body's smallest one is at least 1)
and RecordIO-protobuf (refused here), a request without a content type as LIBSVM. It answers CSV
(one prediction per line, a row of class probabilities per line for `multi:softprob`), JSON
`{"predictions": [{"score": ...}, ...]}` or, with `SAGEMAKER_INFERENCE_OUTPUT`, the selected fields
of each prediction. Nothing here imports XGBoost; malformed bodies are `ValidationError`s.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from serving.errors import UnsupportedFormatError, ValidationError
from serving.protocol import CSV, JSON, JSON_LINES, LIBSVM, RECORDIO_PROTOBUF, X_LIBSVM
from serving.runtimes import codecs

INPUT_TYPES = (CSV, LIBSVM, X_LIBSVM, JSON)
OUTPUT_TYPES = (CSV, JSON, JSON_LINES)
# The container's bare spellings (`get_content_type`): "csv", "libsvm".
_KINDS = {
    CSV: "csv",
    "csv": "csv",
    LIBSVM: "libsvm",
    X_LIBSVM: "libsvm",
    "libsvm": "libsvm",
    JSON: "json",
}


def input_kind(content_type: str | None) -> str:
    """ "csv", "libsvm" or "json" for a request's Content-Type (none: LIBSVM, as the container reads
    it)."""
    if not content_type:
        return "libsvm"
    kind = codecs.media_type(content_type)
    params = dict(
        part.strip().lower().split("=", 1) for part in content_type.split(";")[1:] if "=" in part
    )  # `text/csv; label_size=1` is the container's only parameter
    if kind in (CSV, "csv") and params.get("label_size", "1") != "1":
        raise UnsupportedFormatError(
            f"{content_type} is not an accepted csv ContentType: label_size must be 1"
        )
    if kind in _KINDS:
        return _KINDS[kind]
    if kind == RECORDIO_PROTOBUF:
        raise UnsupportedFormatError(
            f"{RECORDIO_PROTOBUF} input is not supported by this stack; send {CSV} or {LIBSVM}"
        )
    raise UnsupportedFormatError(
        f"unsupported content type {content_type!r}; the xgboost stack reads: {', '.join(INPUT_TYPES)}"
    )


def _text(body: bytes, what: str) -> str:
    try:
        return body.decode("utf-8").strip()
    except UnicodeDecodeError as error:
        raise ValidationError(f"request body is not valid UTF-8 {what}: {error}") from None


def parse_csv(body: bytes) -> np.ndarray:
    """Rows of float64, the delimiter sniffed from the first line (comma unless it is clearly
    another)."""
    text = _text(body, CSV)
    if not text:
        raise ValidationError("request body is empty")
    try:
        delimiter = csv.Sniffer().sniff(text.split("\n", 1)[0][:512], delimiters=",;\t| ").delimiter
    except csv.Error:
        delimiter = ","  # one column: nothing to sniff
    rows = [line.rstrip("\r").split(delimiter) for line in text.split("\n")]
    width = len(rows[0])
    for number, row in enumerate(rows, 1):
        if len(row) != width:
            raise ValidationError(f"CSV row {number} has {len(row)} fields; row 1 has {width}")
    fields = [[field if field.strip() else "nan" for field in row] for row in rows]
    try:
        return np.array(fields).astype(np.float64)
    except ValueError:
        for number, row in enumerate(fields, 1):
            for column, field in enumerate(row, 1):
                try:
                    float(field)
                except ValueError:
                    raise ValidationError(
                        f"CSV row {number}, column {column}: {field!r} is not a number"
                    ) from None
        raise


def parse_libsvm(body: bytes, dense: bool = False) -> Any:
    """A SciPy CSR matrix, one row per line (a leading label and `qid:` are ignored); `dense`: an
    array, 0 where absent (the container's script-mode decoder)."""
    import scipy.sparse

    text = _text(body, LIBSVM)
    if not text:
        raise ValidationError("request body is empty")
    lines = text.split("\n")
    rows: list[int] = []
    columns: list[int] = []
    values: list[float] = []
    for number, line in enumerate(lines, 1):
        for token in line.split():
            if ":" not in token or token.startswith("qid:"):
                continue
            index, _, value = token.partition(":")
            try:
                column, number_value = int(index), float(value)
            except ValueError:
                raise ValidationError(
                    f"LIBSVM line {number}: {token!r} is not index:value"
                ) from None
            if column < 0:
                raise ValidationError(f"LIBSVM line {number}: negative feature index in {token!r}")
            rows.append(number - 1)
            columns.append(column)
            values.append(number_value)
    cols = np.asarray(columns, dtype=np.int64)
    if cols.size and cols.min() >= 1:
        # 1-based, as LIBSVM files are written: the container shifts when no index 0 appears
        cols -= 1
    width = int(cols.max()) + 1 if cols.size else 0
    matrix = scipy.sparse.csr_matrix(
        (np.asarray(values, dtype=np.float64), (np.asarray(rows, dtype=np.int64), cols)),
        shape=(len(lines), width),
    )
    return matrix.toarray() if dense else matrix


def parse_json(body: bytes) -> np.ndarray:
    """Rows from a list of rows (a flat list is one row), `{"instances": rows}` / `{"inputs":
    rows}`, or the built-in algorithms' `{"instances": [{"features": [...]}, ...]}` / `{"features":
    [...]}`; null is missing."""
    data = codecs.decode(body, JSON)
    if isinstance(data, dict):
        key = next((k for k in ("instances", "inputs", "features") if k in data), None)
        if key is None:
            raise ValidationError(
                'JSON object input needs an "instances", "inputs" or "features" field'
            )
        data = [data[key]] if key == "features" else data[key]
    if isinstance(data, list) and data and all(isinstance(row, dict) for row in data):
        if not all("features" in row for row in data):
            raise ValidationError('every object in "instances" needs a "features" field')
        data = [row["features"] for row in data]
    try:
        array = np.array(data, dtype=np.float64)
    except (ValueError, TypeError) as error:
        raise ValidationError(
            f"JSON input is not a rectangular array of numbers: {error}"
        ) from None
    if array.ndim == 1:
        array = array.reshape(1, -1)
    if array.ndim != 2 or array.shape[0] == 0:
        raise ValidationError(f"JSON input must be rows of features; got shape {list(array.shape)}")
    return array


# --- responses ------------------------------------------------------------------------------------
def choose_output(accept: str, default: str) -> str:
    """The first Accept entry the container answers (`*/*` and `application/*` mean `default`)."""
    for entry in accept.split(","):
        kind = codecs.media_type(entry)
        if kind in OUTPUT_TYPES:
            return kind
        if kind in ("*/*", "application/*"):
            return default
    raise UnsupportedFormatError(
        f"unsupported Accept {accept!r}; the xgboost stack answers: {', '.join(OUTPUT_TYPES)}"
    )


def encode_scores(predictions: np.ndarray, kind: str) -> tuple[bytes, str]:
    """The container's plain answer: CSV rows, or `{"predictions": [{"score": ...}]}` (one object
    per line for JSON Lines, our extension: the container fails there without
    SAGEMAKER_INFERENCE_OUTPUT)."""
    values = predictions.tolist()
    if kind == CSV:
        return codecs.encode(values, CSV)
    scored = [{"score": value} for value in values]
    if kind == JSON_LINES:
        return "".join(json.dumps(item) + "\n" for item in scored).encode(), JSON_LINES
    return json.dumps({"predictions": scored}).encode(), JSON


# --- SAGEMAKER_INFERENCE_OUTPUT (serve_utils.get_selected_predictions) ----------------------------
REGRESSION = ("reg:squarederror", "reg:logistic", "reg:gamma", "reg:absoluteerror", "reg:tweedie")
SELECTABLE = {
    **{objective: ("predicted_score",) for objective in REGRESSION},
    "binary:logistic": (
        "predicted_label",
        "labels",
        "probability",
        "probabilities",
        "raw_score",
        "raw_scores",
    ),
    "binary:logitraw": ("predicted_label", "labels", "raw_score", "raw_scores"),
    "binary:hinge": ("predicted_label", "labels", "raw_score", "raw_scores"),
    "multi:softmax": ("predicted_label", "labels", "raw_score", "raw_scores"),
    "multi:softprob": (
        "predicted_label",
        "labels",
        "probability",
        "probabilities",
        "raw_score",
        "raw_scores",
    ),
}


FIELD_ORDER = (
    "predicted_label",
    "labels",
    "probability",
    "probabilities",
    "raw_score",
    "raw_scores",
    "predicted_score",
)

# One prediction's selected fields, by the names SAGEMAKER_INFERENCE_OUTPUT gives (a name the
# objective lacks is NaN): a label or score, or a list of labels, probabilities or scores.
SelectedRow = dict[str, int | float | list[int] | list[float]]


def selected_keys(value: str) -> list[str]:
    return value.replace(" ", "").lower().split(",")


def _field(key: str, objective: str, raw: Any, num_class: str) -> Any:
    """One selected field of one prediction (`raw`: a scalar, or a row of class probabilities)."""
    if key == "predicted_score":
        return raw.item()
    if key == "labels":
        return [0, 1] if objective.startswith("binary:") else list(range(int(num_class)))
    if objective == "multi:softprob":
        if key == "predicted_label":
            return int(np.argmax(raw))
        return raw.tolist() if key in ("probabilities", "raw_scores") else max(raw).item()
    if key == "predicted_label":
        if objective == "binary:logistic":
            return int(raw > 0.5)
        return int(raw > 0) if objective == "binary:logitraw" else raw.item()
    if key in ("probabilities", "raw_scores"):
        return [1.0 - raw.item(), raw.item()]
    return raw.item()  # probability, raw_score


def select(
    predictions: np.ndarray, keys: Sequence[str], objective: str, num_class: str
) -> list[SelectedRow]:
    """Each prediction's selected fields; a field the objective does not have is NaN, as the
    container sends it."""
    # the container's order
    valid = [key for key in FIELD_ORDER if key in keys and key in SELECTABLE[objective]]
    invalid = [key for key in dict.fromkeys(keys) if key not in valid]
    return [
        {
            **{key: _field(key, objective, raw, num_class) for key in valid},
            **dict.fromkeys(invalid, float("nan")),
        }
        for raw in predictions
    ]


def encode_selected(rows: list[SelectedRow], keys: Sequence[str], kind: str) -> tuple[bytes, str]:
    """`{"predictions": rows}`, JSON Lines, or CSV in the order of SAGEMAKER_INFERENCE_OUTPUT (a
    list as "[...]")."""
    if kind == JSON:
        return json.dumps({"predictions": rows}).encode(), JSON
    if kind == JSON_LINES:
        return "".join(json.dumps(row) + "\n" for row in rows).encode(), JSON_LINES
    lines = (
        ",".join(f'"{row[k]}"' if isinstance(row[k], list) else str(row[k]) for k in keys)
        for row in rows
    )
    return "\n".join(lines).encode(), CSV
