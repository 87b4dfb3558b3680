"""huggingface stack: a `transformers` model directory served as a `pipeline`, by the Hugging Face
SageMaker inference toolkit's contract, and its causal language models generating token by token.

- Loading: the model directory (or `HF_MODEL_ID` when it names a local folder: there is no model hub
  here, and a hub id is refused) into `pipeline(HF_TASK)`, the task read from the config's
  architecture when `HF_TASK` is unset, as the toolkit does. Weights only from safetensors unless
  `SERVING_ALLOW_PICKLE`; a model's own code (`trust_remote_code`) only with
  `HF_TRUST_REMOTE_CODE=true`.
- Requests: JSON `{"inputs": ..., "parameters": {...}}` (or CSV) in, the pipeline's answer as JSON
  out; `code/inference.py`'s `model_fn`, `input_fn`, `predict_fn`, `output_fn` or `transform_fn`
  replace those steps as the toolkit's handler service lets them.
- Generation (`text_generation`, `llm_wire`): a JSON body with `"stream": true` streams TGI's token
  events; the gateway's OpenAI-compatible routes send OpenAI requests in their own content types.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from serving import protocol
from serving.errors import ValidationError
from serving.protocol import ALLOW_PICKLE_ENV, GPUS_ENV, MODEL_THREADS_ENV
from serving.runtimes import codecs, llm_wire, toolkit
from serving.runtimes.base import InvocationContext, Runtime
from serving.runtimes.text_generation import GenerationSettings, TextGenerator, settings_from

# No model hub: a pipeline never reaches for one, even when a config names a hub repository.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TASK_ENV, MODEL_ID_ENV = protocol.HF_TASK_ENV, protocol.HF_MODEL_ID_ENV
TRUST_REMOTE_CODE_ENV = protocol.HF_TRUST_REMOTE_CODE_ENV
GENERATION_TASK = "text-generation"
# The toolkit's infer_task_from_model_architecture, by the architecture's suffix.
TASK_OF_ARCHITECTURE = (
    ("ForCausalLM", GENERATION_TASK),
    ("LMHeadModel", GENERATION_TASK),
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMaskedLM", "fill-mask"),
    ("ForConditionalGeneration", "text2text-generation"),
    ("ForImageClassification", "image-classification"),
    ("Model", "feature-extraction"),
)
PICKLED_WEIGHTS = ("pytorch_model.bin", "tf_model.h5", "model.ckpt.index", "flax_model.msgpack")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


class HuggingFaceRuntime(Runtime):
    """Serves one `transformers` pipeline; a causal LM also streams and batches its generation."""

    name = "huggingface"
    frameworks = ("transformers",)

    def __init__(self, model_dir: Path | None, environment: Any) -> None:
        super().__init__(model_dir, environment)
        self._generator: TextGenerator | None = None

    # --- loading ----------------------------------------------------------------------------------
    def source(self) -> Path:
        """The folder the model loads from: HF_MODEL_ID if it names a local folder, else the model
        directory."""
        named = self.environment.get(MODEL_ID_ENV)
        if named:
            if not Path(named).is_dir():
                raise ValueError(
                    f"{MODEL_ID_ENV} {named!r} is not a local folder: this runtime does not download"
                    " from the Hugging Face Hub; put the model in ModelDataUrl (or a folder the"
                    " container can read) and name that"
                )
            return Path(named)
        if self.model_dir is None:
            raise FileNotFoundError(f"the huggingface stack needs ModelDataUrl or {MODEL_ID_ENV}")
        return self.model_dir

    def task(self) -> str:
        """HF_TASK, else the task of the config's architecture (the toolkit's rule)."""
        task = self.environment.get(TASK_ENV)
        if task:
            return task
        config = self.source() / "config.json"
        if not config.is_file():
            raise ValueError(f"set {TASK_ENV}: the model has no config.json to infer a task from")
        architectures = json.loads(config.read_text()).get("architectures") or []
        for architecture in architectures:
            for suffix, inferred in TASK_OF_ARCHITECTURE:
                if architecture.endswith(suffix):
                    return inferred
        raise ValueError(f"set {TASK_ENV}: no task is known for architectures {architectures}")

    def model_fn(self, model_dir: Path | None) -> Any:
        source = self.source()
        allow_pickle = _truthy(self.environment.get(ALLOW_PICKLE_ENV))
        pickled = [name for name in PICKLED_WEIGHTS if (source / name).exists()]
        if not allow_pickle and pickled and not list(source.glob("*.safetensors")):
            raise PermissionError(
                f"refusing to load {pickled[0]}: pickled weights run arbitrary code. Save the model"
                f" with safetensors, or set Environment {ALLOW_PICKLE_ENV}: 'true' if you trust it"
            )
        from transformers import pipeline

        build: Any = pipeline  # the task is a string from the environment, not a Literal
        return build(
            self.task(),
            model=str(source),
            device=-1 if not float(self.environment.get(GPUS_ENV) or 0) else 0,
            trust_remote_code=_truthy(self.environment.get(TRUST_REMOTE_CODE_ENV)),
            model_kwargs={"use_safetensors": None if allow_pickle else True},
        )

    def unload(self) -> None:
        if self._generator is not None:
            self._generator.stop()
            self._generator = None
        super().unload()

    def prediction_threads(self) -> int:
        """A generating model holds one thread per open stream: as many as decode together."""
        if self.model is not None and self._generates() and not self.runs_request_hooks():
            if MODEL_THREADS_ENV not in self.environment:
                return self.generator().max_batch
        return super().prediction_threads()

    # --- the toolkit's steps ----------------------------------------------------------------------
    def input_fn(self, body: bytes, content_type: str | None) -> Any:
        """decoder_encoder.decode: JSON as it is; CSV as `{"inputs": [row, ...]}`."""
        kind = codecs.media_type(content_type)
        data = toolkit.request_data(body, kind)
        text = data if isinstance(data, str) else bytes(data).decode("utf-8", "replace")
        if kind == toolkit.JSON:
            try:
                return json.loads(text)
            except ValueError as error:
                raise ValidationError(f"request body is not valid JSON: {error}") from None
        if kind == toolkit.CSV:
            rows = list(csv.DictReader(io.StringIO(text)))
            if rows and "inputs" in rows[0]:
                return {"inputs": [row["inputs"] for row in rows]}
            return {"inputs": rows}
        raise ValidationError(
            f"content type {content_type} is not supported: send application/json"
        )

    def predict_fn(self, data: Any, model: Any) -> Any:
        """The handler service's predict: `inputs` and `parameters` popped, the pipeline called."""
        if not isinstance(data, dict):
            return model(data)
        inputs = data.pop("inputs", data)
        parameters = data.pop("parameters", None)
        return model(inputs, **parameters) if parameters is not None else model(inputs)

    def output_fn(self, prediction: Any, accept: str | None) -> tuple[bytes, str]:
        """decoder_encoder.encode: JSON (NumPy values as lists), or CSV of the answer's rows."""
        if codecs.media_type(accept) == toolkit.CSV:
            rows = prediction if isinstance(prediction, list) else [prediction]
            buffer = io.StringIO()
            writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else [])
            writer.writeheader()
            writer.writerows(rows)
            return buffer.getvalue().encode(), toolkit.CSV
        return orjson.dumps(prediction, option=orjson.OPT_SERIALIZE_NUMPY), toolkit.JSON

    def choose_accept(self, accept: str) -> str:
        kind = codecs.media_type(accept)
        if kind in (toolkit.JSON, toolkit.CSV):
            return kind
        raise ValidationError(f"Accept {accept} is not supported: ask for application/json")

    # --- generation -------------------------------------------------------------------------------
    def _generates(self) -> bool:
        return getattr(self.model, "task", None) == GENERATION_TASK

    def generator(self) -> TextGenerator:
        if self._generator is None:
            self._generator = TextGenerator(
                self.model.model, self.model.tokenizer, self.environment, self.events
            )
        return self._generator

    def invoke_chunks(
        self, body: bytes, content_type: str | None, accept: str | None, context: InvocationContext
    ) -> tuple[Iterator[bytes], str]:
        """OpenAI requests and TGI-style streams generate here; everything else is the toolkit's."""
        kind = codecs.media_type(content_type)
        if kind in llm_wire.OPENAI_TYPES:
            return self._openai(kind, body)
        if kind == toolkit.JSON and b'"stream"' in body and self._streams_here():
            document = self.input_fn(body, kind)
            if isinstance(document, dict) and document.get("stream") is True:
                return self._tgi(document)
        return super().invoke_chunks(body, content_type, accept, context)

    def _streams_here(self) -> bool:
        """A text-generation pipeline whose steps are the stack's own (a script's steps stay the
        script's)."""
        return self._generates() and not (
            {"input_fn", "predict_fn", "transform_fn"} & set(self._hooks)
        )

    def _refuse_unless_generating(self) -> None:
        if not self._generates():
            raise ValidationError(
                f"this container's model does not generate text (its task is "
                f"{getattr(self.model, 'task', None)!r}, not {GENERATION_TASK!r})"
            )

    def _tgi(self, document: dict[str, Any]) -> tuple[Iterator[bytes], str]:
        inputs = document.get("inputs")
        if not isinstance(inputs, str):
            raise ValidationError("a streamed request's 'inputs' must be one string")
        parameters = document.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ValidationError("'parameters' must be an object")
        generator = self.generator()
        settings = settings_from(parameters, generator.cap)
        prompt = list(self.model.tokenizer(inputs)["input_ids"])
        tokens = generator.tokens(prompt, settings)
        completion = generator.completion(prompt, settings)
        return llm_wire.tgi_events(tokens, completion, self.model.tokenizer), llm_wire.EVENT_STREAM

    def _openai(self, kind: str, body: bytes) -> tuple[Iterator[bytes], str]:
        self._refuse_unless_generating()
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise ValidationError(f"request body is not valid JSON: {error}") from None
        if not isinstance(request, dict):
            raise ValidationError("request body must be a JSON object")
        if request.get("n", 1) != 1:
            raise ValidationError("parameter 'n': this server generates one choice per request")
        generator = self.generator()
        settings = settings_from(request, generator.cap, ("max_completion_tokens", "max_tokens"))
        prompt = self._openai_prompt(kind, request)
        tokens = generator.tokens(prompt, settings)
        completion = generator.completion(prompt, settings)
        model = str(request.get("model", ""))
        if request.get("stream") is True:
            options = request.get("stream_options") or {}
            usage = isinstance(options, dict) and options.get("include_usage") is True
            events = llm_wire.openai_events(kind, model, tokens, completion, usage)
            return events, llm_wire.EVENT_STREAM
        return iter((llm_wire.openai_whole(kind, model, tokens, completion),)), toolkit.JSON

    def _openai_prompt(self, kind: str, request: dict[str, Any]) -> list[int]:
        tokenizer = self.model.tokenizer
        if kind == llm_wire.CHAT:
            messages = request.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValidationError("parameter 'messages' must be a non-empty list")
            if not getattr(tokenizer, "chat_template", None):
                raise ValidationError(
                    "this model's tokenizer has no chat template: use /v1/completions"
                )
            encoded = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
            ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
            return [int(token) for token in ids]
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ValidationError("parameter 'prompt' must be one string")
        return list(tokenizer(prompt)["input_ids"])


__all__ = ["GenerationSettings", "HuggingFaceRuntime"]
