"""The overview's due summary counts in words a reader expects: a wheel with one task due
(a first try of the README) read "1 tasks due in the next 180 minutes". A module of its own,
so its service (one per module) holds only the task seeded here."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import create, open_ui
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect


def test_one_task_due_is_one_task(page: Any, service: Service, api: httpx.Client,
                                  receiver: ThreadedReceiver) -> None:
    create(api, "due-summary-1", receiver.url("/due"), delay=1800)
    open_ui(page, service)
    summary = page.locator("#due-summary")
    expect(summary).to_contain_text("1 task due in the next 180 minutes")
    assert "tasks" not in summary.inner_text()
    # A second one: the plural again.
    create(api, "due-summary-2", receiver.url("/due"), execute_at=time.time() + 1800)
    page.reload()
    expect(summary).to_contain_text("2 tasks due in the next 180 minutes", timeout=15_000)
