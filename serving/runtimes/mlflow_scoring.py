"""MLflow's scoring protocol, as `mlflow models serve` speaks it, and a signature as Open Inference
metadata.

Requests are parsed by mlflow's own scoring-server helpers (`mlflow.pyfunc.scoring_server`) with the
model's input schema: JSON with exactly one of `dataframe_split`, `dataframe_records`, `instances`,
`inputs` (plus `params`), or mlflow's unified LLM input (`messages`, `prompt`, ...); CSV; Parquet.
One addition: a bare JSON array, which mlflow refuses, is read as `{"inputs": array}` (an Open
Inference request of one tensor reaches the stack as one).
Answers are `{"predictions": ...}` (the LLM input: the bare predictions) as mlflow writes them. An
input mlflow refuses with a 4xx status is this server's ValidationError (400); a content type or
charset it refuses with 415 is UnsupportedFormatError (415).
"""

from __future__ import annotations

import inspect
import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.errors import UnsupportedFormatError, ValidationError
from serving.protocol import CSV, JSON
from serving.runtimes.codecs import MAX_JSON_DEPTH, _too_deep, media_type
from serving.runtimes.tensor_metadata import ModelTensors, TensorMetadata
from serving.runtimes.tensors import v2_datatype, v2_tensor

PARQUET = "application/vnd.apache.parquet"
CONTENT_TYPES = (JSON, CSV, PARQUET)
PREDICTIONS = "predictions"  # the answer's key, so the Open Inference output's name


@dataclass(frozen=True)
class ScoringInput:
    """A decoded request: the model's input, its `params`, and whether it came as mlflow's unified
    LLM input (answered without the `predictions` wrapper)."""

    data: Any
    params: dict[str, Any] | None = None
    unwrapped: bool = False


@dataclass(frozen=True)
class Scored:
    """A prediction and how its request wants it written."""

    predictions: Any
    unwrapped: bool = False


def _check_content_type(content_type: str | None) -> str:
    """The media type, refused as mlflow's server refuses it (415): another charset than UTF-8, a
    parameter other than charset, a type it does not read."""
    kind = media_type(content_type)
    parameters = {
        key.strip().lower(): value.strip().strip('"').lower()
        for key, _, value in (part.partition("=") for part in (content_type or "").split(";")[1:])
    }
    if parameters.get("charset", "utf-8") != "utf-8":
        raise UnsupportedFormatError("The scoring server only supports UTF-8")
    unknown = set(parameters) - {"charset"}
    if unknown:
        raise UnsupportedFormatError(
            f"Unrecognized content type parameters: {', '.join(sorted(unknown))}"
        )
    if kind not in CONTENT_TYPES:
        raise UnsupportedFormatError(
            f"This predictor only supports the following content types: {', '.join(CONTENT_TYPES)}. "
            f"Got {content_type or '(none)'!r}"
        )
    return kind


def decode(body: bytes, content_type: str | None, model: Any) -> ScoringInput:
    """A request body as the model's input, parsed against its signature's input schema."""
    from mlflow.exceptions import MlflowException
    from mlflow.pyfunc import scoring_server as server

    kind = _check_content_type(content_type)
    metadata = getattr(model, "metadata", None)
    schema = metadata.get_input_schema() if metadata is not None else None
    try:
        if kind == JSON:
            document = _json_object(body)
            try:
                parsed = server._parse_json_data(dict(document), metadata, schema)
            except MlflowException as error:
                raise client_error(error, _failing_column(document, schema)) from None
            return ScoringInput(parsed.data, parsed.params, parsed.is_unified_llm_input)
        if kind == CSV:
            frame = server.parse_csv_input(io.StringIO(_text(body)), schema=schema)  # type: ignore[arg-type]
            return ScoringInput(frame)
        return ScoringInput(server.parse_parquet_input(io.BytesIO(body)))
    except MlflowException as error:
        raise client_error(error) from None


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValidationError(
            f"Ensure that input is a valid UTF-8 encoded string. Error: '{error!r}'"
        ) from None


def _json_object(body: bytes) -> dict[str, Any]:
    """The body's JSON object, parsed once (mlflow's helpers take the dict); mlflow's messages."""
    from mlflow.pyfunc.scoring_server import REQUIRED_INPUT_FORMAT

    if _too_deep(body):
        raise ValidationError(f"the JSON body is nested more than {MAX_JSON_DEPTH} levels")
    try:
        document = json.loads(_text(body))
    except json.JSONDecodeError as error:
        raise ValidationError(
            f"Ensure that input is a valid JSON formatted string. Error: '{error!r}'"
        ) from None
    if isinstance(document, dict):
        return document
    if isinstance(document, list):
        # mlflow refuses a bare array; it is what an Open Inference request of one tensor becomes
        # (`open_inference.codec`), so it is read as TF Serving's `inputs`
        return {"inputs": document}
    raise ValidationError(
        f"{REQUIRED_INPUT_FORMAT}. Received unexpected input type '{type(document).__name__}'."
    )


