"""serving.gateway.control_routes: who may change endpoints over HTTP, and what a bad spec gets
back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from serving.gateway.control_routes import ControlRoutes
from serving.http.responses import serving_app

TOKEN = "t" * 64


@pytest.fixture
def calls() -> dict[str, list]:
    return {"apply": [], "delete": []}


@pytest.fixture
def routes(calls) -> ControlRoutes:
    def apply(spec):
        calls["apply"].append(spec)
        return 7

    def delete(name):
        calls["delete"].append(name)
        return name == "known"

    return ControlRoutes(
        TOKEN, apply=apply, delete=delete, describe=lambda name: {} if name == "known" else None
    )


def send(
    routes: ControlRoutes, method: str, path: str, body: object = None, token: str | None = TOKEN
) -> httpx.Response:
    async def request() -> httpx.Response:
        transport = httpx.ASGITransport(app=serving_app(routes.routes()))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(transport=transport, base_url="http://serving.test") as client:
            content = (
                None
                if body is None
                else (body if isinstance(body, bytes) else json.dumps(body).encode())
            )
            return await client.request(method, path, content=content, headers=headers)

    return asyncio.run(request())


def spec(name: str, model: Path) -> dict:
    return {
        "EndpointName": name,
        "Containers": [{"ContainerHostname": "c", "Image": "python", "ModelDataUrl": str(model)}],
    }


@pytest.mark.parametrize(
    ("token", "code"),
    [(None, "MissingAuthenticationTokenException"), ("x" * 64, "AccessDeniedException")],
)
def test_changes_need_the_control_token(routes, calls, tmp_path: Path, token, code: str) -> None:
    for method, path, body in (
        ("PUT", "/endpoints/new", spec("new", tmp_path)),
        ("DELETE", "/endpoints/known", None),
    ):
        response = send(routes, method, path, body, token=token)
        assert response.status_code == 403 and response.json()["__type"] == code
    assert calls == {"apply": [], "delete": []}


def test_a_valid_spec_is_applied(routes, calls, tmp_path: Path) -> None:
    response = send(routes, "PUT", "/endpoints/new", spec("new", tmp_path))
    assert response.status_code == 200
    assert response.json() == {"EndpointName": "new", "EndpointStatus": "Creating", "Generation": 7}
    assert [s.EndpointName for s in calls["apply"]] == ["new"]
    assert (
        send(routes, "PUT", "/endpoints/known", spec("known", tmp_path)).json()["EndpointStatus"]
        == "Updating"
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "invalid JSON"),
        ({"EndpointName": "new", "Containers": []}, "invalid spec"),
        (
            {
                "EndpointName": "other",
                "Containers": [{"ContainerHostname": "c", "Image": "python"}],
            },
            "is not 'new'",
        ),
    ],
)
def test_a_bad_spec_is_a_400_naming_the_problem(routes, calls, body, fragment: str) -> None:
    response = send(routes, "PUT", "/endpoints/new", body)
    assert response.status_code == 400 and fragment in response.json()["message"]
    assert calls["apply"] == []


def test_delete(routes, calls) -> None:
    assert send(routes, "DELETE", "/endpoints/known").json() == {
        "EndpointName": "known",
        "EndpointStatus": "Deleting",
    }
    response = send(routes, "DELETE", "/endpoints/unknown")
    assert (
        response.status_code == 400
        and response.json()["message"] == "Could not find endpoint unknown."
    )


def test_a_spec_its_plan_refuses_is_a_400_naming_the_container(tmp_path: Path) -> None:
    # The real plan (control.plans) as `apply`: a model whose code/requirements.txt would install a
    # package
    from serving.control.plans import endpoint_record
    from serving.settings import ServerSettings

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "requirements.txt").write_text("surely-not-installed-pkg==1.0\n")
    routes = ControlRoutes(
        TOKEN,
        apply=lambda s: endpoint_record(s, ServerSettings()) and 1,
        delete=lambda n: False,
        describe=lambda name: None,
    )
    response = send(routes, "PUT", "/endpoints/new", spec("new", tmp_path))
    assert response.status_code == 400, response.text
    assert response.json()["__type"] == "ValidationError"
    message = response.json()["message"]
    assert "Containers[c].ModelDataUrl" in message and "surely-not-installed-pkg==1.0" in message
