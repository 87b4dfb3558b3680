"""The huggingface stack (`runtimes.huggingface`): the Hugging Face toolkit's contract, TGI's token
stream and the OpenAI shapes a causal LM answers in, on a container's data port.

Driven over httpx's ASGI transport with the tiny models of `examples/train_transformers.py` (made
here, nothing downloaded); every expected answer is the tool's own in-process one (the pipeline's
call, `model.generate`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.model_server.app import build_container_app
from serving.runtimes.huggingface import HuggingFaceRuntime

pytestmark = pytest.mark.frameworks

JSON = "application/json"
CHAT = "application/vnd.serving.openai.chat+json"
COMPLETIONS = "application/vnd.serving.openai.completions+json"
PROMPTS = ["hello world", "the quick brown", "a model serves", "user: hello", "fox jumps", "good"]


@pytest.fixture(scope="module")
def models(transformers_models) -> dict[str, Path]:
    return transformers_models


@pytest.fixture(scope="module")
def lm(models) -> Any:
    runtime = HuggingFaceRuntime(models["tiny-lm"], {})
    runtime.load()
    yield runtime
    runtime.unload()


def generate(runtime: HuggingFaceRuntime, prompt_ids: list[int], max_new_tokens: int) -> str:
    """The tool's own greedy generation of `max_new_tokens`, decoded as the stack decodes."""
    import torch

    ids = torch.tensor([prompt_ids])
    pipe = runtime.model
    out = pipe.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
    )
    return pipe.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


async def post(app: Any, body: Any, kind: str = JSON, accept: str = JSON) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://c", timeout=60) as client:
        return await client.post(
            "/invocations",
            content=json.dumps(body).encode(),
            headers={"content-type": kind, "accept": accept},
        )


def run(app: Any, *requests: tuple[Any, str]) -> list[httpx.Response]:
    async def all_of() -> list[httpx.Response]:
        return list(await asyncio.gather(*(post(app, body, kind) for body, kind in requests)))

    return asyncio.run(all_of())


def events(response: httpx.Response) -> list[Any]:
    lines = [line for line in response.text.split("\n") if line.startswith("data:")]
    return [line[5:].strip() if "[DONE]" in line else json.loads(line[5:]) for line in lines]


# --- the toolkit's contract -----------------------------------------------------------------------
def test_a_classifier_answers_as_its_pipeline(models, loaded) -> None:
    runtime = loaded("huggingface", models["tiny-classifier"])
    assert runtime.model.task == "text-classification"  # from the config's architecture
    app = build_container_app(runtime, "clf")
    body = {"inputs": ["good movie", "awful day"], "parameters": {"top_k": 2}}
    (response,) = run(app, (body, JSON))
    assert response.status_code == 200, response.text
    want = runtime.model(["good movie", "awful day"], top_k=2)
    assert json.loads(response.content) == json.loads(json.dumps(want))


def test_an_inference_script_for_the_toolkit_loads_unchanged(models, handler_dir) -> None:
    # As written for SageMaker's Hugging Face containers: model_fn builds the pipeline itself.
    folder = handler_dir(
        """
        from transformers import pipeline

        def model_fn(model_dir):
            return pipeline("text-classification", model=model_dir)

        def predict_fn(data, model):
            return {"labels": [r["label"] for r in model(data["inputs"])]}
        """
    )
    for item in models["tiny-classifier"].iterdir():
        shutil.copy(item, folder / item.name)
    runtime = HuggingFaceRuntime(folder, {})
    runtime.load()
    (response,) = run(build_container_app(runtime, "clf"), ({"inputs": ["good", "bad"]}, JSON))
    assert response.status_code == 200, response.text
    want = [r["label"] for r in runtime.model(["good", "bad"])]
    assert json.loads(response.content) == {"labels": want}


def test_a_hub_id_is_refused(models) -> None:
    runtime = HuggingFaceRuntime(None, {"HF_MODEL_ID": "distilbert/distilbert-base-uncased"})
    with pytest.raises(ValueError, match="does not download from the Hugging Face Hub"):
        runtime.load()


