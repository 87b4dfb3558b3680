"""What a generating container sends: SageMaker's LLM-container stream and the OpenAI API's shapes.

- TGI's stream (`"stream": true` in an InvokeEndpointWithResponseStream body, as SageMaker's Hugging
  Face LLM containers take it): one server-sent event per token, `data:{"index", "token": {"id",
  "text", "logprob", "special"}, "generated_text", "details"}`, the last carrying the whole text and
  `details.finish_reason`.
- OpenAI's `chat.completion` / `text_completion` objects, whole or as `chunk` events ending in
  `data: [DONE]`, with `usage` counted in tokens.

Each `*_events` function turns a request's tokens into the bytes of its events, as they come.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import orjson

from serving import protocol
from serving.runtimes.text_generation import Completion, Tokens

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "OPENAI_TYPES",
    "openai_events",
    "openai_whole",
    "tgi_events",
]

CHAT, COMPLETIONS = protocol.OPENAI_CHAT, protocol.OPENAI_COMPLETIONS
OPENAI_TYPES = (CHAT, COMPLETIONS)
EVENT_STREAM = protocol.SERVER_SENT_EVENTS


def _event(document: Any, space: bool = True) -> bytes:
    return (b"data: " if space else b"data:") + orjson.dumps(document) + b"\n\n"


def tgi_events(tokens: Tokens, completion: Completion, tokenizer: Any) -> Iterator[bytes]:
    """TGI's events: one per token, the last with the generated text and why it ended."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    index = 0
    with closing(tokens):
        for token in tokens:
            index += 1
            text = completion.add(token)
            done = completion.finish_reason is not None
            yield _event(
                {
                    "index": index,
                    "token": {
                        "id": token,
                        "text": text,
                        "logprob": None,
                        "special": token in special,
                    },
                    "generated_text": completion.text if done else None,
                    "details": _details(completion) if done else None,
                },
                space=False,
            )
            if done:
                return
    # the model stopped without saying why (a cancelled batch): end the stream as TGI would
    completion.finish("eos_token")
    yield _event(
        {
            "index": index + 1,
            "token": {"id": -1, "text": "", "logprob": None, "special": True},
            "generated_text": completion.text,
            "details": _details(completion),
        },
        space=False,
    )


def _details(completion: Completion) -> dict[str, Any]:
    return {
        "finish_reason": completion.finish_reason,
        "generated_tokens": len(completion.tokens),
        "seed": completion.seed,
    }


def _openai_reason(completion: Completion) -> str:
    return "length" if completion.finish_reason == "length" else "stop"


def _usage(completion: Completion) -> dict[str, int]:
    generated = len(completion.tokens)
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": completion.prompt_tokens + generated,
    }


def run_to_end(tokens: Tokens, completion: Completion) -> None:
    """Take every token (until a stop sequence, the end token or the limit): a whole answer."""
    with closing(tokens):
        for token in tokens:
            completion.add(token)
            if completion.finish_reason is not None:
                return
    completion.finish("eos_token")


def openai_whole(kind: str, model: str, tokens: Tokens, completion: Completion) -> bytes:
    """The whole `chat.completion` or `text_completion` object."""
    run_to_end(tokens, completion)
    text, reason = completion.visible(), _openai_reason(completion)
    if kind == CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": reason,
            "logprobs": None,
        }
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion"}
    else:
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion"}
    return orjson.dumps(
        {
            **head,
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": _usage(completion),
        }
    )


def openai_events(
    kind: str, model: str, tokens: Tokens, completion: Completion, include_usage: bool
) -> Iterator[bytes]:
    """The `chunk` events of a streamed answer, then `[DONE]` (with `usage` first when asked)."""
    chat = kind == CHAT
    head = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(text: str | None, reason: str | None, first: bool = False) -> bytes:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}
        return _event({**head, "choices": [choice]})

    if chat:
        yield chunk(None, None, first=True)
    given = 0
    with closing(tokens):
        for token in tokens:
            completion.add(token)
            done = completion.finish_reason is not None
            ready = len(completion.visible()) if done else completion.safe_prefix()
            if ready > given:
                yield chunk(completion.text[given:ready], None)
                given = ready
            if done:
                break
        else:
            completion.finish("eos_token")
    rest = completion.visible()[given:]
    if rest:
        yield chunk(rest, None)
    yield chunk(None, _openai_reason(completion))
    if include_usage:
        yield _event({**head, "choices": [], "usage": _usage(completion)})
    yield b"data: [DONE]\n\n"
