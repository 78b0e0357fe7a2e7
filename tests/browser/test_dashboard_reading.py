"""The dashboard reads unambiguously: every time carries its zone and the header toggles
UTC / local; the callbacks-per-second window is never "0 s"; lateness does not count a task
created with a past execute_at as late; cut URLs show in full on hover; the task page shows
the request (headers, body, timeout, backoff, flow). Screenshots go to the test's tmp dir."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import create, open_ui, status_of
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.waiting import settle

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect


REFRESH_WAIT_MS = 6500  # the flows page refreshes every 5 s (page-flows.js REFRESH_MS)


def uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def berlin_page(browser: Any) -> Iterator[Any]:
    """A page whose browser lives in Europe/Berlin (UTC+1 in winter, +2 in summer)."""
    context = browser.new_context(viewport={"width": 1200, "height": 800},
                                  timezone_id="Europe/Berlin", locale="en-GB")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.set_default_timeout(10_000)
    yield page
    context.close()
    assert not errors, errors


def test_times_carry_their_zone_and_the_toggle_shows_local_time(
        berlin_page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        tmp_path: Path) -> None:
    """A Berlin 02:30 cron reads "01:30:00 UTC" by default (in winter), "02:30:00 CET" after
    the toggle, which is kept across a reload; the chart says which zone its axis is in."""
    page = berlin_page
    schedule = f"nightly-{uid()}"
    view = api.put(f"/schedules/{schedule}", json={
        "cron": "30 2 * * *", "timezone": "Europe/Berlin",
        "task": {"callback_url": receiver.url("/nightly")}}).json()
    next_run = view["next_run_at"]
    # Berlin is UTC+1 or UTC+2 on that day; the API's next run says which.
    utc_hour = int(next_run[11:13])
    local_hour = 2
    assert utc_hour in (0, 1)

    open_ui(page, service, "#/schedules")
    cell = page.locator(f'#schedule-results tr[data-id="{schedule}"] .next-run time')
    expect(cell).to_have_attribute("datetime", next_run)
    expect(cell).to_have_text(re.compile(rf"^\d{{4}}-\d\d-\d\d {utc_hour:02d}:30:00 UTC$"))
    expect(page.locator("#zone-button")).to_have_text("Times: UTC")
    page.screenshot(path=str(tmp_path / "schedules-utc.png"), full_page=True)

    page.click("#zone-button")
    expect(page.locator("#zone-button")).to_have_text("Times: Europe/Berlin")
    cell = page.locator(f'#schedule-results tr[data-id="{schedule}"] .next-run time')
    expect(cell).to_have_text(re.compile(rf"^\d{{4}}-\d\d-\d\d {local_hour:02d}:30:00 CES?T$"))
    page.screenshot(path=str(tmp_path / "schedules-local.png"), full_page=True)

    page.reload()
    cell = page.locator(f'#schedule-results tr[data-id="{schedule}"] .next-run time')
    expect(cell).to_have_text(re.compile(r" 02:30:00 CES?T$"))
    page.goto(f"{service.base_url}/ui#/overview")
    expect(page.locator("#chart-zone")).to_have_text(re.compile(r"^\(times in CES?T\)$"))
    page.click("#zone-button")  # back to UTC, for the next test in this context's storage
    expect(page.locator("#chart-zone")).to_have_text("(times in UTC)")
    expect(page.locator("#due-summary")).to_be_visible()
    page.screenshot(path=str(tmp_path / "overview-utc.png"), full_page=True)


def test_every_shown_time_names_its_zone(page: Any, service: Service, api: httpx.Client,
                                         receiver: ThreadedReceiver) -> None:
    """Tasks list, task page: every <time> ends with its zone."""
    key = f"zoned-{uid()}"
    create(api, key, receiver.url("/zoned"), delay=3600)
    open_ui(page, service, f"#/tasks?status=scheduled&prefix={key}")
    times = page.locator(f'#task-results tr[data-key="{key}"] time')
    expect(times).to_have_count(2)  # execute at, next attempt
    for i in range(2):
        expect(times.nth(i)).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
    page.goto(f"{service.base_url}/ui#/task/{key}")
    times = page.locator("#task-detail time")
    expect(times.first).to_be_visible()
    assert times.count() >= 3  # execute at, next attempt, created
    for text in times.all_inner_texts():
        assert text.endswith(" UTC"), text


def test_callbacks_per_second_window_is_never_zero(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        tmp_path: Path) -> None:
    """The card's window is the time between two samples of at least 2 s; a refresh sooner
    (changing the range refreshes at once) keeps the older sample instead of showing
    "over the last 0 s"."""
    for i in range(20):
        create(api, f"rate-{uid()}-{i}", receiver.url("/rate"), delay=i / 4)
    open_ui(page, service, "#/overview")
    note = page.locator("#rate-note")
    expect(note).to_have_text(re.compile(r"^over the last \d+(\.\d)? s$"), timeout=20_000)
    first = float(note.inner_text().split()[3])
    assert first >= 2, note.inner_text()
    page.select_option("#range", "60")  # an immediate refresh, well under 2 s after the last
    expect(page.locator("#due-summary")).to_contain_text("next 60 minutes")
    shown = float(note.inner_text().split()[3])
    assert shown >= 2, note.inner_text()
    page.screenshot(path=str(tmp_path / "overview-rate.png"), full_page=True)


def test_a_task_created_with_a_past_execute_at_is_not_late(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        tmp_path: Path) -> None:
    """A task whose execute_at was 39 hours before its creation is sent at once: the lateness
    card does not show "> 300 s" (the histogram counts it from its creation)."""
    before = api.get("/stats").json()["lateness"]["first"]
    key = f"past-{uid()}"
    create(api, key, receiver.url("/past"), execute_at=time.time() - 39 * 3600)
    settle(lambda: status_of(api, key) == "succeeded", 20.0, f"{key} to be delivered")
    after = api.get("/stats").json()["lateness"]["first"]
    assert after["count"] == before["count"] + 1
    assert after["sum"] - before["sum"] < 5, after  # it was 140,400 s when counted from execute_at

    open_ui(page, service, "#/overview")
    card = page.locator("#lateness")
    expect(card).to_have_text(re.compile(r"\d s$|ms$"))
    # Counted from its execute_at, the 39 hours landed past the last bucket: "> 300 s".
    assert ">" not in card.inner_text(), card.inner_text()
    page.screenshot(path=str(tmp_path / "overview-lateness.png"), full_page=True)


def test_cut_urls_show_in_full_on_hover(page: Any, service: Service, api: httpx.Client,
                                        receiver: ThreadedReceiver) -> None:
    """The schedules table cuts a long callback URL (ellipsis) and carries it whole in the
    cell's title; the task page shows the whole URL."""
    schedule = f"long-{uid()}"
    url = receiver.url("/hooks/" + "a-rather-long-path-segment/" * 8 + "end?tenant=acme")
    assert api.put(f"/schedules/{schedule}", json={
        "every": 3600, "task": {"callback_url": url}}).status_code == 201
    open_ui(page, service, "#/schedules")
    cell = page.locator(f'#schedule-results tr[data-id="{schedule}"] td.clip')
    expect(cell).to_have_attribute("title", f"POST {url}")
    assert cell.evaluate("el => el.scrollWidth > el.clientWidth"), "the URL was not cut"
    cell.hover()

    key = f"long-{uid()}"
    create(api, key, url, delay=3600)
    page.goto(f"{service.base_url}/ui#/task/{key}")
    expect(page.locator("#task-detail")).to_contain_text(f"POST {url}")


