"""The operator console in a real headless Chromium (Debian's `chromium`, driven by Playwright; `make
test` installs it) on the session's real server: the pages render with no console error and no
Content-Security-Policy violation, the charts draw it-console's live invocations, and a scale-out
shows in the containers' table as it happens.

it-console: two Python echo containers; `busy` tracks 60 invocations per replica per minute (1..2
replicas, 5 s scale-out cooldown) and the test sends it about 4 a second, so it scales out to 2.
The session's server binds loopback without API identities: the browser signs in anonymously. HTTP
Basic with an API identity's key is signed in by the same browser on a console of its own (no Ray:
the real routes and access decision over the real control-plane API of tests/unit/sagemaker_harness);
the other refusals are tests/unit/test_console.py's. `SERVING_CONSOLE_SCREENSHOTS=DIR` saves the pages' images
there (docs/images/console-*.png were made so).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright
from suite.endpoint_server import TINY
from suite.endpoints import python_container

from serving import protocol
from serving.access.identities import load_identities
from serving.console.access import ConsoleAccess
from serving.console.overview import overview
from serving.console.page import CONTENT_SECURITY_POLICY, ConsoleRoutes
from serving.http.responses import serving_app
from serving.http.server import BackgroundServer
from tests.unit.sagemaker_harness import Harness

pytestmark = pytest.mark.integration

ENDPOINT = "it-console"
CHROMIUM = "/usr/bin/chromium"
CHART_WAIT_S = 60  # the sampler records every 10 s, the page reads every 5 s
SCALE_WAIT_S = 90  # a replica starts on 2 CPUs shared with the whole session
INVOCATIONS_CHART = "variant:AllTraffic:Invocations/s"


def console_endpoint(handler_models: dict[str, Path]) -> dict:
    """it-console: `busy` autoscaled on a low target, `idle` fixed."""
    policy = {
        "MinCapacity": 1,
        "MaxCapacity": 2,
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": 60,
            "ScaleOutCooldown": 5,
            "ScaleInCooldown": 600,
        },
    }
    return {
        "EndpointName": ENDPOINT,
        "Containers": [
            python_container("busy", handler_models, "echo", Resources=TINY, AutoScaling=policy),
            python_container("idle", handler_models, "echo", Resources=TINY),
        ],
    }


ENDPOINTS = {ENDPOINT: console_endpoint}


class Load:
    """About 4 invocations a second of `busy` (and one in ten of `idle`) on a thread, until closed."""

    def __init__(self, url: str) -> None:
        self.url, self.sent, self.failed = url, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.wait(0.25):
                host = "idle" if self.sent % 10 == 9 else "busy"
                try:
                    answer = client.post(
                        f"/endpoints/{ENDPOINT}/invocations",
                        content=b'{"x": 1}',
                        headers={
                            "Content-Type": protocol.JSON,
                            protocol.TARGET_CONTAINER: host,
                        },
                    )
                    self.failed += answer.status_code != 200
                except httpx.HTTPError:
                    self.failed += 1
                self.sent += 1


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        if os.environ.get("SERVING_SKIP_CHROMIUM") == "1":
            pytest.skip("SERVING_SKIP_CHROMIUM=1 and no chromium")
        pytest.fail(
            "chromium is missing: `make test` installs Debian's chromium package (apt-get install "
            "chromium); set SERVING_SKIP_CHROMIUM=1 to skip this test"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            launched.close()


class Watched:
    """A page whose console errors, uncaught exceptions and CSP violations are kept."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.add_init_script(
            "window.__violations = [];"
            "document.addEventListener('securitypolicyviolation', (e) =>"
            " window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));"
        )

    def violations(self) -> list[str]:
        return self.page.evaluate("window.__violations")

    def screenshot(self, name: str) -> None:
        folder = os.environ.get("SERVING_CONSOLE_SCREENSHOTS")
        if folder:
            self.page.screenshot(path=str(Path(folder) / f"console-{name}.png"), full_page=True)


