"""Token-by-token generation for the huggingface stack's causal language models.

Every streamed request (SageMaker's TGI-style stream, the OpenAI-compatible routes) asks this module
for its new tokens one at a time. Greedy requests join `transformers`' own continuous batching (its
`ContinuousBatchingManager`): a request enters the running batch at the next decoding step and
leaves it when done, so concurrent streams share each forward pass. A request the manager cannot
take as it is (sampling, a seed, a repetition penalty) runs alone through `model.generate` with a
streamer, on its own thread; seeded requests one at a time, since torch's generator is global.

Stop sequences, text assembly and the finish reason are the same for both paths (`Completion`).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from serving import protocol
from serving.errors import ValidationError

__all__ = ["Completion", "GenerationSettings", "TextGenerator", "Tokens", "settings_from"]

Tokens = Generator[int, None, None]  # a request's new token ids; closing it cancels the request

# what a request may ask for at most (SERVING_HF_MAX_NEW_TOKENS raises or lowers it)
DEFAULT_MAX_NEW_TOKENS = 100  # TGI's default when a request names none
MAX_NEW_TOKENS_ENV = protocol.HF_MAX_NEW_TOKENS_ENV
CONTINUOUS_BATCHING_ENV = protocol.HF_CONTINUOUS_BATCHING_ENV
MAX_BATCH_ENV = protocol.HF_MAX_BATCH_ENV
DEFAULT_MAX_BATCH = 32
_FINISHED = object()


@dataclass(frozen=True)
class GenerationSettings:
    """One request's generation, as TGI's `parameters` or OpenAI's fields name it."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    do_sample: bool | None = None  # None: the model's generation_config decides
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def sampling(self, model_default: bool) -> bool:
        return model_default if self.do_sample is None else self.do_sample


def _number(parameters: Mapping[str, Any], name: str, kind: type, low: float) -> Any:
    value = parameters.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(f"parameter {name!r} must be a number, got {value!r}")
    if kind is int and int(value) != value:
        raise ValidationError(f"parameter {name!r} must be a whole number, got {value!r}")
    if value < low:
        raise ValidationError(f"parameter {name!r} must be at least {low}, got {value!r}")
    return kind(value)


def settings_from(
    parameters: Mapping[str, Any], cap: int, max_tokens_names: tuple[str, ...] = ("max_new_tokens",)
) -> GenerationSettings:
    """A request's settings, each checked (a 400 naming the parameter); `cap` bounds the tokens."""
    wanted = None
    for name in max_tokens_names:
        wanted = _number(parameters, name, int, 1)
        if wanted is not None:
            if wanted > cap:
                raise ValidationError(f"parameter {name!r} is over this container's {cap} tokens")
            break
    stop = parameters.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise ValidationError("parameter 'stop' must be a string or a list of non-empty strings")
    do_sample = parameters.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValidationError(f"parameter 'do_sample' must be true or false, got {do_sample!r}")
    temperature = _number(parameters, "temperature", float, 0)
    if temperature == 0:  # OpenAI's and TGI's way of asking for greedy decoding
        do_sample, temperature = False, None
    elif temperature is not None and do_sample is None:
        do_sample = True
    return GenerationSettings(
        max_new_tokens=wanted if wanted is not None else min(DEFAULT_MAX_NEW_TOKENS, cap),
        do_sample=do_sample,
        temperature=temperature,
        top_p=_number(parameters, "top_p", float, 0),
        top_k=_number(parameters, "top_k", int, 1),
        repetition_penalty=_number(parameters, "repetition_penalty", float, 0),
        seed=_number(parameters, "seed", int, 0),
        stop=tuple(stop),
    )


