"""Hop signatures (serving.trust.hops) and the keys they use (serving.trust.keys): what a container
accepts."""

from __future__ import annotations

import pytest

from serving import protocol
from serving.trust import hops, keys

ROOT = b"r" * 32
BODY = b'{"x": 1}'
HEADERS = {"Content-Type": "application/json", protocol.TARGET_MODEL: "a.tar.gz"}


def test_keys_differ_per_container_endpoint_and_root() -> None:
    key = keys.hop_key(ROOT, "e", "c")
    assert len(key) == 32
    assert key != keys.hop_key(ROOT, "e", "d") and key != keys.hop_key(ROOT, "f", "c")
    assert key != keys.hop_key(b"s" * 32, "e", "c")
    # parts cannot run together
    assert keys.hop_key(ROOT, "e\0c", "") != keys.hop_key(ROOT, "e", "\0c")
    assert keys.control_token(ROOT) != keys.registration_proof(ROOT, "e", "c", "http://x")


def test_verify_compares_tokens_of_any_type() -> None:
    token = keys.control_token(ROOT)
    assert keys.verify(token, token)
    assert (
        not keys.verify(token, token[:-1] + "0")
        and not keys.verify(token, None)
        and not keys.verify(token, 7)
    )


def test_a_signed_hop_verifies_with_any_header_case() -> None:
    key = keys.hop_key(ROOT, "e", "c")
    signed = hops.sign(key, "POST", "/invocations", BODY, HEADERS)
    received = {name.lower(): value for name, value in {**HEADERS, **signed}.items()}
    hops.verify(key, "POST", "/invocations", BODY, received)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda h, b: (h, b + b" "), "does not match"),
        (lambda h, b: ({**h, "accept": "text/csv"}, b), "does not match"),
        (lambda h, b: ({**h, protocol.TARGET_MODEL.lower(): "b.tar.gz"}, b), "does not match"),
        (lambda h, b: ({**h, protocol.CUSTOM_ATTRIBUTES.lower(): "x"}, b), "does not match"),
        (lambda h, b: ({k: v for k, v in h.items() if k != hops.SIGNATURE_HEADER}, b), "unsigned"),
        (lambda h, b: ({**h, hops.DATE_HEADER: "soon"}, b), "expired"),
    ],
)
def test_any_change_to_a_signed_hop_is_refused(change, reason: str) -> None:
    key = keys.hop_key(ROOT, "e", "c")
    signed = {
        name.lower(): value
        for name, value in {
            **HEADERS,
            **hops.sign(key, "POST", "/invocations", BODY, HEADERS),
        }.items()
    }
    headers, body = change(signed, BODY)
    with pytest.raises(hops.HopAuthError, match=reason):
        hops.verify(key, "POST", "/invocations", body, headers)


def test_old_and_future_signatures_are_refused() -> None:
    key = keys.hop_key(ROOT, "e", "c")
    for skew in (-hops.MAX_SKEW_S - 5, hops.MAX_SKEW_S + 5):
        signed = hops.sign(
            key, "POST", "/invocations", BODY, HEADERS, clock=lambda: 1_000_000 + skew
        )
        with pytest.raises(hops.HopAuthError, match="expired"):
            hops.verify(
                key, "POST", "/invocations", BODY, {**HEADERS, **signed}, clock=lambda: 1_000_000
            )


def test_another_containers_key_is_refused() -> None:
    signed = hops.sign(keys.hop_key(ROOT, "e", "c"), "POST", "/invocations", BODY, HEADERS)
    with pytest.raises(hops.HopAuthError, match="does not match"):
        hops.verify(
            keys.hop_key(ROOT, "e", "d"), "POST", "/invocations", BODY, {**HEADERS, **signed}
        )


ECHO_HANDLER = """
import json

def input_fn(body, content_type):
    # str for application/json and text/csv, bytes otherwise (as SageMaker's toolkits hand it over)
    return {"content_type": content_type, "body": body if isinstance(body, str) else body.decode()}

def predict_fn(data, model):
    return data

def output_fn(prediction, accept):
    return json.dumps({**prediction, "accept": accept}), "application/json"
"""


def echo_container(tmp_path, environment: dict | None = None):
    """A started data port serving ECHO_HANDLER as container "echo" of endpoint "e", with that
    container's hop key."""
    from serving.http.server import BackgroundServer
    from serving.model_server.app import build_container_app
    from serving.runtimes import runtime_for

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(ECHO_HANDLER)
    runtime = runtime_for("python", tmp_path, environment or {})
    runtime.load()
    server = BackgroundServer(
        build_container_app(runtime, "echo", hop_key=keys.hop_key(ROOT, "e", "echo")),
        "127.0.0.1",
        0,
    )
    assert server.wait_started()
    return server


def test_the_transport_signs_what_the_container_verifies(tmp_path) -> None:
    # Real HTTP on loopback: a container that knows its key answers the transport's hops, whatever
    # headers the caller left out (the defaults aiohttp used to add are signed too), and refuses an
    # unsigned request.
    import asyncio

    import httpx

    from serving.gateway.transport import ContainerTransport

    server = echo_container(tmp_path)

    async def hops() -> list:
        transport = ContainerTransport(
            default_limit=4,
            hop_key=lambda endpoint, container: keys.hop_key(ROOT, endpoint, container),
        )
        await transport.start()
        transport.update({("e", "echo"): [server.url]})
        try:
            return [
                await transport.send("e", "echo", b"hello", headers, timeout=10)
                for headers in (
                    {},
                    {"content-type": "text/plain"},
                    {"accept": "application/json"},
                    # a non-ASCII value, as Starlette hands the gateway the caller's bytes
                    # (latin-1): the container must read the very string that was signed
                    {protocol.CUSTOM_ATTRIBUTES: "caf\xe9"},
                )
            ]
        finally:
            await transport.close()

    try:
        answers = asyncio.run(hops())
        assert [answer.status for answer in answers] == [200, 200, 200, 200]
        assert [__import__("json").loads(a.body)["content_type"] for a in answers] == [
            "application/octet-stream",
            "text/plain",
            "application/octet-stream",
            "application/octet-stream",
        ]
        assert httpx.post(server.url + "/invocations", content=b"hello").status_code == 403
    finally:
        server.stop()


