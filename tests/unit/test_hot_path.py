"""The invocation route served ahead of Starlette's middleware (`serving.http.hot_path`) answers
exactly as the same app without it: successes, every kind of error, other methods and other
routes."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.errors import ValidationError
from serving.http.hot_path import HotPath
from serving.http.responses import serving_app


class Bug(Exception):
    pass


async def invoke(request: Request) -> Response:
    body = await request.body()
    if body == b"bad":
        raise ValidationError(f"endpoint {request.path_params['name']}: bad input")
    if body == b"bug":
        raise Bug("a bug of ours")
    return Response(
        b"answer for " + request.path_params["name"].encode() + b": " + body,
        headers={"x-seen": "1"},
    )


async def other(request: Request) -> Response:
    return Response(b"other")


def _apps():
    hot = Route("/endpoints/{name}/invocations", invoke, methods=["POST"])
    routes = [Route("/endpoints/{name}/other", other, methods=["POST"])]
    with_hot = serving_app(routes, hot=hot)
    without = serving_app(
        [Route("/endpoints/{name}/invocations", invoke, methods=["POST"]), *routes]
    )
    return with_hot, without


async def _call(
    app, method: str, path: str, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.request(method, path, content=body)
    return response.status_code, dict(response.headers), response.content


CASES = [
    ("POST", "/endpoints/e1/invocations", b"rows"),
    ("POST", "/endpoints/e1/invocations", b"bad"),
    ("POST", "/endpoints/e1/invocations", b"bug"),
    ("GET", "/endpoints/e1/invocations", b""),
    ("POST", "/endpoints/e1/other", b""),
    ("POST", "/endpoints/e1/invocations/more", b""),
    ("POST", "/nothing", b""),
]


@pytest.mark.parametrize(("method", "path", "body"), CASES)
def test_the_hot_path_answers_as_the_app_does(method: str, path: str, body: bytes) -> None:
    with_hot, without = _apps()
    assert isinstance(with_hot, HotPath)
    assert asyncio.run(_call(with_hot, method, path, body)) == asyncio.run(
        _call(without, method, path, body)
    )


def test_what_the_hot_path_answers() -> None:
    with_hot, _ = _apps()
    assert (
        asyncio.run(_call(with_hot, "POST", "/endpoints/e1/invocations", b"rows"))[2]
        == b"answer for e1: rows"
    )
    status, headers, body = asyncio.run(
        _call(with_hot, "POST", "/endpoints/e1/invocations", b"bad")
    )
    assert status == 400 and b"ValidationError" in body and b"endpoint e1: bad input" in body
    status, _, body = asyncio.run(_call(with_hot, "POST", "/endpoints/e1/invocations", b"bug"))
    assert status == 500 and b"InternalFailure" in body and b"a bug of ours" not in body
    assert asyncio.run(_call(with_hot, "GET", "/endpoints/e1/invocations"))[0] == 405


def test_a_bug_is_answered_and_still_raised_for_the_server_to_log() -> None:
    with_hot, _ = _apps()
    transport = httpx.ASGITransport(app=with_hot)  # raises what the app raised

    async def call() -> None:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await client.post("/endpoints/e1/invocations", content=b"bug")

    with pytest.raises(Bug):
        asyncio.run(call())


def test_the_hot_route_must_come_first() -> None:
    hot = Route("/endpoints/{name}/invocations", invoke, methods=["POST"])
    app = serving_app([Route("/endpoints/{name}/invocations", other, methods=["POST"])])
    with pytest.raises(ValueError, match="first routes"):
        HotPath(app, [hot], {})  # type: ignore[arg-type]
