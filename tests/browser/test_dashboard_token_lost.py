"""A token that stops working in the middle of a session: the service restarted with another
token list, so the token the page holds is now refused (401) or may do less (403). In a real
headless Chromium against a real `timewheel serve`; screenshots go to the test's tmp dir (or
to TIMEWHEEL_SHOTS when set)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import create, enter_token, uid
from tests.browser.test_dashboard_token import COUNT_PROMPTS
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect

OLD = {"admin": "lost-admin-5e1d", "write": "lost-writer-77c0", "read": "lost-reader-0b3a"}
NEW = "lost-new-admin-9f42"
# What each page calls on its 5 s refresh (page-overview.js, page-flows.js REFRESH_MS).
REFRESHED = {"#/overview": "/stats", "#/flows": "/flows"}


def tokens(entries: dict[str, str]) -> str:
    return ",".join(f"{scope}:{token}" for scope, token in entries.items())


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    """A `timewheel serve` of this test's own: the test restarts it with other tokens."""
    with RedisServer(tmp_path / "redis") as redis_server:
        service = Service(tmp_path, redis_server.url, api_tokens=tokens(OLD))
        try:
            yield service.start()
        finally:
            service.kill()


@pytest.fixture
def expected_console(expected_console: list[str]) -> list[str]:
    """While the service restarts, a refresh that comes then finds its port closed: the
    browser logs that as a console error, which here is the test's own doing."""
    return [*expected_console, "net::ERR_CONNECTION_REFUSED"]


def restart(service: Service, entries: dict[str, str]) -> None:
    """The service's token list changed: it is stopped (SIGTERM: the answers it is writing
    finish, not cut mid-way as a kill left them, which the browser logs as errors) and
    started again (same port) with ``entries``."""
    assert service.stop() == 0
    service.env["TIMEWHEEL_API_TOKENS"] = tokens(entries)
    service.start()


@pytest.fixture
def save(shot: Callable[[str], Path]) -> Callable[[str], Path]:
    """``shot``, copied to TIMEWHEEL_SHOTS too when that is set (to look at them)."""
    def take(name: str) -> Path:
        path = shot(name)
        if os.environ.get("TIMEWHEEL_SHOTS"):
            target = Path(os.environ["TIMEWHEEL_SHOTS"]) / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
        return path
    return take


def refused_calls(page: Any, path: str) -> list[str]:
    """The URLs of the page's calls to ``path`` answered 401, as they come."""
    seen: list[str] = []
    page.on("response", lambda r: seen.append(r.url)
            if r.status == 401 and r.url.split("?")[0].endswith(path) else None)
    return seen


@pytest.mark.parametrize(("scope", "fragment"), [("admin", "#/overview"), ("read", "#/flows")])
def test_a_token_refused_in_the_background_says_so_without_the_dialog(
        page: Any, service: Service, scope: str, fragment: str,
        save: Callable[[str], Path]) -> None:
    """The token worked; the service restarted without it. The page's 5 s refresh, answered
    401, does not open the token dialog (the user did nothing): a line under the header says
    the token is no longer accepted, with a button that opens the dialog. A new token there
    brings the page back and the line goes."""
    page.add_init_script(COUNT_PROMPTS)
    refused = refused_calls(page, REFRESHED[fragment])
    page.goto(f"{service.base_url}/ui{fragment}")
    enter_token(page, OLD[scope])
    expect(page.locator("#token-button")).to_have_text(
        "Token ✓ (read only)" if scope == "read" else "Token ✓")
    if fragment == "#/overview":
        expect(page.locator("#in-flight")).to_have_text("0")
    else:
        expect(page.locator("#flow-results")).to_contain_text("No flow")
    assert page.evaluate("window.__prompts") == 1

    restart(service, {"admin": NEW})
    # The next refresh, answered 401: it opens the dialog or shows the line, whichever.
    page.wait_for_selector("#token-dialog[open], #token-lost:not([hidden])", timeout=15_000)
    save(f"token-lost-{scope}-{fragment.strip('#/')}-refused")
    assert page.evaluate("window.__prompts") == 1, "the refresh opened the token dialog"
    lost = page.locator("#token-lost")
    expect(lost).to_be_visible()
    expect(lost).to_contain_text("no longer accepted")
    seen = len(refused)
    for _ in range(150):  # another refresh, answered 401 too: 5 s and a bit
        if len(refused) > seen:
            break
        page.wait_for_timeout(100)
    assert len(refused) > seen, refused
    expect(page.locator("#token-dialog")).to_be_hidden()
    assert page.evaluate("window.__prompts") == 1
    expect(page.locator("#token-button")).to_have_text("Token")
    save(f"token-lost-{scope}-{fragment.strip('#/')}")

    lost.get_by_role("button").click()
    enter_token(page, NEW)
    expect(page.locator("#token-button")).to_have_text("Token ✓")
    expect(lost).to_be_hidden()
    if fragment == "#/overview":
        expect(page.locator("#overview-error")).to_be_hidden()
        expect(page.locator("#due-chart svg")).to_be_visible()
    else:
        expect(page.locator("#flow-results")).to_contain_text("No flow")
    save(f"token-lost-{scope}-{fragment.strip('#/')}-new-token")