@dataclass
class Completion:
    """What one request has generated so far: its tokens, its text, and why it ended."""

    tokenizer: Any
    prompt_tokens: int
    stop: tuple[str, ...] = ()
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    eos: tuple[int, ...] = ()
    seed: int | None = None
    events: Any = None  # time_to_first_token / output_tokens reported here (an EventLog)
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    tokens: list[int] = field(default_factory=list)
    text: str = ""  # the text given out so far (never a partial UTF-8 character)
    finish_reason: str | None = None  # "length", "eos_token" or "stop_sequence" (TGI's names)

    def add(self, token: int) -> str:
        """Take a new token: the text it adds (empty while a character is incomplete); sets the
        finish reason when it is the last."""
        self.tokens.append(token)
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
            if self.events is not None:
                self.events.time_to_first_token(self.first_token_at - self.started)
        if token in self.eos:
            self.finish("eos_token")
        elif len(self.tokens) >= self.max_new_tokens:
            self.finish("length")
        full = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if full.endswith("\ufffd") and self.finish_reason is None:
            return ""  # a byte-level token that ends mid-character: wait for the rest
        for stop in self.stop:
            at = full.find(stop, max(0, len(self.text) - len(stop)))
            if at >= 0:  # TGI keeps the stop sequence in its text; OpenAI cuts it (`visible`)
                full = full[: at + len(stop)]
                if self.finish_reason is None:
                    self.finish("stop_sequence")
                else:  # it was the last token anyway: the stop sequence is the reason
                    self.finish_reason = "stop_sequence"
                break
        added, self.text = full[len(self.text) :], full
        return added

    def finish(self, reason: str) -> None:
        """The request ended (once): its reason, and its tokens' timing reported."""
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        if self.events is not None and self.first_token_at is not None:
            self.events.output_tokens(len(self.tokens), time.perf_counter() - self.first_token_at)

    def visible(self) -> str:
        """The text without a stop sequence it ended on (OpenAI's rule)."""
        if self.finish_reason == "stop_sequence":
            for stop in self.stop:
                if self.text.endswith(stop):
                    return self.text[: -len(stop)]
        return self.text

    def safe_prefix(self) -> int:
        """How much of the text can be given out while a stop sequence may still be forming."""
        if self.finish_reason is not None or not self.stop:
            return len(self.text)
        return max(0, len(self.text) - max(len(s) for s in self.stop) + 1)


