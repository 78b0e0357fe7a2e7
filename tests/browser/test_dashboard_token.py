"""The token dialog when the token is wrong or the user will not give one, in a real headless
Chromium against a real `timewheel serve` with tokens set. Screenshots go to the test's tmp
dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import TOKEN
from tests.browser.test_dashboard import enter_token
from tests.e2e.conftest import Service

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect


def refuse_and_cancel(page: Any) -> None:
    """A wrong token, refused; then Cancel on the dialog that asks again."""
    enter_token(page, "not-the-token")
    expect(page.locator("#token-reason")).to_contain_text("refused")
    page.click("#token-cancel")
    expect(page.locator("#token-dialog")).to_be_hidden()


def test_a_token_saved_from_the_header_draws_the_page_again(
        page: Any, service: Service, shot: Callable[[str], Path]) -> None:
    """The dialog cancelled, the page says 401; the token entered from the header's Token
    button (no call waiting for it) loads the page with it."""
    page.goto(f"{service.base_url}/ui#/tasks")
    expect(page.locator("#token-dialog")).to_be_visible()
    page.click("#token-cancel")
    expect(page.locator("#task-results")).to_contain_text("401")
    page.click("#token-button")
    enter_token(page, TOKEN)
    expect(page.locator("#task-count")).to_be_visible()
    expect(page.locator("#task-results")).not_to_contain_text("401")
    shot("tasks-token-from-the-header")
