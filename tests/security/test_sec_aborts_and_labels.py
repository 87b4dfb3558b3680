"""Callers cannot move the server-error alert or invent metric series (finding 8, low).

An upload the client abandons is the client's doing: it is counted as a client abort, not as a 5XX,
and logs no traceback. A TargetModel becomes a metric label only once a container answered for it: a
request that times out has not shown that the model exists.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest
from sec_harness import (
    API_KEY,
    TARGET_MODEL,
    Stack,
    connect,
    request_head,
    sleepy_container,
)

from serving.metrics.invocations import REGISTRY


def sample(name: str, **labels: str) -> float:
    # InvokeEndpoint's calls (the label tells them from Open Inference's)
    if name == "serving_invocations_total":
        labels = {**labels, "protocol": "sagemaker-runtime"}
    return REGISTRY.get_sample_value(name, labels) or 0.0


def server_errors(endpoint: str) -> float:
    return sum(
        s.value
        for f in REGISTRY.collect()
        for s in f.samples
        if s.name == "serving_invocation_5xx_errors_total" and s.labels["endpoint"] == endpoint
    )


@pytest.fixture(scope="module")
def url(stack: Stack, identities: Path, table) -> str:
    return stack.gateway(identities, table)


@pytest.mark.parametrize(
    ("endpoint", "auth"), [("open", []), ("secure", [("Authorization", f"Bearer {API_KEY}")])]
)
def test_an_aborted_upload_is_a_client_abort(
    url: str, endpoint: str, auth: list, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    aborts, errors = (
        sample("serving_invocation_client_aborts_total", endpoint=endpoint),
        server_errors(endpoint),
    )
    with connect(url) as sock:
        path = f"/endpoints/{endpoint}/invocations"
        sock.sendall(
            request_head(
                url,
                path,
                [("Content-Type", "application/json"), ("Content-Length", "100000"), *auth],
            )
        )
        sock.sendall(b"[" + b"1," * 500)  # a tenth of the body, then the client goes away
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while (
        sample("serving_invocation_client_aborts_total", endpoint=endpoint) == aborts
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert sample("serving_invocation_client_aborts_total", endpoint=endpoint) == aborts + 1
    assert server_errors(endpoint) == errors
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
    # still serving
    assert httpx.post(url + path, json=[1], headers=dict(auth), timeout=10).status_code == 200


def test_a_timed_out_target_model_adds_no_series(
    stack: Stack, identities: Path, echo_url: str
) -> None:
    slow = stack.serve(sleepy_container(3.0))
    url = stack.gateway(identities, {("mm", "mm"): [slow]}, invocation_timeout_s=0.5)
    invented = "made-up-by-the-caller-7f3a"
    before = sample("serving_invocations_total", endpoint="mm", container="mm", model="")
    response = httpx.post(
        f"{url}/endpoints/mm/invocations", json=[1], headers={TARGET_MODEL: invented}, timeout=10
    )
    assert response.status_code == 424 and response.json()["OriginalStatusCode"] == 408
    labelled = [
        s for f in REGISTRY.collect() for s in f.samples if s.labels.get("model") == invented
    ]
    assert labelled == []
    assert (
        sample("serving_invocations_total", endpoint="mm", container="mm", model="") == before + 1
    )
    # A model that a container answered for is labelled as before.
    answered = stack.gateway(identities, {("mm", "mm"): [echo_url]})
    response = httpx.post(
        f"{answered}/endpoints/mm/invocations",
        json=[1],
        headers={TARGET_MODEL: "answered-model"},
        timeout=10,
    )
    assert response.status_code == 200
    assert (
        sample("serving_invocations_total", endpoint="mm", container="mm", model="answered-model")
        == 1
    )


def test_a_model_that_raises_is_labelled_an_unknown_one_is_not(
    stack: Stack, identities: Path, tmp_path: Path
) -> None:
    # The MultiModel container says when it resolved the TargetModel to a model
    # (X-Serving-Model-Resolved): a real model's own failure is labelled with its name, a name that
    # is no model is not.
    from serving.model_server.app import build_container_app
    from serving.models.multimodel import MultiModelHandler

    model = tmp_path / "prefix" / "raises" / "code"
    model.mkdir(parents=True)
    (model / "inference.py").write_text(
        "def predict_fn(data, model):\n    raise RuntimeError('this model fails')\n"
    )
    handler = MultiModelHandler("python", str(tmp_path / "prefix"), {}, hostname="mm")
    try:
        container = stack.serve(build_container_app(None, "mm", models=handler))
        url = stack.gateway(identities, {("mm", "mm"): [container]})
        failed = httpx.post(
            f"{url}/endpoints/mm/invocations",
            json=[1],
            headers={TARGET_MODEL: "raises"},
            timeout=30,
        )
        assert failed.status_code == 424
        assert (
            sample("serving_invocations_total", endpoint="mm", container="mm", model="raises") == 1
        )
        unknown = httpx.post(
            f"{url}/endpoints/mm/invocations",
            json=[1],
            headers={TARGET_MODEL: "no-such-model"},
            timeout=30,
        )
        assert unknown.status_code == 400
        assert (
            sample(
                "serving_invocations_total", endpoint="mm", container="mm", model="no-such-model"
            )
            == 0
        )
    finally:
        handler.close()
