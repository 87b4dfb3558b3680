"""A language model and a text classifier of the huggingface stack on real Ray Serve, reached the
ways their users reach them: boto3's InvokeEndpoint and InvokeEndpointWithResponseStream (TGI's
token events), and OpenAI's own Python client on the gateway's `/v1` routes, streamed and whole.

The endpoint has AccessControl: `batch-job` (a bearer ApiKey, as OpenAI clients send one) and
`team-b` (Signature V4) may invoke every container but `special-*`, so the OpenAI route is held to
the same per-container policy as InvokeEndpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import openai
import pytest
from botocore.config import Config
from suite.endpoint_server import TINY

pytestmark = pytest.mark.integration

ENDPOINT = "it-llm"
API_KEY = "batch-job-integration-api-key"  # suite.services.ACCESS_CALLERS["batch-job"]


def llm(transformers_models: dict[str, Path], identities_file: Path) -> dict:
    """it-llm: two copies of the tiny causal LM (one a policy refuses) and the classifier."""
    hf = lambda host, model: {  # noqa: E731
        "ContainerHostname": host,
        "Image": "huggingface",
        "ModelDataUrl": str(transformers_models[model]),
        "Resources": TINY,
    }
    return {
        "EndpointName": ENDPOINT,
        "AccessControl": {"IdentitiesFile": str(identities_file)},
        "Containers": [
            hf("common-lm", "tiny-lm"),
            hf("special-lm", "tiny-lm"),
            hf("common-clf", "tiny-classifier"),
        ],
    }


ENDPOINTS = {ENDPOINT: llm}  # what `server` deploys for this module, by builder


@pytest.fixture(scope="module")
def runtime(server, access_callers):
    team_b = access_callers["team-b"]
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id=team_b["AccessKeyId"],
        aws_secret_access_key=team_b["SecretAccessKey"],
        config=Config(retries={"max_attempts": 1}, read_timeout=60),
    )


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tool(transformers_models):
    """The models as their own tools run them, in this process."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    folder = transformers_models["tiny-lm"]
    return {
        "tokenizer": AutoTokenizer.from_pretrained(folder),
        "lm": AutoModelForCausalLM.from_pretrained(folder),
        "classifier": pipeline(
            "text-classification", model=str(transformers_models["tiny-classifier"])
        ),
    }


def greedy(tool, prompt_ids: list[int], max_new_tokens: int) -> str:
    import torch

    ids = torch.tensor([prompt_ids])
    out = tool["lm"].generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
    )
    return tool["tokenizer"].decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_the_classifier_answers_as_its_pipeline(runtime, tool) -> None:
    body = {"inputs": ["good movie", "awful day"]}
    response = runtime.invoke_endpoint(
        EndpointName=ENDPOINT,
        TargetContainerHostname="common-clf",
        ContentType="application/json",
        Body=json.dumps(body),
    )
    got = json.loads(response["Body"].read())
    assert got == json.loads(json.dumps(tool["classifier"](body["inputs"])))


def test_boto3_streams_tgi_token_events_with_the_greedy_text(runtime, tool) -> None:
    body = {"inputs": "hello world", "parameters": {"max_new_tokens": 12}, "stream": True}
    response = runtime.invoke_endpoint_with_response_stream(
        EndpointName=ENDPOINT,
        TargetContainerHostname="common-lm",
        ContentType="application/json",
        Body=json.dumps(body),
    )
    # As AWS's examples read a TGI stream: the lines of the parts, each from its first '{'.
    buffered, tokens = b"", []
    for event in response["Body"]:
        buffered += event["PayloadPart"]["Bytes"]
        *lines, buffered = buffered.split(b"\n")
        tokens += [json.loads(line[line.find(b"{") :]) for line in lines if b"{" in line]
    want = greedy(tool, tool["tokenizer"]("hello world")["input_ids"], 12)
    assert len(tokens) == 12
    assert "".join(t["token"]["text"] for t in tokens) == want == tokens[-1]["generated_text"]


def test_the_openai_client_gets_the_greedy_text_streamed_and_whole(client, tool) -> None:
    messages = [{"role": "user", "content": "hello"}]
    model = f"{ENDPOINT}.common-lm"
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=10, temperature=0
    )
    encoded = tool["tokenizer"].apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    prompt = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    want = greedy(tool, prompt, 10)
    assert whole.choices[0].message.content == want
    assert whole.usage.prompt_tokens == len(prompt) and whole.usage.completion_tokens == 10
    chunks = list(
        client.chat.completions.create(
            model=model, messages=messages, max_tokens=10, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].choices[0].finish_reason == "length"
    completion = client.completions.create(model=model, prompt="the quick brown", max_tokens=6)
    assert completion.choices[0].text == greedy(
        tool, tool["tokenizer"]("the quick brown")["input_ids"], 6
    )


def test_eight_concurrent_openai_streams_each_get_their_own_text(client, tool) -> None:
    # Through the gateway and the container's continuous batch: each caller's text is what greedy
    # generation gives its prompt alone.
    from concurrent.futures import ThreadPoolExecutor

    prompts = ["hello world", "the quick brown", "a model serves", "user: hello"] * 2

    def streamed(prompt: str) -> str:
        stream = client.completions.create(
            model=f"{ENDPOINT}.common-lm", prompt=prompt, max_tokens=16, temperature=0, stream=True
        )
        return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

    with ThreadPoolExecutor(len(prompts)) as pool:
        texts = list(pool.map(streamed, prompts))
    for prompt, text in zip(prompts, texts):
        assert text == greedy(tool, tool["tokenizer"](prompt)["input_ids"], 16), prompt


def test_a_policy_that_excludes_the_container_refuses_its_openai_route(client) -> None:
    with pytest.raises(openai.PermissionDeniedError) as refused:
        client.completions.create(model=f"{ENDPOINT}.special-lm", prompt="hi", max_tokens=2)
    assert "special-lm" in str(refused.value)
    anonymous = openai.OpenAI(base_url=client.base_url, api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.APIStatusError) as unknown:
        anonymous.completions.create(model=f"{ENDPOINT}.common-lm", prompt="hi", max_tokens=2)
    assert unknown.value.status_code in (401, 403)


def test_bad_requests_are_openai_errors_naming_the_field(client) -> None:
    with pytest.raises(openai.BadRequestError) as no_model:
        client.completions.create(model="no-dot", prompt="hi", max_tokens=2)
    assert "model" in str(no_model.value)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.completions.create(model=f"{ENDPOINT}.common-lm", prompt="hi", max_tokens=2, n=2)
    assert "'n'" in str(too_many.value)
