"""Every HTTP server this runtime starts (the gateway, a container's data port) sees its real TCP
peer, and wakes once a second while idle.

uvicorn's default trusts `X-Forwarded-For`/`X-Forwarded-Proto` from 127.0.0.1 (or from whatever
`FORWARDED_ALLOW_IPS` in the environment names, `*` included) and rewrites the request's client and
scheme from them. No proxy we set up stands in front of our servers, so a peer could only use them
to claim an address it does not have (`tfs_rest`'s same-host rule). A real BackgroundServer on
loopback, a real client; fails on a server with uvicorn's defaults.
"""

from __future__ import annotations

import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from serving.http.server import BackgroundServer


async def peer(request: Request) -> JSONResponse:
    client = request.client
    return JSONResponse({"host": client.host if client else None, "scheme": request.url.scheme})


@pytest.fixture(params=["default", "forwarded-allow-all"])
def server(request, monkeypatch):
    if request.param == "forwarded-allow-all":
        # an operator's environment must not turn the trust on
        monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    running = BackgroundServer(Starlette(routes=[Route("/peer", peer)]))
    assert running.wait_started(10)
    yield running
    running.stop()


def test_forwarded_headers_do_not_change_the_peer_or_the_scheme(server: BackgroundServer) -> None:
    spoofed = {
        "X-Forwarded-For": "203.0.113.7",
        "X-Forwarded-Proto": "https",
        "Forwarded": "for=203.0.113.7",
    }
    answer = httpx.get(server.url + "/peer", headers=spoofed, timeout=10)
    assert answer.json() == {"host": "127.0.0.1", "scheme": "http"}


def test_answers_do_not_name_the_server_software(server: BackgroundServer) -> None:
    answer = httpx.get(server.url + "/peer", timeout=10)
    assert "server" not in answer.headers


def test_an_idle_server_wakes_once_a_second_and_stops_at_once(monkeypatch) -> None:
    # uvicorn's own main loop wakes every 0.1 s; every container process and the gateway run one of
    # these
    import serving.http.server as server_module

    ticks: list[int] = []
    original = server_module._Server.on_tick

    async def counted(self, counter: int) -> bool:
        ticks.append(counter)
        return await original(self, counter)

    monkeypatch.setattr(server_module._Server, "on_tick", counted)
    running = BackgroundServer(Starlette(routes=[Route("/peer", peer)]))
    assert running.wait_started(10)
    first = len(ticks)
    time.sleep(2.5)
    assert len(ticks) - first <= 4, f"{len(ticks) - first} wake-ups in 2.5 s"
    assert all(counter % 10 == 0 for counter in ticks)  # each one refreshes the date header
    assert httpx.get(running.url + "/peer", timeout=10).headers["date"]
    monkeypatch.setattr(server_module, "TICK_S", 60.0)  # a stop must not wait for the next tick
    time.sleep(1.1)  # the loop is now in a 60 s wait
    running.stop(timeout=20)
    assert not running.alive