def test_the_task_page_shows_the_request(page: Any, service: Service, api: httpx.Client,
                                         receiver: ThreadedReceiver, tmp_path: Path) -> None:
    """Headers, body, timeout, retry backoff and flow of a task, as the API's view has them."""
    key = f"request-{uid()}"
    create(api, key, receiver.url("/request"), delay=3600, headers={"X-Tenant": "acme"},
           body={"invoice": 42, "lines": [1, 2]}, timeout=7.5, retry_backoff=3,
           flow_key="tenant-acme")
    view = api.get(f"/tasks/{key}").json()
    # What will be sent: the task's headers and the Content-Type its JSON body gets.
    assert view["headers"] == {"X-Tenant": "acme", "Content-Type": "application/json"}, view

    open_ui(page, service, f"#/task/{key}")
    section = page.locator("#task-request")
    expect(section.locator("#task-headers")).to_contain_text("X-Tenant")
    expect(section.locator("#task-headers")).to_contain_text("acme")
    expect(section.locator("#task-headers")).to_contain_text("application/json")
    expect(section.locator("#task-body")).to_have_text(
        '{\n  "invoice": 42,\n  "lines": [\n    1,\n    2\n  ]\n}')
    expect(section).to_contain_text("7.5 s per attempt")
    expect(section).to_contain_text("3 s before the first retry")
    expect(section.locator("#task-flow")).to_have_text("tenant-acme")
    page.screenshot(path=str(tmp_path / "task-request.png"), full_page=True)

    text_key = f"request-text-{uid()}"
    create(api, text_key, receiver.url("/request"), delay=3600, method="GET")
    page.goto(f"{service.base_url}/ui#/task/{text_key}")
    expect(page.locator("#task-request")).to_contain_text("GET ")
    expect(page.locator("#task-request")).to_contain_text("none")  # no headers, no body


def test_the_flows_page_does_not_refresh_a_question_away(
        page: Any, service: Service, api: httpx.Client) -> None:
    """The flows page refreshes every 5 s, but not while "Back to the defaults?" waits for its
    answer (a refresh used to redraw the row and take the question away under the click).
    Control: once answered "No", the same wait shows a flow added meanwhile."""
    tag = uid()
    shown, added = f"shown-{tag}", f"added-{tag}"
    assert api.put(f"/flows/{shown}", json={"parallelism": 5}).status_code == 200
    open_ui(page, service, "#/flows")
    row = page.locator(f'#flow-results tr[data-key="{shown}"]')
    row.get_by_role("button", name="Reset").click()
    expect(row.get_by_role("button", name="Yes")).to_be_visible()
    assert api.put(f"/flows/{added}", json={"parallelism": 2}).status_code == 200

    page.wait_for_timeout(REFRESH_WAIT_MS)  # more than one refresh period
    assert row.get_by_role("button", name="Yes").is_visible()
    assert page.locator(f'#flow-results tr[data-key="{added}"]').count() == 0

    row.get_by_role("button", name="No").click()
    page.wait_for_timeout(REFRESH_WAIT_MS)  # the same wait: a refresh does happen in it
    assert page.locator(f'#flow-results tr[data-key="{added}"]').count() == 1
    assert api.get(f"/flows/{shown}").json()["parallelism"] == 5  # nothing was reset