def test_a_repeated_header_cannot_slip_an_unsigned_value_past_the_signature(tmp_path) -> None:
    # A captured hop with a second Content-Type (or TargetModel, ...) put in front of the signed
    # one: the signature was checked over one of the two and the model was handed the other, so a
    # hop could be re-aimed unnoticed. Whatever the container does with a repeated header, the model
    # must see only the value that was signed.
    import httpx

    server = echo_container(tmp_path)
    # httpx would add an unsigned Accept
    signed = {"content-type": "text/plain", "accept": "application/json"}
    signed |= hops.sign(keys.hop_key(ROOT, "e", "echo"), "POST", "/invocations", b"hello", signed)
    rest = [(name, value) for name, value in signed.items() if name != "content-type"]
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            assert client.post("/invocations", content=b"hello", headers=signed).status_code == 200
            for headers in (
                [("content-type", "text/csv"), ("content-type", "text/plain"), *rest],
                [("content-type", "text/plain"), ("content-type", "text/csv"), *rest],
            ):
                answer = client.post("/invocations", content=b"hello", headers=headers)
                assert answer.status_code == 403 or answer.json()["content_type"] == "text/plain", (
                    answer.text
                )
    finally:
        server.stop()


def test_a_containers_tensor_signature_is_read_by_signed_hops_only(tmp_path) -> None:
    # Open Inference metadata: the gateway reads a container's signature with a signed GET; anyone
    # else gets 403.
    import asyncio
    import json

    import httpx

    from serving.gateway.transport import ContainerTransport

    declared = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}], "outputs": []}
    server = echo_container(tmp_path, {protocol.TENSOR_SIGNATURE_ENV: json.dumps(declared)})

    async def read(root: bytes):
        transport = ContainerTransport(
            default_limit=4,
            hop_key=lambda endpoint, container: keys.hop_key(root, endpoint, container),
        )
        await transport.start()
        transport.update({("e", "echo"): [server.url]})
        try:
            return await transport.read("e", "echo", protocol.SIGNATURE_PATH, timeout=10)
        finally:
            await transport.close()

    try:
        answer = asyncio.run(read(ROOT))
        assert answer.status == 200
        assert json.loads(answer.body) == {
            "platform": "python",
            **declared,
            "content_type": "application/json",
            "accept": "application/json",
        }  # a script: JSON both ways
        assert asyncio.run(read(b"s" * 32)).status == 403  # another cluster's key
        assert httpx.get(server.url + protocol.SIGNATURE_PATH).status_code == 403  # unsigned
    finally:
        server.stop()


def test_a_multimodel_containers_repository_answers_signed_hops_only(tmp_path) -> None:
    # The V2 repository extension: list, load and unload reach a container's cache by signed hops;
    # anyone else 403.
    import asyncio
    import json

    import httpx

    from serving.gateway.transport import ContainerTransport
    from serving.http.server import BackgroundServer
    from serving.model_server.app import build_container_app
    from serving.models.multimodel import MultiModelHandler

    (tmp_path / "echo" / "code").mkdir(parents=True)
    (tmp_path / "echo" / "code" / "inference.py").write_text(ECHO_HANDLER)
    handler = MultiModelHandler("python", str(tmp_path), {}, hostname="mm")
    server = BackgroundServer(
        build_container_app(None, "mm", models=handler, hop_key=keys.hop_key(ROOT, "e", "mm")),
        "127.0.0.1",
        0,
    )
    assert server.wait_started()

    async def call(root: bytes, method: str, path: str, body: bytes = b""):
        transport = ContainerTransport(
            default_limit=4,
            hop_key=lambda endpoint, container: keys.hop_key(root, endpoint, container),
        )
        await transport.start()
        transport.update({("e", "mm"): [server.url]})
        try:
            (answer,) = await transport.each("e", "mm", method, path, body, timeout=30)
            return answer
        finally:
            await transport.close()

    load = json.dumps({"model": "echo"}).encode()
    try:
        assert (
            asyncio.run(call(ROOT, "POST", protocol.REPOSITORY_PATH + "/load", load)).status == 200
        )
        listed = asyncio.run(call(ROOT, "GET", protocol.REPOSITORY_PATH))
        assert json.loads(listed.body) == {"available": ["echo"], "loaded": ["echo"]}
        assert (
            asyncio.run(call(b"s" * 32, "POST", protocol.REPOSITORY_PATH + "/unload", load)).status
            == 403
        )
        assert httpx.get(server.url + protocol.REPOSITORY_PATH).status_code == 403  # unsigned
        assert (
            httpx.post(server.url + protocol.REPOSITORY_PATH + "/unload", content=load).status_code
            == 403
        )
        assert handler.cache.loaded_models() == ["echo"]  # nothing unsigned got through
    finally:
        server.stop()
        handler.close()