class TextGenerator:
    """A causal LM's new tokens for each request: batched continuously where the request allows."""

    def __init__(
        self, model: Any, tokenizer: Any, environment: Mapping[str, str], events: Any = None
    ) -> None:
        self.model = model
        self.events = events
        self.tokenizer = tokenizer
        self.eos = _eos_ids(model, tokenizer)
        self.max_batch = _whole(environment, MAX_BATCH_ENV, DEFAULT_MAX_BATCH)
        self.cap = _whole(environment, MAX_NEW_TOKENS_ENV, 2048)
        self.continuous = environment.get(CONTINUOUS_BATCHING_ENV, "true").lower() != "false"
        self.default_sampling = bool(getattr(model.generation_config, "do_sample", False))
        self._manager: Any = None
        self._started = threading.Lock()
        self._queues: dict[str, queue.SimpleQueue[Any]] = {}
        self._ids = itertools.count()
        self._seeded = threading.Lock()
        self.joined_batch = 0  # requests that decoded in the continuous batch (the tests read it)

    def completion(self, prompt: list[int], settings: GenerationSettings) -> Completion:
        """A request's running account of what it generated."""
        return Completion(
            self.tokenizer,
            len(prompt),
            settings.stop,
            settings.max_new_tokens,
            tuple(self.eos),
            settings.seed,
            self.events,
        )

    # --- the two paths ----------------------------------------------------------------------------
    def tokens(self, prompt: list[int], settings: GenerationSettings) -> Tokens:
        """The request's new token ids as they are decoded; closing the iterator cancels it."""
        batchable = (
            self.continuous
            and not settings.sampling(self.default_sampling)
            and settings.seed is None
            and settings.repetition_penalty is None
        )
        return self._batched(prompt, settings) if batchable else self._alone(prompt, settings)

    def _batched(self, prompt: list[int], settings: GenerationSettings) -> Tokens:
        manager = self._start()
        request_id = f"serving-{next(self._ids)}"
        self.joined_batch += 1
        results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._queues[request_id] = results
        manager.add_request(
            prompt,
            request_id=request_id,
            max_new_tokens=settings.max_new_tokens,
            streaming=True,
            eos_token_id=self.eos,
        )
        given = 0
        finished = False
        try:
            while not finished:
                output = results.get()
                if output is _FINISHED or output.error:
                    raise RuntimeError(
                        f"generation failed: {getattr(output, 'error', 'the batch stopped')}"
                    )
                finished = output.is_finished()
                generated = output.generated_tokens
                yield from generated[given:]
                given = len(generated)
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                manager.cancel_request(request_id)

    def _alone(self, prompt: list[int], settings: GenerationSettings) -> Tokens:
        import torch
        from transformers.generation.streamers import BaseStreamer

        out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        cancelled = threading.Event()

        class Streamed(BaseStreamer):
            first = True

            def put(self, value: Any) -> None:
                if self.first:  # generate hands the prompt over first
                    self.first = False
                    return
                for token in value.reshape(-1).tolist():
                    out.put(token)

            def end(self) -> None:
                out.put(_FINISHED)

        class Cancel:
            def __call__(self, *args: Any, **kwargs: Any) -> bool:
                return cancelled.is_set()

        sample = settings.sampling(self.default_sampling)
        options: dict[str, Any] = {
            "max_new_tokens": settings.max_new_tokens,
            "do_sample": sample,
            "eos_token_id": self.eos,
            "pad_token_id": self.tokenizer.pad_token_id or self.eos[0],
            "streamer": Streamed(),
            "stopping_criteria": [Cancel()],
        }
        for name in ("temperature", "top_p", "top_k", "repetition_penalty"):
            value = getattr(settings, name)
            if value is not None and (sample or name == "repetition_penalty"):
                options[name] = value
        ids = torch.tensor([prompt])
        failure: list[BaseException] = []

        def run() -> None:
            try:
                with torch.no_grad():
                    if settings.seed is None:
                        self.model.generate(ids, attention_mask=torch.ones_like(ids), **options)
                        return
                    with self._seeded:  # torch's generator is global: one seeded run at a time
                        torch.manual_seed(settings.seed)
                        self.model.generate(ids, attention_mask=torch.ones_like(ids), **options)
            except BaseException as error:  # handed to the reader, which raises it
                failure.append(error)
                out.put(_FINISHED)

        worker = threading.Thread(target=run, name="serving-generate", daemon=True)
        worker.start()
        try:
            while (token := out.get()) is not _FINISHED:
                yield token
            if failure:
                raise failure[0]
        finally:
            cancelled.set()

    # --- the batch --------------------------------------------------------------------------------
    def _start(self) -> Any:
        """The continuous-batching manager, started on first use, and the thread that hands each
        request its outputs."""
        with self._started:
            if self._manager is None:
                from transformers import GenerationConfig
                from transformers.generation.configuration_utils import ContinuousBatchingConfig

                config = GenerationConfig(
                    do_sample=False,
                    max_new_tokens=self.cap,
                    eos_token_id=self.eos,
                    pad_token_id=self.tokenizer.pad_token_id or self.eos[0],
                )
                # A cache sized from the model's limits, not from the machine's free memory (the
                # manager's default): pages for every request of a full batch.
                positions = int(getattr(self.model.config, "max_position_embeddings", 2048))
                page = 64
                batching = ContinuousBatchingConfig(
                    page_size=page,
                    num_blocks=self.max_batch * max(1, -(-positions // page)),
                    max_batch_tokens=max(256, positions),
                    max_requests_per_batch=self.max_batch,
                )
                manager = self.model.init_continuous_batching(
                    generation_config=config, continuous_batching_config=batching
                )
                manager.start()
                threading.Thread(
                    target=self._deliver, args=(manager,), name="serving-batch-out", daemon=True
                ).start()
                self._manager = manager
            return self._manager

    def _deliver(self, manager: Any) -> None:
        while manager.is_running():
            output = manager.get_result(timeout=0.5)
            if output is None:
                continue
            target = self._queues.get(output.request_id)
            if target is not None:
                target.put(output)
        for target in list(self._queues.values()):  # the batch stopped: nobody waits forever
            target.put(_FINISHED)

    def stop(self) -> None:
        if self._manager is not None:
            self._manager.stop(block=True, timeout=10)
            self._manager = None


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    configured = getattr(model.generation_config, "eos_token_id", None)
    if configured is None:
        configured = tokenizer.eos_token_id
    if configured is None:
        return [-1]
    return list(configured) if isinstance(configured, (list, tuple)) else [int(configured)]


def _whole(environment: Mapping[str, str], name: str, default: int) -> int:
    text = environment.get(name)
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {text!r}")
    return int(text)
