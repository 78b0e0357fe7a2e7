"""The task page links its result callback (docs/api.md v3, "Result callbacks") in a real
headless Chromium against a real `timewheel serve`: a delivered task's page links the result
task `{key}.on_success`, whose page links back; the failure callback, which can no longer come,
says so. An open task names the result tasks still to come; a cancelled one, that neither will."""

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
    # It succeeded: no failure callback can come any more, and the page does not promise one.
    expect(page.locator("#task-request")).to_contain_text(
        f"POST {receiver.url('/result/failed')} — not posted: the task succeeded")
    expect(page.locator("#task-request")).not_to_contain_text("once it fails for good")
    expect(page.locator("#task-on-failure")).to_have_count(0)
    shot("task-with-result")

    link.click()
    expect(page.locator("h1.key")).to_have_text(f"{key}.on_success")
    expect(page.locator("#task-parent")).to_contain_text(f"Reports the outcome of {key}")
    expect(page.locator("#task-request")).to_contain_text(f"POST {receiver.url('/result/ok')}")
    page.locator("#task-parent a").click()
    expect(page.locator("h1.key")).to_have_text(key)


def test_an_open_task_names_its_result_tasks_an_ended_one_says_which_cannot_come(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        shot: Callable[[str], Path]) -> None:
    key = f"pending-{uid()}"
    create(api, key, receiver.url("/later"), delay=3600, on_success=receiver.url("/result/ok"),
           on_failure=receiver.url("/result/failed"))
    open_ui(page, service, f"#/task/{key}")
    request = page.locator("#task-request")
    expect(request).to_contain_text(f"posted by the task {key}.on_success once it delivered")
    expect(request).to_contain_text(f"posted by the task {key}.on_failure once it fails for good")

    page.locator("#task-detail").get_by_role("button", name="Cancel").click()
    page.locator("#task-detail").get_by_role("button", name="Yes").click()
    expect(page.locator("#task-detail .badge")).to_have_text("cancelled")
    expect(request).to_contain_text(
        f"POST {receiver.url('/result/ok')} — not posted: the task was cancelled")
    expect(request).to_contain_text(
        f"POST {receiver.url('/result/failed')} — not posted: the task was cancelled")
    expect(request).not_to_contain_text("posted by the task")
    shot("task-cancelled-with-results")

    failed = f"failing-{uid()}"
    receiver.respond(f"/{failed}", [400])
    create(api, failed, receiver.url(f"/{failed}"), max_attempts=1,
           on_success=receiver.url("/result/ok"), on_failure=receiver.url("/result/failed"))
    settle(lambda: status_of(api, failed) == "failed", 30, f"{failed} to fail")
    page.goto(f"{service.base_url}/ui#/task/{failed}")
    expect(page.locator("#task-on-failure")).to_have_text(f"{failed}.on_failure")
    expect(request).to_contain_text(
        f"POST {receiver.url('/result/ok')} — not posted: the task failed")
    shot("task-failed-with-results")
