"""The dashboard's layout at the edges, in a real headless Chromium against a real `timewheel
serve`: a long task key, a phone's width. Screenshots go to the test's tmp dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import create, open_ui, uid
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect

# ~100 characters, the longest run without a '-' 66 of them (the auditor's key).
LONG = ("a-very-long-key-name-for-layout-checking.with.many.segments.0123456789."
        "abcdefghijklmnopqrstuvwxyz")


@pytest.mark.parametrize("width", [1920, 1280])
def test_a_long_key_leaves_the_cancel_button_on_screen(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        width: int, shot: Callable[[str], Path]) -> None:
    """<main> is at most 1280 px wide: the key breaks where it must, and the table fits in it
    without scrolling sideways, its Cancel button in view."""
    prefix = f"wide-{uid()}"
    key = f"{prefix}-{LONG}"
    create(api, key, receiver.url("/wide"), delay=3600)
    create(api, f"{prefix}-short", receiver.url("/wide"), delay=3600)
    page.set_viewport_size({"width": width, "height": 800})
    open_ui(page, service, f"#/tasks?status=scheduled&prefix={prefix}")
    cancel = page.locator(f'#task-results tr[data-key="{key}"]').get_by_role("button",
                                                                             name="Cancel")
    expect(cancel).to_be_visible()
    wrap = page.locator("#task-results .table-wrap")
    scroll, client = wrap.evaluate("w => [w.scrollWidth, w.clientWidth]")
    assert scroll <= client, f"the table is {scroll} px wide in {client} px"
    assert cancel.bounding_box()["x"] + cancel.bounding_box()["width"] <= (
        wrap.bounding_box()["x"] + wrap.bounding_box()["width"])
    # The key is all there, on more lines than one.
    link = page.locator(f'#task-results tr[data-key="{key}"] a.key')
    expect(link).to_have_text(key)
    assert link.bounding_box()["height"] > 30
    shot(f"tasks-long-key-{width}")


def test_a_long_key_on_a_phone_wraps_in_a_readable_column(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        shot: Callable[[str], Path]) -> None:
    """At 390 px the table's rows are stacked, and its keys keep 20 characters a line (the
    row's width), not one or two; the task page's title breaks the key within the screen."""
    prefix = f"narrow-{uid()}"
    key = f"{prefix}-{LONG}"
    create(api, key, receiver.url("/narrow"), delay=3600)
    page.set_viewport_size({"width": 390, "height": 844})
    open_ui(page, service, f"#/tasks?status=scheduled&prefix={prefix}")
    link = page.locator(f'#task-results tr[data-key="{key}"] a.key')
    expect(link).to_have_text(key)
    char = page.evaluate("""() => { const probe = document.createElement("span");
      probe.className = "key"; probe.textContent = "0".repeat(20);
      document.body.append(probe); const width = probe.getBoundingClientRect().width;
      probe.remove(); return width / 20; }""")
    assert link.bounding_box()["width"] >= 19 * char
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shot("phone-tasks-long-key")

    page.goto(f"{service.base_url}/ui#/task/{key}")
    expect(page.locator("#task-detail .badge")).to_have_text("scheduled")
    title = page.locator("h1.key").bounding_box()
    assert title["x"] + title["width"] <= 390
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shot("phone-task-long-key")


def test_the_header_wraps_on_a_phone(page: Any, service: Service,
                                     shot: Callable[[str], Path]) -> None:
    """At 390 px nothing in the header sticks out of it or of the screen, nothing overlaps or
    is broken over two lines ("Dead / letters"), and the page does not scroll sideways."""
    page.set_viewport_size({"width": 390, "height": 844})
    open_ui(page, service, "#/tasks")
    expect(page.locator("#token-button")).to_have_text("Token ✓")
    expect(page.locator("#task-count")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    header = page.locator("header.top").bounding_box()
    assert header["width"] <= 390
    items = ["header.top .brand", *(f"#nav a >> nth={i}" for i in range(6)), "#health",
             "#zone-button", "#token-button"]
    boxes = {}
    for selector in items:
        box = page.locator(selector).bounding_box()
        assert box["x"] >= header["x"] and box["y"] >= header["y"], selector
        assert box["x"] + box["width"] <= header["x"] + header["width"], selector
        assert box["y"] + box["height"] <= header["y"] + header["height"], selector
        assert box["height"] < 36, f"{selector} is on more than one line"
        boxes[selector] = box
    for a, first in boxes.items():
        for b, second in boxes.items():
            if a < b:
                apart = (first["x"] + first["width"] <= second["x"] or
                         second["x"] + second["width"] <= first["x"] or
                         first["y"] + first["height"] <= second["y"] or
                         second["y"] + second["height"] <= first["y"])
                assert apart, f"{a} overlaps {b}"
    shot("phone-tasks")


def test_a_21_character_key_on_a_phone_stays_on_one_line_by_its_cancel_button(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        shot: Callable[[str], Path]) -> None:
    """At 390 px a key of 21 characters (a usual one: a prefix, a dash, an id) is on one line,
    not its last characters alone on a second, and each row's Cancel button is on the screen
    without scrolling the table sideways."""
    prefix = f"p{uid()}"
    # With a '-' and without; the first with wide letters, for its "Cancel <key>?" question.
    keys = [f"{prefix}-mmmmmmmmmmm", f"{prefix}{uid()}{uid()[:4]}"]
    assert [len(key) for key in keys] == [21, 21]
    for key in keys:
        create(api, key, receiver.url("/phone"), delay=3600)
    page.set_viewport_size({"width": 390, "height": 844})
    open_ui(page, service, f"#/tasks?status=scheduled&prefix={prefix}")
    line = page.evaluate("""() => { const probe = document.createElement("a");
      probe.className = "key"; probe.textContent = "0";
      document.body.append(probe); const height = probe.getBoundingClientRect().height;
      probe.remove(); return height; }""")
    for key in keys:
        expect(page.locator(f'#task-results tr[data-key="{key}"] a.key')).to_have_text(key)
    shot("phone-tasks-21-character-keys")
    for key in keys:
        row = page.locator(f'#task-results tr[data-key="{key}"]')
        link = row.locator("a.key")
        assert link.bounding_box()["height"] < 1.5 * line, f"{key} is on more than one line"
        cancel = row.get_by_role("button", name="Cancel")
        expect(cancel).to_be_visible()
        box = cancel.bounding_box()
        assert 0 <= box["x"] and box["x"] + box["width"] <= 390, f"{key}'s Cancel is off screen"
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    # Its question, "Cancel <key>? Yes No", is on the screen too.
    row = page.locator(f'#task-results tr[data-key="{keys[0]}"]')
    row.get_by_role("button", name="Cancel").click()
    no = row.get_by_role("button", name="No")
    expect(no).to_be_visible()
    wrap = page.locator("#task-results .table-wrap")
    scroll, client = wrap.evaluate("w => [w.scrollWidth, w.clientWidth]")
    assert scroll <= client, f"the table is {scroll} px wide in {client} px"
    box, right = no.bounding_box(), wrap.bounding_box()
    assert box["x"] + box["width"] <= right["x"] + right["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shot("phone-tasks-21-character-key-question")
    no.click()
    page.set_viewport_size({"width": 768, "height": 844})  # a tablet: a table, Cancel on screen
    cancel = page.locator(f'#task-results tr[data-key="{keys[0]}"]').get_by_role(
        "button", name="Cancel")
    assert cancel.bounding_box()["x"] + cancel.bounding_box()["width"] <= 768
    shot("tablet-tasks-21-character-keys")
