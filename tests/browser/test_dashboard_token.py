"""The token dialog when the token is wrong or the user will not give one, in a real headless
Chromium against a real `timewheel serve` with tokens set. Screenshots go to the test's tmp
dir."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import TOKEN, HeldFirstAuth
from tests.browser.test_dashboard import enter_token
from tests.e2e.conftest import Service

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect

# Counts the times the page opens a dialog (the token dialog is the page's only one).
COUNT_PROMPTS = """
window.__prompts = 0;
const showModal = HTMLDialogElement.prototype.showModal;
HTMLDialogElement.prototype.showModal = function () {
  window.__prompts += 1;
  return showModal.call(this);
};
"""
# What each page calls on its 5 s refresh (page-overview.js, page-flows.js REFRESH_MS).
REFRESHED = {"#/overview": "/stats/due", "#/flows": "/flows"}


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


def test_a_call_refused_after_a_cancel_does_not_ask_again(page: Any, service: Service) -> None:
    """The page's first calls go out together without a token; the first 401 opens the dialog
    and the user cancels it. Another of them answered 401 only after that Cancel (a loaded
    machine) had its answer already: it fails, without a second dialog."""
    held = HeldFirstAuth(page)
    page.goto(f"{service.base_url}/ui#/tasks")
    expect(page.locator("#token-dialog")).to_be_visible()  # asked for by the Tasks page
    page.click("#token-cancel")
    expect(page.locator("#task-results")).to_contain_text("401")
    first = held.call()
    with page.expect_response(lambda r: r.url.endswith("/auth") and r.status == 401):
        first.continue_()
    page.wait_for_timeout(300)  # a second dialog would open now
    expect(page.locator("#token-dialog")).to_be_hidden()
    expect(page.locator("#token-button")).to_have_text("Token")


def test_a_refused_token_gets_no_check_mark(page: Any, service: Service,
                                            shot: Callable[[str], Path]) -> None:
    """After Cancel on "The token was refused", the header says "Token", not "Token ✓": the
    token in session storage was never accepted. The right token, entered from the header,
    gets the ✓ and the page."""
    page.goto(f"{service.base_url}/ui#/tasks")
    refuse_and_cancel(page)
    expect(page.locator("#task-results")).to_contain_text("401")
    expect(page.locator("#token-button")).to_have_text("Token")
    shot("refused-token-cancelled")

    page.click("#token-button")
    enter_token(page, TOKEN)
    expect(page.locator("#token-button")).to_have_text("Token ✓")
    expect(page.locator("#task-count")).to_be_visible()


@pytest.mark.parametrize("fragment", list(REFRESHED))
def test_after_a_cancel_the_background_refresh_does_not_ask_again(
        page: Any, service: Service, fragment: str, shot: Callable[[str], Path]) -> None:
    """Two 5 s refreshes, each answered 401, open no dialog after the user cancelled it; the
    header's Token button opens it, and the right token brings the page back."""
    page.add_init_script(COUNT_PROMPTS)
    refused: list[str] = []
    page.on("response", lambda r: refused.append(r.url)
            if r.status == 401 and REFRESHED[fragment] in r.url else None)
    page.goto(f"{service.base_url}/ui{fragment}")
    refuse_and_cancel(page)
    asked = page.evaluate("window.__prompts")
    seen = len(refused)
    for _ in range(150):  # two refreshes: 10 s and a bit
        if len(refused) >= seen + 2:
            break
        page.wait_for_timeout(100)
    assert len(refused) >= seen + 2, refused
    expect(page.locator("#token-dialog")).to_be_hidden()
    assert page.evaluate("window.__prompts") == asked
    expect(page.locator("#token-button")).to_have_text("Token")
    shot(f"{fragment.strip('#/')}-after-cancel")

    page.click("#token-button")
    enter_token(page, TOKEN)
    expect(page.locator("#token-button")).to_have_text("Token ✓")
    if fragment == "#/overview":
        expect(page.locator("#due-chart svg")).to_be_visible()
    else:
        expect(page.locator("#flow-results")).not_to_contain_text("401")
    expect(page.locator("#token-dialog")).to_be_hidden()


def test_the_chart_says_why_it_is_empty(page: Any, service: Service,
                                        shot: Callable[[str], Path]) -> None:
    """Without a token the Overview's chart panel shows the 401, not "Loading…" for ever."""
    page.goto(f"{service.base_url}/ui#/overview")
    expect(page.locator("#token-dialog")).to_be_visible()
    page.click("#token-cancel")
    chart = page.locator("#due-chart")
    expect(chart).to_contain_text("Could not load the due load: 401")
    expect(chart).not_to_contain_text("Loading")
    shot("overview-no-token")


CARDS = {"due-hour": "whole wheel", "in-flight": "attempts being sent", "rate": "",
         "lateness": "", "dead": "whole wheel"}


def test_cards_not_loaded_say_so(page: Any, service: Service,
                                 shot: Callable[[str], Path]) -> None:
    """Without a token (the dialog cancelled) each Overview card says it could not be loaded
    and why, not "…" as if still loading; the token entered from the header loads them."""
    page.goto(f"{service.base_url}/ui#/overview")
    expect(page.locator("#token-dialog")).to_be_visible()
    page.click("#token-cancel")
    expect(page.locator("#overview-error")).to_contain_text("401")
    for card in CARDS:
        expect(page.locator(f"#{card}")).to_have_text("—")
        expect(page.locator(f"#{card}-note")).to_have_text("not loaded: 401")
        expect(page.locator(f"#{card}-note")).to_have_attribute("title", re.compile("401: .+"))
    shot("overview-cards-not-loaded")

    page.click("#token-button")
    enter_token(page, TOKEN)
    expect(page.locator("#due-chart svg")).to_be_visible()
    for card, note in CARDS.items():
        expect(page.locator(f"#{card}")).not_to_have_text("—")
        expect(page.locator(f"#{card}-note")).not_to_contain_text("not loaded")
        if note:
            expect(page.locator(f"#{card}-note")).to_contain_text(note)
    expect(page.locator("#in-flight")).to_have_text("0")
    shot("overview-cards-loaded")
