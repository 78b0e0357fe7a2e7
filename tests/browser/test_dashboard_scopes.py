"""The dashboard with a read, a write and an admin token (docs/api.md v3, "Scoped tokens"): it
shows what the token may do and hides the rest: cancel and replay (write), schedule pause and
resume (write), flow limits (admin). A real `timewheel serve` with scoped tokens and Chromium;
screenshots of each page per scope go to the test's tmp dir."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import enter_token
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer
from tests.support.waiting import settle

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect

TOKENS = {"read": "scoped-reader-1f0e", "write": "scoped-writer-8a2b",
          "admin": "scoped-admin-3c9d"}
TAG = uuid.uuid4().hex[:8]
SCHEDULED, DEAD, FLOW, SCHEDULE = f"open-{TAG}", f"dead-{TAG}", f"flow-{TAG}", f"sched-{TAG}"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A `timewheel serve` whose tokens carry each scope."""
    directory = tmp_path_factory.mktemp("scoped-service")
    entries = ",".join(f"{scope}:{token}" for scope, token in TOKENS.items())
    with RedisServer(directory / "redis") as redis_server:
        service = Service(directory, redis_server.url, api_tokens=entries)
        try:
            yield service.start()
        finally:
            service.kill()


@pytest.fixture(scope="module")
def seeded(service: Service, receiver: ThreadedReceiver) -> Service:
    """A scheduled task, a dead letter, a flow with limits and a schedule, made with admin."""
    with httpx.Client(base_url=service.base_url, timeout=10,
                      headers={"Authorization": f"Bearer {TOKENS['admin']}"}) as api:
        receiver.respond(f"/{DEAD}", [400])
        for key, fields in [(SCHEDULED, {"delay": 3600}), (DEAD, {"max_attempts": 1})]:
            r = api.post("/tasks", json={"key": key, "callback_url": receiver.url(f"/{key}"),
                                         **fields})
            assert r.status_code == 201, r.text
        assert api.put(f"/flows/{FLOW}", json={"parallelism": 3}).status_code == 200
        r = api.put(f"/schedules/{SCHEDULE}", json={
            "every": 3600, "task": {"callback_url": receiver.url("/sched")}})
        assert r.status_code == 201, r.text
        settle(lambda: api.get(f"/tasks/{DEAD}").json()["status"] == "failed", 20.0,
               f"{DEAD} to fail")
    return service


# What each scope sees: (page, locator of an action) -> shown for which scopes.
ACTIONS = [
    (f"#/task/{SCHEDULED}", "#task-detail button:text-is('Cancel')", "write"),
    (f"#/task/{DEAD}", "#task-detail button:text-is('Replay')", "write"),
    ("#/dead-letters", "#replay-selected", "write"),
    ("#/dead-letters", f"#dead-results tr[data-key='{DEAD}'] button.replay", "write"),
    ("#/dead-letters", f"#dead-results tr[data-key='{DEAD}'] input.pick", "write"),
    ("#/schedules", f"#schedule-results tr[data-id='{SCHEDULE}'] button:text-is('Pause')",
     "write"),
    ("#/flows", "#flow-form", "admin"),
    ("#/flows", f"#flow-results tr[data-key='{FLOW}'] button:text-is('Edit')", "admin"),
    ("#/flows", f"#flow-results tr[data-key='{FLOW}'] button:text-is('Reset')", "admin"),
    ("#/flows", f"#flow-results tr[data-key='{FLOW}'] button:text-is('Pause')", "admin"),
]
# What every scope sees, the control that the page did load its data before the check above.
LOADED = {
    f"#/task/{SCHEDULED}": "#task-detail .badge",
    f"#/task/{DEAD}": "#task-detail .badge",
    "#/dead-letters": f"#dead-results tr[data-key='{DEAD}']",
    "#/schedules": f"#schedule-results tr[data-id='{SCHEDULE}']",
    "#/flows": f"#flow-results tr[data-key='{FLOW}']",
}
ORDER = ["read", "write", "admin"]
LABEL = {"read": "Token ✓ (read only)", "write": "Token ✓ (write)", "admin": "Token ✓"}


@pytest.mark.parametrize("scope", ORDER)
def test_the_dashboard_shows_what_the_token_may_do(page: Any, seeded: Service, scope: str,
                                                   shot: Callable[[str], Path]) -> None:
    page.goto(f"{seeded.base_url}/ui#/overview")
    enter_token(page, TOKENS[scope])
    expect(page.locator("#token-button")).to_have_text(LABEL[scope])
    expect(page.locator("body")).to_have_attribute("data-scope", scope)
    for number, fragment in enumerate(LOADED):
        page.goto(f"{seeded.base_url}/ui{fragment}")
        expect(page.locator(LOADED[fragment])).to_be_visible()
        for where, selector, needed in ACTIONS:
            if where != fragment:
                continue
            action = page.locator(selector)
            if ORDER.index(scope) >= ORDER.index(needed):
                expect(action).to_be_visible()
            else:
                expect(action).to_have_count(1)  # drawn, but not shown
                expect(action).to_be_hidden()
        shot(f"{scope}-{number}-{fragment.strip('#/').split('/')[0]}")


def test_a_read_token_that_tries_anyway_gets_403(seeded: Service) -> None:
    """What the page hides, the API refuses: the same calls with the read token."""
    with httpx.Client(base_url=seeded.base_url, timeout=10,
                      headers={"Authorization": f"Bearer {TOKENS['read']}"}) as api:
        r = api.delete(f"/tasks/{SCHEDULED}")
        assert (r.status_code, r.json()["detail"]) == (
            403, f"this token has scope read; DELETE /tasks/{SCHEDULED} needs write")
        assert api.get(f"/tasks/{SCHEDULED}").json()["status"] == "scheduled"