def test_a_token_that_may_do_less_now_gets_its_403_without_the_dialog(
        page: Any, service: Service, receiver: ThreadedReceiver, expected_console: list[str],
        save: Callable[[str], Path]) -> None:
    """The write token became read-only: Cancel on a task is answered 403. That says why,
    opens no dialog and says nothing of a token no longer accepted (it is accepted); the header
    learns the token's scope again, and the buttons it may not use go."""
    expected_console.append("status of 403")  # the refused Cancel, on purpose
    page.add_init_script(COUNT_PROMPTS)
    key = f"lost-{uid()}"
    with httpx.Client(base_url=service.base_url, timeout=10,
                      headers={"Authorization": f"Bearer {OLD['admin']}"}) as api:
        create(api, key, receiver.url("/lost"), delay=3600)
    page.goto(f"{service.base_url}/ui#/task/{key}")
    enter_token(page, OLD["write"])
    expect(page.locator("#token-button")).to_have_text("Token ✓ (write)")
    cancel = page.locator("#task-detail button:text-is('Cancel')")
    expect(cancel).to_be_visible()

    restart(service, {"read": OLD["write"]})
    cancel.click()
    page.locator("#task-detail button:text-is('Yes')").click()
    expect(page.locator("#notice")).to_contain_text("403")
    expect(page.locator("#notice")).to_contain_text("needs write")
    expect(page.locator("#token-button")).to_have_text("Token ✓ (read only)")
    expect(page.locator("#task-detail .confirm .question")).to_have_count(0)  # drawn again
    expect(cancel).to_have_count(1)
    expect(cancel).to_be_hidden()
    expect(page.locator("#token-dialog")).to_be_hidden()
    expect(page.locator("#token-lost")).to_be_hidden()
    assert page.evaluate("window.__prompts") == 1
    save("token-now-read-only-403")


def test_the_line_goes_when_the_token_works_again(
        page: Any, service: Service, save: Callable[[str], Path]) -> None:
    """The service took the token back (restarted with it again): the page's next refresh is
    answered 200, the line goes and the header shows the token accepted, without the user
    entering anything."""
    page.add_init_script(COUNT_PROMPTS)
    page.goto(f"{service.base_url}/ui#/overview")
    enter_token(page, OLD["admin"])
    expect(page.locator("#token-button")).to_have_text("Token ✓")
    restart(service, {"admin": NEW})
    lost = page.locator("#token-lost")
    expect(lost).to_be_visible(timeout=15_000)
    expect(page.locator("#token-button")).to_have_text("Token")

    restart(service, OLD)
    expect(lost).to_be_hidden(timeout=15_000)
    expect(page.locator("#token-button")).to_have_text("Token ✓")
    expect(page.locator("#overview-error")).to_be_hidden()
    expect(page.locator("#in-flight")).to_have_text("0")
    assert page.evaluate("window.__prompts") == 1
    save("token-lost-then-back")
