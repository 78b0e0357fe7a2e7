"""The task page's attempt timeline in a real headless Chromium against a real `timewheel serve`:
a history seeded in the service's Redis (one entry of each kind the engine writes) is shown
attempt by attempt, with times in the browser's zone and the response behind a disclosure; a
task never tried shows none, and one delivered by the service shows its attempt."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.browser.test_dashboard import create, open_ui, uid
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from timewheel.store import attempts
from timewheel.store.keys import Keyspace

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect

KEYS = Keyspace("tw")
T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z
BODY = '<b>Service Unavailable</b>: the upstream "orders" pool is full, ' + "x" * 40


def seed(service: Service, key: str, *entries: str) -> None:
    """Append history entries straight to the service's Redis, as the scripts do."""
    with redis.Redis.from_url(service.env["TIMEWHEEL_REDIS_URL"]) as conn:
        conn.rpush(KEYS.attempts(KEYS.bucket_of(key), key), *entries)


def test_the_task_page_shows_every_attempt(page: Any, service: Service, api: httpx.Client,
                                           receiver: ThreadedReceiver,
                                           shot: Callable[[str], Path]) -> None:
    key = f"history-{uid()}"
    create(api, key, receiver.url("/history"), delay=7200)
    seed(service, key,
         attempts.entry(attempt=1, started_ms=T0 + 5, duration_ms=412, verdict="retry",
                        status_code=503, error=None,
                        headers={"content-type": "text/html", "retry-after": "30",
                                 "x-request-id": "req-7f3a"},
                        body=BODY, body_truncated=True, next_attempt_ms=T0 + 30_417,
                        process="worker-a:4711"),
         attempts.entry(attempt=2, started_ms=T0 + 30_420, duration_ms=10_002, verdict="retry",
                        status_code=None, error="timed out after 10 s", headers=None, body=None,
                        body_truncated=False, next_attempt_ms=T0 + 92_000,
                        process="worker-b:88"),
         json.dumps({"n": 3, "o": "lost",
                     "e": "no outcome within its lease: its process died or stalled"}),
         attempts.entry(attempt=4, started_ms=T0 + 200_000, duration_ms=37, verdict="ok",
                        status_code=200, error=None, headers={"content-length": "11"},
                        body='{"ok":true}', body_truncated=False, next_attempt_ms=None,
                        process="worker-a:4711"))

    open_ui(page, service, f"#/task/{key}")
    items = page.locator("#attempts li.attempt")
    expect(items).to_have_count(4)
    expect(page.locator("#attempt-count")).to_have_text("4 kept, oldest first")
    assert [items.nth(i).get_attribute("data-attempt") for i in range(4)] == ["1", "2", "3", "4"]
    assert [items.nth(i).locator(".badge").inner_text() for i in range(4)] == [
        "retry", "retry", "lost", "delivered"]

    first = items.nth(0)
    head = first.locator(".attempt-head")
    expect(head).to_contain_text("#1")
    expect(head.locator("time")).to_have_text("2027-01-15 08:00:00.005 UTC")
    expect(head.locator("time")).to_have_attribute("datetime", "2027-01-15T08:00:00.005Z")
    expect(head).to_contain_text("HTTP 503")
    expect(head).to_contain_text("412 ms")
    expect(head).to_contain_text("worker-a:4711")
    expect(first.locator(".next")).to_have_text("next attempt at 2027-01-15 08:00:30.417 UTC")

    # The response is folded away until asked for; its markup is shown as text.
    body = first.locator(".response-body")
    expect(body).to_be_hidden()
    summary = first.locator(".response summary")
    expect(summary).to_have_text(f"Response ({len(BODY.encode())} bytes, cut)")
    summary.click()
    expect(body).to_be_visible()
    expect(body).to_have_text(BODY + "\n… (cut)")
    expect(first.locator(".response-headers")).to_contain_text("x-request-id")
    expect(first.locator(".response-headers")).to_contain_text("req-7f3a")
    assert first.locator(".response-body b").count() == 0

    second = items.nth(1).locator(".attempt-head")
    expect(second).to_contain_text("timed out after 10 s")
    expect(second).to_contain_text("10.0 s")
    expect(second).not_to_contain_text("HTTP")
    lost = items.nth(2)
    expect(lost.locator(".attempt-head time")).to_have_count(0)
    expect(lost).to_contain_text("time unknown")
    expect(lost).to_contain_text("its process died or stalled")
    expect(lost.locator(".response")).to_have_count(0)
    last = items.nth(3)
    expect(last.locator(".attempt-head")).to_contain_text("HTTP 200")
    expect(last.locator(".next")).to_have_count(0)
    shot("task-attempts")


def test_no_attempt_yet_then_a_delivered_one(page: Any, service: Service, api: httpx.Client,
                                             receiver: ThreadedReceiver) -> None:
    """A task never tried: no attempt. The control: a task the service delivers shows its
    attempt after Refresh, as the service wrote it."""
    key = f"fresh-{uid()}"
    create(api, key, receiver.url(f"/fresh-{key}"), delay=3)
    open_ui(page, service, f"#/task/{key}")
    expect(page.locator("#attempt-list")).to_have_text("No attempt yet.")
    expect(page.locator("#attempt-count")).to_have_text("")
    receiver.wait_for_sync(1, timeout=20, path=f"/fresh-{key}")
    page.click("#attempts-refresh")
    item = page.locator("#attempts li.attempt")
    expect(item).to_have_count(1, timeout=20_000)
    expect(item.locator(".badge")).to_have_text("delivered")
    expect(item.locator(".attempt-head")).to_contain_text("HTTP 200")



def test_times_are_shown_in_the_browsers_zone(browser: Any, service: Service, api: httpx.Client,
                                              receiver: ThreadedReceiver) -> None:
    """The same instant in a browser in New York: UTC by default (the dashboard's zone toggle),
    the browser's local time with its zone named once local is chosen; the UTC value stays in
    the element's datetime either way."""
    key = f"zone-{uid()}"
    create(api, key, receiver.url("/zone"), delay=7200)
    seed(service, key, json.dumps({"n": 1, "o": "retry", "s": T0 + 5, "d": 3, "c": 503,
                                   "na": T0 + 60_000, "p": "h:1"}))
    context = browser.new_context(timezone_id="America/New_York", locale="en-US")
    try:
        page = context.new_page()
        open_ui(page, service, f"#/task/{key}")
        head = page.locator("#attempts li.attempt .attempt-head time")
        expect(head).to_have_text("2027-01-15 08:00:00.005 UTC")
        page.evaluate("localStorage.setItem('timewheel.zone', 'local')")
        page.reload()
        expect(head).to_have_text("2027-01-15 03:00:00.005 EST")
        expect(head).to_have_attribute("datetime", "2027-01-15T08:00:00.005Z")
        expect(page.locator("#attempts .next")).to_have_text(
            "next attempt at 2027-01-15 03:01:00.000 EST")
    finally:
        context.close()