def test_pickled_weights_need_the_opt_in(models, tmp_path) -> None:
    import torch
    from safetensors.torch import load_file

    # The same weights as a pickled state dict (what save_pretrained wrote before safetensors).
    pickled = tmp_path / "pickled"
    shutil.copytree(models["tiny-classifier"], pickled)
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    with pytest.raises(PermissionError, match="SERVING_ALLOW_PICKLE"):
        HuggingFaceRuntime(pickled, {}).load()
    opted_in = HuggingFaceRuntime(pickled, {"SERVING_ALLOW_PICKLE": "true"})
    opted_in.load()
    assert opted_in.model("good")[0]["label"] in ("POSITIVE", "NEGATIVE")


def test_a_models_own_code_needs_trust_remote_code(models, tmp_path) -> None:
    folder = tmp_path / "remote"
    shutil.copytree(models["tiny-lm"], folder)
    config = json.loads((folder / "config.json").read_text())
    # a model type transformers does not know, whose classes its own files define
    config["model_type"] = "mine"
    config["auto_map"] = {
        "AutoConfig": "modeling_mine.MyConfig",
        "AutoModelForCausalLM": "modeling_mine.MyModel",
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_mine.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(ValueError, match="trust_remote_code"):
        HuggingFaceRuntime(folder, {"HF_TASK": "text-generation"}).load()
    # with the operator's opt-in, the folder's code runs (and here, stops the load)
    trusted = HuggingFaceRuntime(
        folder, {"HF_TASK": "text-generation", "HF_TRUST_REMOTE_CODE": "true"}
    )
    with pytest.raises(SystemExit, match="remote code ran"):
        trusted.load()


# --- generation -----------------------------------------------------------------------------------
def test_a_tgi_stream_yields_the_greedy_text_token_by_token(lm) -> None:
    app = build_container_app(lm, "lm", threads=lm.prediction_threads())
    body = {"inputs": "hello world", "parameters": {"max_new_tokens": 12}, "stream": True}
    (response,) = run(app, (body, JSON))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    got = events(response)
    prompt = list(lm.model.tokenizer("hello world")["input_ids"])
    want = generate(lm, prompt, 12)
    assert len(got) == 12 and all(event["token"]["id"] >= 0 for event in got)
    assert [e["generated_text"] for e in got[:-1]] == [None] * 11
    assert got[-1]["generated_text"] == want
    assert got[-1]["details"] == {"finish_reason": "length", "generated_tokens": 12, "seed": None}


def test_a_seeded_sampled_stream_matches_generates_sampling(lm) -> None:
    # Sampling runs alone through `generate`, seeded as the request asks: the same text as the tool
    # sampling with the same seed, and again on a second request.
    import torch

    app = build_container_app(lm, "lm", threads=lm.prediction_threads())
    parameters = {
        "max_new_tokens": 10,
        "do_sample": True,
        "temperature": 0.8,
        "top_k": 20,
        "seed": 7,
    }
    body = {"inputs": "hello world", "parameters": parameters, "stream": True}
    first, second = run(app, (body, JSON)), run(app, (body, JSON))
    texts = [events(response)[-1]["generated_text"] for (response,) in (first, second)]
    ids = torch.tensor([list(lm.model.tokenizer("hello world")["input_ids"])])
    torch.manual_seed(7)
    out = lm.model.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=10,
        do_sample=True,
        temperature=0.8,
        top_k=20,
    )
    want = lm.model.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert texts == [want, want]
    assert events(first[0])[-1]["details"]["seed"] == 7


def test_stop_sequences_and_bad_parameters(lm) -> None:
    app = build_container_app(lm, "lm", threads=lm.prediction_threads())
    prompt = list(lm.model.tokenizer("hello world")["input_ids"])
    full = generate(lm, prompt, 12)
    stop = full[3:6]
    body = {"inputs": "hello world", "parameters": {"max_new_tokens": 12, "stop": [stop]}}
    bad = {"inputs": "hello world", "parameters": {"max_new_tokens": "many"}, "stream": True}
    stopped, refused = run(app, ({**body, "stream": True}, JSON), (bad, JSON))
    last = events(stopped)[-1]
    assert last["details"]["finish_reason"] == "stop_sequence"
    assert last["generated_text"] == full[: full.index(stop) + len(stop)]
    assert refused.status_code == 400 and "max_new_tokens" in refused.text