def predict(model: Any, request: ScoringInput) -> Scored:
    """The model's prediction, `params` passed where its `predict` takes them (as mlflow's server
    does); a signature or params violation is ValidationError naming what is wrong."""
    from mlflow.exceptions import MlflowException

    try:
        if "params" in inspect.signature(model.predict).parameters:
            predictions = model.predict(request.data, params=request.params)
        else:
            predictions = model.predict(request.data)
    except MlflowException as error:
        raise client_error(error) from None
    return Scored(predictions, request.unwrapped)


def client_error(error: Any, column: str | None = None) -> Exception:
    """An MlflowException as this server's error: ValidationError where mlflow answers 4xx (the
    schema's failure without the request's data echoed back; `column`: the one it failed on, where
    mlflow's message does not say), else the exception itself."""
    if not 400 <= error.get_http_status_code() < 500:
        return error
    message = error.message
    if getattr(error, "error_class", None) == "SCHEMA_ENFORCEMENT_FAILED":
        # "Failed to enforce schema of data '<all rows>' with schema '<schema>'. Error: <why>"
        message = (
            "Failed to enforce the model's input schema: " + message.rpartition("'. Error: ")[2]
        )
    if column is not None and column not in message:
        message = f"column {column!r}: {message}"
    return ValidationError(message)


def _failing_column(document: dict[str, Any], schema: Any) -> str | None:
    """The first named column of an `inputs` / `instances` request whose values mlflow cannot
    convert to the schema's type (its parser's message names none)."""
    from mlflow.utils.proto_json_utils import convert_data_type

    if schema is None or not schema.has_input_names():
        return None
    given = document.get("inputs", document.get("instances"))
    if isinstance(given, dict):
        items = list(given.items())
    elif isinstance(given, list):
        items = [item for row in given if isinstance(row, dict) for item in row.items()]
    else:
        return None
    types = schema.input_dict()
    for column, value in items:
        try:
            convert_data_type(value, types.get(column))
        except Exception:
            return str(column)
    return None


def encode(prediction: Any) -> bytes:
    """`{"predictions": ...}` (or the bare predictions) as mlflow's server writes it."""
    from mlflow.pyfunc import scoring_server as server

    out = io.StringIO()
    if isinstance(prediction, Scored):
        if prediction.unwrapped:
            server.unwrapped_predictions_to_json(prediction.predictions, out)
        else:
            server.predictions_to_json(prediction.predictions, out)
    else:  # a script's predict_fn
        server.predictions_to_json(prediction, out)
    return out.getvalue().encode("utf-8")


def signature_tensors(metadata: Any) -> ModelTensors:
    """A signature as Open Inference metadata: a column-based input schema is one tensor per column
    (shape [-1], which a V2 request's named tensors fill as DataFrame columns), a tensor-based one
    its tensors; the one output is `predictions`, typed by the output schema where it has one
    column or tensor."""
    inputs_schema = metadata.get_input_schema() if metadata is not None else None
    inputs: list[TensorMetadata] = []
    if inputs_schema is not None:
        for index, spec in enumerate(inputs_schema.inputs):
            inputs.append(_tensor(spec, spec.name or f"input-{index}"))
    outputs_schema = metadata.get_output_schema() if metadata is not None else None
    output: TensorMetadata = {"name": PREDICTIONS, "datatype": "BYTES", "shape": [-1]}
    if outputs_schema is not None and len(outputs_schema.inputs) == 1:
        output = _tensor(outputs_schema.inputs[0], PREDICTIONS)
    return {"inputs": inputs, "outputs": [output]}


def _tensor(spec: Any, name: str) -> TensorMetadata:
    """One ColSpec or TensorSpec as a tensor; a column of a non-scalar type (array, object, map)
    is BYTES (its JSON)."""
    from mlflow.types.schema import DataType, TensorSpec

    if isinstance(spec, TensorSpec):
        return v2_tensor(name, spec.type, spec.shape)
    column_type = spec.type
    datatype = (
        v2_datatype(np.dtype(column_type.to_numpy()))
        if isinstance(column_type, DataType)
        else "BYTES"
    )
    return {"name": name, "datatype": datatype, "shape": [-1]}
