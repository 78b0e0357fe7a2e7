"""The task page links its result callback (docs/api.md v3, "Result callbacks") in a real
headless Chromium against a real `timewheel serve`: a delivered task's page links the result
task `{key}.on_success`, whose page links back; the failure callback, not due, is named only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import create, open_ui, status_of, uid
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.waiting import settle

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect


def test_a_delivered_task_links_its_result(page: Any, service: Service, api: httpx.Client,
                                           receiver: ThreadedReceiver,
                                           shot: Callable[[str], Path]) -> None:
    key = f"result-{uid()}"
    create(api, key, receiver.url("/done"), on_success=receiver.url("/result/ok"),
           on_failure=receiver.url("/result/failed"))
    settle(lambda: status_of(api, key) == "succeeded", 30, f"{key} delivered")

    open_ui(page, service, f"#/task/{key}")
    link = page.locator("#task-on-success")
    expect(link).to_have_text(f"{key}.on_success")
    expect(page.locator("#task-request")).to_contain_text(f"POST {receiver.url('/result/ok')}")
    expect(page.locator("#task-request")).to_contain_text(
        f"posted by the task {key}.on_failure once it fails for good")
    expect(page.locator("#task-on-failure")).to_have_count(0)
    shot("task-with-result")

    link.click()
    expect(page.locator("h1.key")).to_have_text(f"{key}.on_success")
    expect(page.locator("#task-parent")).to_contain_text(f"Reports the outcome of {key}")
    expect(page.locator("#task-request")).to_contain_text(f"POST {receiver.url('/result/ok')}")
    page.locator("#task-parent a").click()
    expect(page.locator("h1.key")).to_have_text(key)
