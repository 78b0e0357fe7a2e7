"""Browser fixtures: a real `timewheel serve` with tokens set on a Redis of its own, a real local
receiver, and a real headless Chromium driven by Playwright (Debian's /usr/bin/chromium, not a
browser Playwright downloads: that download cannot work offline).

Without Chromium or Playwright the tests SKIP and say why (`.ci/run` installs Chromium when it
is missing). Each test gets a fresh browser context (empty session storage, so it enters the
token itself) and fails on any uncaught error in the page.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer

TOKEN = "browser-test-token"
# Flags for a root user on a machine without network: no sandbox (root), and no background
# connections to Google's services (refused here, many at a time).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
# Browser noise that is expected: the 401 that makes the page ask for the token.
EXPECTED_CONSOLE = ("status of 401",)


def chromium_path() -> str | None:
    """TIMEWHEEL_CHROMIUM, else Debian's chromium, else one on PATH."""
    for candidate in (os.environ.get("TIMEWHEEL_CHROMIUM"), "/usr/bin/chromium",
                      shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium: install Debian's chromium (apt-get install chromium "
                    "chromium-driver; .ci/run does it) or set TIMEWHEEL_CHROMIUM")
    return path


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[ThreadedReceiver]:
    with ThreadedReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One real `timewheel serve` per test module, tokens set, on a Redis of its own."""
    directory = tmp_path_factory.mktemp("browser-service")
    with RedisServer(directory / "redis") as redis_server:
        service = Service(directory, redis_server.url, api_tokens=TOKEN)
        try:
            yield service.start()
        finally:
            service.kill()


@pytest.fixture(scope="module")
def api(service: Service) -> Iterator[httpx.Client]:
    """The service's API with the token, for seeding and for checking what the page did."""
    with httpx.Client(base_url=service.base_url, timeout=10,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


@pytest.fixture
def expected_console() -> list[str]:
    """The console errors `page` lets pass: a test that provokes another on purpose (a form the
    API refuses: "status of 422") adds it."""
    return list(EXPECTED_CONSOLE)


@pytest.fixture
def page(browser: Any, tmp_path: Path, expected_console: list[str]) -> Iterator[Any]:
    """A new page in a fresh context (UTC, so shown times equal the API's), failing the test on
    an uncaught error or an unexpected console error in the page (``expected_console``)."""
    context = browser.new_context(viewport={"width": 1200, "height": 800}, timezone_id="UTC")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.on("console", lambda msg: errors.append(f"console: {msg.text}")
            if msg.type == "error" and not any(e in msg.text for e in expected_console)
            else None)
    page.set_default_timeout(10_000)
    yield page
    context.close()
    assert not errors, errors


@pytest.fixture
def shot(page: Any, tmp_path: Path) -> Callable[[str], Path]:
    """``shot("overview")`` saves a full-page screenshot in the test's tmp dir."""
    def take(name: str) -> Path:
        path = tmp_path / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path
    return take


class HeldFirstAuth:
    """The page's first call to ``/auth`` held back (the others go on), to be let go by the
    test: the page's first calls go out together, and one answered late is the case."""

    def __init__(self, page: Any) -> None:
        self._page = page
        self._held: list[Any] = []
        page.route(lambda url: url.endswith("/auth"), self._route)

    def _route(self, route: Any) -> None:
        if self._held:
            route.continue_()
        else:
            self._held.append(route)

    def call(self) -> Any:
        """The held route, once it has reached the handler (it does while playwright is
        waited on)."""
        for _ in range(100):
            if self._held:
                break
            self._page.wait_for_timeout(50)
        assert len(self._held) == 1
        return self._held[0]
