"""The dashboard's topic pages: the list of topics, and one topic's endpoints and recent
publishes, each publish linking to its tasks. A screenshot of each goes to the test's tmp dir."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import open_ui
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect


def test_a_topic_page_lists_endpoints_and_recent_publishes(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        shot: Callable[[str], Path]) -> None:
    name = f"orders-{uuid.uuid4().hex[:6]}"
    endpoints = [{"name": "billing", "url": receiver.url("/billing"),
                  "headers": {"X-Team": "billing"}},
                 {"name": "email", "url": receiver.url("/email")}]
    assert api.put(f"/topics/{name}", json={"endpoints": endpoints}).status_code == 201
    for key in ("order-1", "order-2"):
        answer = api.post(f"/topics/{name}/publish", json={"key": key, "delay": 3600})
        assert answer.status_code == 201, answer.text

    open_ui(page, service, "#/topics")
    row = page.locator(f"#topic-results tr[data-name='{name}']")
    expect(row).to_contain_text("2: billing, email")
    shot("topics")

    row.locator("a").click()
    expect(page).to_have_url(f"{service.base_url}/ui#/topic/{name}")
    expect(page.locator("#nav a.active")).to_have_text("Topics")
    detail = page.locator("#topic-detail")
    expect(detail.locator("tr[data-endpoint='billing']")).to_contain_text("X-Team: billing")
    expect(detail.locator("tr[data-endpoint='email']")).to_contain_text(receiver.url("/email"))
    publishes = detail.locator("tr[data-publish]")
    expect(publishes).to_have_count(2)
    expect(publishes.first).to_have_attribute("data-publish", "order-2")  # newest first
    shot("topic")

    publishes.first.locator("a", has_text="order-2.email").click()
    expect(page.locator("main")).to_contain_text("order-2.email")
    expect(page.locator("main")).to_contain_text(receiver.url("/email"))
    shot("task-of-a-publish")