def test_the_console_draws_live_charts_and_a_scale_out_without_errors(server, browser) -> None:
    watched = Watched(browser)
    page = watched.page
    try:
        with Load(server.url) as load:
            answer = page.goto(f"{server.url}{protocol.CONSOLE_PATH}")
            assert answer is not None and answer.status == 200
            policy = answer.headers[protocol.CONTENT_SECURITY_POLICY_HEADER]
            assert policy == CONTENT_SECURITY_POLICY
            link = page.locator(f"a[href='#/endpoints/{ENDPOINT}']")
            link.wait_for(timeout=30_000)
            row = page.locator("#overview tr", has=link)
            assert "InService" in row.inner_text() or "Updating" in row.inner_text()
            watched.screenshot("overview")

            link.click()
            chart = page.locator(f"[data-chart='{INVOCATIONS_CHART}']")
            chart.wait_for(timeout=30_000)
            # the live invocations reach a chart: its series get points (bounded)
            page.wait_for_function(
                "(id) => Number(document.querySelector(`[data-chart='${id}']`)"
                "?.dataset.points ?? 0) > 0",
                arg=INVOCATIONS_CHART,
                timeout=CHART_WAIT_S * 1000,
            )
            assert chart.locator("canvas").count() == 1
            assert page.locator("[data-chart^='container:AllTraffic/busy:']").count() == 4
            # the scale-out, as it happens: an activity row 1 -> 2 for busy
            page.locator("#containers tr", has_text="1 → 2").wait_for(timeout=SCALE_WAIT_S * 1000)
            assert "busy" in page.locator("#containers tr", has_text="1 → 2").first.inner_text()
            watched.screenshot("endpoint")
        assert load.sent > 0 and load.failed == 0, (load.sent, load.failed)
        assert watched.errors == [], watched.errors
        assert watched.violations() == [], watched.violations()
        # and the policy is enforced, and watched: an inline style is refused and reported
        page.evaluate(
            "document.head.append(Object.assign(document.createElement('style'),"
            " {textContent: 'body { color: red }'}))"
        )
        page.wait_for_function("window.__violations.length > 0", timeout=5_000)
        assert any("style-src" in v for v in watched.violations())
    finally:
        watched.context.close()


OPERATOR_KEY = "operator-key-for-the-console-browser"


def test_a_browser_signs_in_with_http_basic_and_an_api_identity_key(browser, tmp_path) -> None:
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["sagemaker:List*", "sagemaker:Describe*", "cloudwatch:*"],
                "Resource": "*",
            }
        ],
    }
    (tmp_path / "ops.json").write_text(json.dumps(policy))
    identities = tmp_path / "api-identities.yaml"
    entry = {"Principal": "operator", "ApiKey": OPERATOR_KEY, "PolicyDocuments": ["ops.json"]}
    identities.write_text(yaml.safe_dump({"Identities": [entry]}))
    harness = Harness(tmp_path / "api")
    harness.in_service("signed-in", "c1", ("A",))
    access = ConsoleAccess(load_identities(identities), "127.0.0.1", "us-east-1", "000000000000")

    async def read(endpoint: str | None) -> Any:
        return await asyncio.to_thread(overview, harness.control, harness.deployer.descriptions())

    console = BackgroundServer(serving_app(ConsoleRoutes(access, read).routes()), "127.0.0.1", 0)
    assert console.wait_started()
    contexts = []
    try:
        anonymous = browser.new_context()
        wrong = browser.new_context(http_credentials={"username": "operator", "password": "x" * 20})
        operator = browser.new_context(
            http_credentials={"username": "operator", "password": OPERATOR_KEY}
        )
        contexts += [anonymous, wrong, operator]
        url = f"{console.url}{protocol.CONSOLE_PATH}"
        challenge = httpx.get(url, timeout=10)
        assert challenge.status_code == 401
        assert challenge.headers[protocol.AUTHENTICATE_HEADER] == protocol.CONSOLE_CHALLENGE
        # no key, or one the server does not know: challenged (again); headless Chromium shows the
        # 401 or gives up on the credentials it has, never the console
        for refused in (anonymous, wrong):
            try:
                answer = refused.new_page().goto(url)
            except PlaywrightError as error:
                assert "ERR_INVALID_AUTH_CREDENTIALS" in str(error)
            else:
                assert answer is not None and answer.status == 401
        page = operator.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        answer = page.goto(url)
        assert answer is not None and answer.status == 200
        # the page's own fetch of the JSON carries the browser's Basic credentials
        page.locator("a[href='#/endpoints/signed-in']").wait_for(timeout=15_000)
        assert errors == [], errors
    finally:
        for context in contexts:
            context.close()
        console.stop()
        harness.stop()
