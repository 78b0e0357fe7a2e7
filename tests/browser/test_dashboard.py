"""The dashboard in a real headless Chromium against a real `timewheel serve` with tokens set:
each test enters the token when the page asks, does what an operator would, and checks the
outcome over the API. Screenshots of every page go to the test's tmp dir."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import TOKEN, HeldFirstAuth
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.waiting import settle

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect

MINUTE_MS = 60_000


def uid() -> str:
    return uuid.uuid4().hex[:8]


def iso_minute(minute: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:00.000Z", time.gmtime(minute * 60))


def open_ui(page: Any, service: Service, fragment: str = "") -> None:
    """Load the page; it has no token yet, so its first call answers 401 and it asks."""
    page.goto(f"{service.base_url}/ui{fragment}")
    enter_token(page, TOKEN)


def enter_token(page: Any, token: str) -> None:
    dialog = page.locator("#token-dialog")
    expect(dialog).to_be_visible()
    page.fill("#token-input", token)
    page.click("#token-save")


def create(api: httpx.Client, key: str, url: str, **fields: Any) -> None:
    r = api.post("/tasks", json={"key": key, "callback_url": url, **fields})
    assert r.status_code == 201, r.text


def status_of(api: httpx.Client, key: str) -> str:
    status: str = api.get(f"/tasks/{key}").json()["status"]
    return status


def test_ui_page_needs_no_token(service: Service) -> None:
    r = httpx.get(f"{service.base_url}/ui")
    assert r.status_code == 200
    assert "<title>timewheel</title>" in r.text
    assert httpx.get(f"{service.base_url}/stats").status_code == 401


def test_overview_shows_the_seeded_due_load(page: Any, service: Service, api: httpx.Client,
                                            receiver: ThreadedReceiver,
                                            shot: Callable[[str], Path]) -> None:
    """Tasks seeded 10 and 15 minutes ahead show as bars of their height in their minutes;
    a wrong token is refused and asked for again."""
    now_minute = int(time.time() * 1000) // MINUTE_MS
    busy, quiet = now_minute + 10, now_minute + 15
    tag = uid()
    for i in range(7):
        create(api, f"load-{tag}-{i}", receiver.url("/load"),
               execute_at=(busy * MINUTE_MS + 1000 * i) / 1000)
    for i in range(3):
        create(api, f"load-{tag}-q{i}", receiver.url("/load"),
               execute_at=(quiet * MINUTE_MS + 500) / 1000)

    page.goto(f"{service.base_url}/ui")
    enter_token(page, "not-the-token")
    expect(page.locator("#token-reason")).to_contain_text("refused")
    enter_token(page, TOKEN)
    expect(page.locator("#token-dialog")).to_be_hidden()

    bar = page.locator(f'#due-chart rect[data-minute="{iso_minute(busy)}"]')
    expect(bar).to_have_attribute("data-due", "7")
    expect(page.locator(f'#due-chart rect[data-minute="{iso_minute(quiet)}"]')
             ).to_have_attribute("data-due", "3")
    assert bar.bounding_box()["height"] > page.locator(
        f'#due-chart rect[data-minute="{iso_minute(quiet)}"]').bounding_box()["height"]
    expect(page.locator("#due-summary")).to_contain_text("tasks due in the next 180 minutes")
    assert int(page.locator("#due-hour").inner_text()) >= 10
    expect(page.locator("#dead")).to_have_text(str(api.get("/stats").json()["dead_letters"]))
    expect(page.locator("#in-flight")).to_have_text("0")
    # The token button shows that a token is set; the token is in session storage only.
    expect(page.locator("#token-button")).to_have_text("Token ✓")
    assert page.evaluate("sessionStorage.getItem('timewheel.token')") == TOKEN
    assert page.evaluate("localStorage.length") == 0
    shot("overview")


def test_find_a_scheduled_task_by_prefix_and_cancel_it(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        shot: Callable[[str], Path]) -> None:
    tag = uid()
    soon = time.time() + 7200
    for i, name in enumerate(["b", "a", "c"]):  # due order: b, a, c
        create(api, f"find-{tag}-{name}", receiver.url("/find"), execute_at=soon + i)
    create(api, f"other-{tag}", receiver.url("/find"), execute_at=soon)
    create(api, f"find-{tag}-gone", receiver.url("/find"), execute_at=soon)
    assert api.delete(f"/tasks/find-{tag}-gone").status_code == 204

    open_ui(page, service, "#/tasks")
    page.select_option("#status", "scheduled")
    page.fill("#prefix", f"find-{tag}-")
    page.click("#task-search button[type=submit]")
    rows = page.locator("#task-results tbody tr")
    expect(rows).to_have_count(3)
    assert [rows.nth(i).get_attribute("data-key") for i in range(3)] == [
        f"find-{tag}-b", f"find-{tag}-a", f"find-{tag}-c"]
    shot("tasks-by-prefix")

    row = page.locator(f'#task-results tr[data-key="find-{tag}-a"]')
    row.get_by_role("button", name="Cancel").click()
    row.get_by_role("button", name="Yes").click()
    expect(page.locator("#notice")).to_contain_text(f"Cancelled find-{tag}-a")
    assert status_of(api, f"find-{tag}-a") == "cancelled"
    assert status_of(api, f"find-{tag}-b") == "scheduled"
    expect(rows).to_have_count(2)


def test_open_a_task_and_cancel_it(page: Any, service: Service, api: httpx.Client,
                                   receiver: ThreadedReceiver,
                                   shot: Callable[[str], Path]) -> None:
    """A task opened by its key shows its details; Cancel (confirmed) cancels it for real."""
    key = f"cancel-{uid()}"
    create(api, key, receiver.url("/cancel"), delay=7200, max_attempts=4)
    open_ui(page, service, "#/tasks")
    page.fill("#open-key", key)
    page.click("#task-open button[type=submit]")
    detail = page.locator("#task-detail")
    expect(detail.locator(".badge")).to_have_text("scheduled")
    expect(page.locator("#last-outcome")).to_have_text("No attempt yet.")
    expect(detail).to_contain_text("0 of 4")
    expect(detail).to_contain_text(f"POST {receiver.url('/cancel')}")
    shot("task-scheduled")

    detail.get_by_role("button", name="Cancel").click()
    detail.get_by_role("button", name="Yes").click()
    expect(detail.locator(".badge")).to_have_text("cancelled")
    expect(page.locator("#notice")).to_contain_text(f"Cancelled {key}")
    assert status_of(api, key) == "cancelled"
    assert api.delete(f"/tasks/{key}").status_code == 409  # it really is finished
    expect(detail.get_by_role("button", name="Replay")).to_be_visible()
    shot("task-cancelled")


def test_replay_dead_letters(page: Any, service: Service, api: httpx.Client,
                             receiver: ThreadedReceiver, shot: Callable[[str], Path]) -> None:
    """Three tasks fail at once on a 400; one is replayed as a selection, one from its row;
    their receivers answer 200 the second time, so the replayed ones succeed."""
    tag = uid()
    keys = {name: f"dead-{tag}-{name}" for name in ("a", "b", "c")}
    for name, key in keys.items():
        receiver.respond(f"/dead-{tag}-{name}", [400, 200])
        create(api, key, receiver.url(f"/dead-{tag}-{name}"), max_attempts=3)
    for key in keys.values():
        settle(lambda key=key: status_of(api, key) == "failed", 20.0, f"{key} to fail")

    open_ui(page, service, "#/dead-letters")
    rows = page.locator("#dead-results tbody tr")
    for key in keys.values():
        expect(page.locator(f'#dead-results tr[data-key="{key}"]')).to_contain_text("400")
    shot("dead-letters")

    page.locator(f'#dead-results tr[data-key="{keys["a"]}"] input.pick').check()
    expect(page.locator("#replay-selected")).to_have_text("Replay selected (1)")
    page.click("#replay-selected")
    expect(page.locator("#notice")).to_contain_text(f"Replayed 1 task: {keys['a']}")
    page.locator(f'#dead-results tr[data-key="{keys["c"]}"]').get_by_role(
        "button", name="Replay").click()
    expect(page.locator("#notice")).to_contain_text(f"Replayed 1 task: {keys['c']}")

    for name in ("a", "c"):
        settle(lambda name=name: status_of(api, keys[name]) == "succeeded", 20.0,
               f"{keys[name]} to succeed after its replay")
        assert len(receiver.arrivals_for(f"/dead-{tag}-{name}")) == 2
    assert status_of(api, keys["b"]) == "failed"
    assert len(receiver.arrivals_for(f"/dead-{tag}-b")) == 1
    page.click("text=Refresh")
    expect(page.locator(f'#dead-results tr[data-key="{keys["a"]}"]')).to_have_count(0)
    expect(page.locator(f'#dead-results tr[data-key="{keys["b"]}"]')).to_have_count(1)
    assert rows.count() >= 1


def test_change_flow_limits(page: Any, service: Service, api: httpx.Client,
                            shot: Callable[[str], Path]) -> None:
    tag = uid()
    edited, added = f"api-{tag}.example.com:443", f"tenant-{tag}"
    assert api.put(f"/flows/{edited}", json={"parallelism": 5, "rate": None}).status_code == 200

    open_ui(page, service, "#/flows")
    row = page.locator(f'#flow-results tr[data-key="{edited}"]')
    expect(row.locator(".parallelism")).to_have_text("5")
    row.get_by_role("button", name="Edit").click()
    # Found by what a screen reader says of them: each box names its limit and its flow.
    page.get_by_role("textbox", name=f"parallelism of {edited}", exact=True).fill("7")
    page.get_by_role("textbox", name=f"rate per second of {edited}", exact=True).fill("2.5")
    shot("flows-editing")
    row.get_by_role("button", name="Save").click()
    expect(row.locator(".parallelism")).to_have_text("7")
    expect(row.locator(".rate")).to_have_text("2.5")
    listed = {f["key"]: f for f in api.get("/flows").json()["flows"]}
    assert listed[edited] == {"key": edited, "parallelism": 7, "rate": 2.5, "in_flight": 0,
                              "waiting": 0, "paused": False, "max_attempts": None,
                              "retry_backoff": None, "max_backoff": None}

    page.fill("#flow-key", added)
    page.fill("#flow-parallelism", "3")
    page.click("#flow-form button[type=submit]")
    expect(page.locator(f'#flow-results tr[data-key="{added}"] .parallelism')).to_have_text("3")
    assert api.get(f"/flows/{added}").json()["parallelism"] == 3
    assert api.get(f"/flows/{added}").json()["rate"] is None

    page.fill("#flow-rate", "many")  # refused in the page, nothing sent
    page.click("#flow-form button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("is not a number")
    shot("flows")

    row.get_by_role("button", name="Reset").click()
    row.get_by_role("button", name="Yes").click()
    expect(row).to_have_count(0)
    assert edited not in {f["key"] for f in api.get("/flows").json()["flows"]}


def test_a_refused_flow_edit_keeps_what_was_typed(page: Any, service: Service,
                                                  api: httpx.Client, expected_console: list[str],
                                                  shot: Callable[[str], Path]) -> None:
    """Parallelism 0 is refused by the API (422), a rate "abc" by the page: the row stays open
    with what the user typed, to be corrected, not the old values drawn over it."""
    expected_console.append("status of 422")

    def reloaded(response: Any) -> bool:
        return bool(response.url.endswith("/flows") and response.request.method == "GET")

    flow = f"edit-{uid()}"
    assert api.put(f"/flows/{flow}", json={"parallelism": 5, "rate": 2}).status_code == 200
    open_ui(page, service, "#/flows")
    row = page.locator(f'#flow-results tr[data-key="{flow}"]')
    row.get_by_role("button", name="Edit").click()
    row.locator(".edit-parallelism").fill("0")
    row.locator(".edit-rate").fill("3")
    with page.expect_response(reloaded):  # the list is read again after the refused PUT
        row.get_by_role("button", name="Save").click()
    expect(page.locator("#notice")).to_contain_text(
        "422: parallelism Input should be greater than or equal to 1")
    expect(row.locator(".edit-parallelism")).to_have_value("0")
    expect(row.locator(".edit-rate")).to_have_value("3")
    shot("flow-refused-parallelism")
    assert api.get(f"/flows/{flow}").json()["parallelism"] == 5

    row.locator(".edit-parallelism").fill("4")
    row.locator(".edit-rate").fill("abc")
    with page.expect_response(reloaded):
        row.get_by_role("button", name="Save").click()
    expect(page.locator("#notice")).to_contain_text("is not a number")
    expect(row.locator(".edit-parallelism")).to_have_value("4")
    expect(row.locator(".edit-rate")).to_have_value("abc")

    row.locator(".edit-rate").fill("3")
    row.get_by_role("button", name="Save").click()
    expect(row.locator(".parallelism")).to_have_text("4")
    expect(row.locator(".rate")).to_have_text("3")
    assert (api.get(f"/flows/{flow}").json()["parallelism"],
            api.get(f"/flows/{flow}").json()["rate"]) == (4, 3)
    # A new edit starts from the flow's values again.
    row.get_by_role("button", name="Edit").click()
    expect(row.locator(".edit-parallelism")).to_have_value("4")


def test_pause_and_resume_a_schedule(page: Any, service: Service, api: httpx.Client,
                                     receiver: ThreadedReceiver,
                                     shot: Callable[[str], Path]) -> None:
    schedule = f"hourly-{uid()}"
    r = api.put(f"/schedules/{schedule}", json={
        "every": 3600, "task": {"callback_url": receiver.url("/hourly")}})
    assert r.status_code == 201
    next_run = r.json()["next_run_at"]

    open_ui(page, service, "#/schedules")
    row = page.locator(f'#schedule-results tr[data-id="{schedule}"]')
    expect(row).to_contain_text("every 3600 s")
    expect(row.locator(".next-run time")).to_have_attribute("datetime", next_run)
    row.get_by_role("button", name="Pause").click()
    expect(row.locator(".badge")).to_have_text("paused")
    view = api.get(f"/schedules/{schedule}").json()
    assert view["paused"] is True and view["next_run_at"] is None
    shot("schedules-paused")

    row.get_by_role("button", name="Resume").click()
    expect(row.locator(".badge")).to_have_text("active")
    expect(page.locator("#notice")).to_contain_text(
        re.compile(r"next run \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\.$"))  # with its zone
    view = api.get(f"/schedules/{schedule}").json()
    assert view["paused"] is False and view["next_run_at"] is not None
    expect(row.locator(".next-run time")).to_have_attribute("datetime", view["next_run_at"])
    shot("schedules")


def test_a_call_refused_after_the_token_was_saved_does_not_ask_again(
        page: Any, service: Service) -> None:
    """The page's first calls go out together without a token; the first 401 opens the dialog.
    One of them answered only after the token was saved (a loaded machine, or the 5 s refresh)
    is tried again with the saved token, not a second prompt over the page."""
    held = HeldFirstAuth(page)
    page.goto(f"{service.base_url}/ui#/flows")
    enter_token(page, TOKEN)  # asked for by the Flows page's own call
    expect(page.locator("#token-dialog")).to_be_hidden()
    first = held.call()
    # Saving asked /auth for the token's scope: that call is answered before the held one goes.
    expect(page.locator("body")).to_have_attribute("data-scope", "admin")
    with page.expect_response(lambda r: r.url.endswith("/auth") and r.status == 200) as retry:
        first.continue_()  # still without a token, as it was sent: the service answers 401
    assert retry.value.request.headers["authorization"] == f"Bearer {TOKEN}"
    expect(page.locator("#token-dialog")).to_be_hidden()