def test_openai_completions_whole_and_streamed_give_the_greedy_text(lm) -> None:
    app = build_container_app(lm, "lm", threads=lm.prediction_threads())
    request = {"model": "e.lm", "prompt": "the quick brown", "max_tokens": 10, "temperature": 0}
    whole, streamed = run(
        app,
        (request, COMPLETIONS),
        ({**request, "stream": True, "stream_options": {"include_usage": True}}, COMPLETIONS),
    )
    prompt = list(lm.model.tokenizer("the quick brown")["input_ids"])
    want = generate(lm, prompt, 10)
    answer = json.loads(whole.content)
    assert answer["object"] == "text_completion" and answer["choices"][0]["text"] == want
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": 10,
        "total_tokens": len(prompt) + 10,
    }
    got = events(streamed)
    assert got[-1] == "[DONE]" and got[-2]["usage"] == answer["usage"]
    assert "".join(e["choices"][0]["text"] for e in got[:-2]) == want


def test_openai_chat_uses_the_tokenizers_template(lm) -> None:
    app = build_container_app(lm, "lm", threads=lm.prediction_threads())
    messages = [{"role": "user", "content": "hello"}]
    request = {"model": "e.lm", "messages": messages, "max_tokens": 8, "temperature": 0}
    (response,) = run(app, (request, CHAT))
    tokenizer = lm.model.tokenizer
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    answer = json.loads(response.content)
    assert answer["choices"][0]["message"] == {
        "role": "assistant",
        "content": generate(lm, prompt, 8),
    }
    assert answer["usage"]["prompt_tokens"] == len(prompt)


def test_concurrent_streams_each_get_their_own_text(lm) -> None:
    # Eight streams decoding together in transformers' continuous batch: each caller's text is what
    # it would get alone.
    app = build_container_app(lm, "lm", threads=lm.prediction_threads())
    joined = lm.generator().joined_batch
    requests = [
        ({"model": "e.lm", "prompt": p, "max_tokens": 16, "stream": True}, COMPLETIONS)
        for p in PROMPTS + PROMPTS[:2]
    ]
    responses = run(app, *requests)
    for (request, _), response in zip(requests, responses):
        prompt = list(lm.model.tokenizer(request["prompt"])["input_ids"])
        text = "".join(e["choices"][0]["text"] for e in events(response)[:-1])
        assert text == generate(lm, prompt, 16), request["prompt"]
    assert lm.generator().joined_batch == joined + len(requests)  # not one at a time


def test_time_to_first_token_and_tokens_are_metric_events(models) -> None:
    from serving.model_server.events import EventLog

    runtime = HuggingFaceRuntime(models["tiny-lm"], {})
    runtime.events = EventLog()  # as the container process sets it
    runtime.load()
    try:
        app = build_container_app(runtime, "lm", threads=runtime.prediction_threads())
        body = {"model": "e.lm", "prompt": "hello", "max_tokens": 5, "stream": True}
        run(app, (body, COMPLETIONS), (body, COMPLETIONS))
        drained = runtime.events.drain()
    finally:
        runtime.unload()
    first = [event for event in drained if event[0] == "time_to_first_token"]
    tokens = [event for event in drained if event[0] == "output_tokens"]
    assert len(first) == 2 and all(0 < event[1] < 60 for event in first)
    assert [event[1] for event in tokens] == [5, 5] and all(event[2] > 0 for event in tokens)


def test_a_model_that_does_not_generate_refuses_openai_requests(models, loaded) -> None:
    runtime = loaded("huggingface", models["tiny-classifier"])
    request = {"model": "e.clf", "prompt": "hi", "max_tokens": 2}
    (response,) = run(build_container_app(runtime, "clf"), (request, COMPLETIONS))
    assert response.status_code == 400 and "does not generate text" in response.text
