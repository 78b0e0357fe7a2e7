"""Every dashboard table on a tablet (601 to 900 px wide), in a real headless Chromium against a
real `timewheel serve`: laid out as a table, a row a line (its cells side by side, not the
phone's stacked block), the page not scrolling sideways, each row's buttons on the screen and
big enough for a finger; a phone's width (400 px) still stacks the rows. Screenshots go to the
test's tmp dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import create, open_ui, uid
from tests.browser.test_dashboard_phone_tables import CELLS, assert_table_roles, dead_letter
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
expect = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'").expect

# Each body row: its height, and each cell's box (left, top, width, height) and display.
ROWS = """table => [...table.querySelectorAll("tbody tr")].map((tr) => ({
  height: tr.getBoundingClientRect().height,
  display: getComputedStyle(tr).display,
  cells: [...tr.children].map((td) => {
    const r = td.getBoundingClientRect();
    return [r.left, r.top, r.width, r.height, getComputedStyle(td).display];
  }),
}))"""


def assert_no_sideways_page_scroll(page: Any) -> None:
    scroll, client = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll <= client, f"the page is {scroll} px wide in {client} px"


def assert_laid_out_as_a_table(page: Any, selector: str, *, fits: bool = True,
                               tallest: float = 200) -> None:
    """The table is a table, its header row shown, each row one line of cells side by side
    (left to right, on the same band), no cell named by a label before it; and, if `fits`,
    all of it within its box (no scrolling sideways in it)."""
    table = page.locator(selector)
    assert table.evaluate("t => getComputedStyle(t).display") == "table"
    expect(table.locator("thead th").nth(1)).to_be_visible()
    rows = table.evaluate(ROWS)
    assert rows
    for row in rows:
        assert row["display"] == "table-row", row
        assert row["height"] <= tallest, f"a row {row['height']} px high: stacked? {row}"
        cells = row["cells"]
        assert all(display == "table-cell" for *_, display in cells), cells
        # (A table wider than its box keeps its buttons' column at the box's right edge.)
        lefts = [left for left, *_ in (cells if fits else cells[:-1])]
        assert lefts == sorted(set(lefts)), f"not side by side: {cells}"
        assert len({round(top) for _, top, *_ in cells}) == 1, f"not on one line: {cells}"
    assert all(label is None for cells in table.evaluate(CELLS) for _, label in cells)
    if fits:
        wrap = table.locator("xpath=..")
        scroll, client = wrap.evaluate("w => [w.scrollWidth, w.clientWidth]")
        assert scroll <= client, f"the table is {scroll} px wide in {client} px"


def assert_controls_reachable(page: Any, selector: str) -> None:
    """Every button, link and box in the table is on the screen (without scrolling sideways)
    and at least 24 px both ways."""
    width = page.viewport_size["width"]
    controls = page.locator(selector).locator("button:visible, a:visible, input:visible").all()
    assert controls
    for control in controls:
        box = control.bounding_box()
        html = control.evaluate("e => e.outerHTML")
        assert 0 <= box["x"] and box["x"] + box["width"] <= width, f"{html} is off the screen"
        assert box["width"] >= 24 and box["height"] >= 24, f"{html} is {box}"


def assert_stacked(page: Any, selector: str) -> None:
    """A phone's layout: each row a block (grid) of its own, the header row out of sight."""
    table = page.locator(selector)
    assert table.evaluate("t => getComputedStyle(t).display") == "block"
    assert all(row["display"] == "grid" for row in table.evaluate(ROWS))
    # The header row out of sight: 1 px, clipped (read by a screen reader all the same).
    assert table.locator("thead th").nth(1).evaluate("th => th.getBoundingClientRect().width") <= 1


@pytest.mark.parametrize("width", [768, 900])
def test_tasks_on_a_tablet_are_a_table(page: Any, service: Service, api: httpx.Client,
                                       receiver: ThreadedReceiver, width: int,
                                       shot: Callable[[str], Path]) -> None:
    """At 768 px (a tablet upright) and 900 px the tasks list is a table of one line a task
    (a time, a key of 30 characters over two or three), not the phone's cards of about 170 px
    a task; at 400 px it stacks."""
    prefix = f"t{uid()}"
    for i in range(3):
        create(api, f"{prefix}-invoice-{1040 + i}-reminder", receiver.url("/tablet"),
               delay=3600)
    page.set_viewport_size({"width": width, "height": 1024})
    open_ui(page, service, f"#/tasks?status=scheduled&prefix={prefix}")
    expect(page.locator("#task-results tbody tr")).to_have_count(3)
    shot(f"tablet-{width}-tasks")
    assert_laid_out_as_a_table(page, "#task-results table", tallest=100)
    assert_controls_reachable(page, "#task-results table")
    assert_no_sideways_page_scroll(page)
    assert_table_roles(page, "#task-results table")
    page.set_viewport_size({"width": 400, "height": 844})
    assert_stacked(page, "#task-results table")
    shot("phone-400-tasks")


def test_every_table_on_a_768_px_tablet(page: Any, service: Service, api: httpx.Client,
                                        receiver: ThreadedReceiver,
                                        shot: Callable[[str], Path]) -> None:
    """Dead letters, flows, schedules (a long callback URL shown whole), topics and a topic:
    tables within 768 px, the page not scrolling sideways, every button on the screen."""
    tag = uid()
    dead_letter(api, receiver, f"dead-{tag}-order-7731-shipped")
    assert api.put(f"/flows/payments-{tag}.internal:8443", json={
        "parallelism": 2, "rate": 0.5, "paused": True, "max_attempts": 30, "retry_backoff": 10,
        "max_backoff": 3600}).status_code == 200
    assert api.put(f"/schedules/invoices-monthly-{tag}", json={
        "cron": "0 6 1 * *", "timezone": "America/New_York",
        "task": {"callback_url": receiver.url(f"/hooks/billing/invoices/monthly?tenant={tag}")},
    }).status_code == 201
    topic = f"orders-{tag}"
    assert api.put(f"/topics/{topic}", json={"endpoints": [
        {"name": "billing", "url": receiver.url("/hooks/billing/orders"),
         "headers": {"X-Team": "billing"}},
        {"name": "email", "url": receiver.url("/hooks/email")}]}).status_code == 201
    assert api.post(f"/topics/{topic}/publish",
                    json={"key": "order-7731", "delay": 3600}).status_code == 201
    page.set_viewport_size({"width": 768, "height": 1024})
    for name, fragment, selector in [
        ("dead-letters", "#/dead-letters", "#dead-results table"),
        ("flows", "#/flows", "#flow-results table"),
        ("schedules", "#/schedules", "#schedule-results table"),
        ("topics", "#/topics", "#topic-results table"),
        ("topic", f"#/topic/{topic}", "#topic-detail table:has(tr[data-publish])"),
    ]:
        if name == "dead-letters":
            open_ui(page, service, fragment)
        else:
            page.goto(f"{service.base_url}/ui{fragment}")
        expect(page.locator(f"{selector} tbody tr").first).to_be_visible()
        shot(f"tablet-768-{name}")
        assert_laid_out_as_a_table(page, selector)
        assert_controls_reachable(page, selector)
        assert_no_sideways_page_scroll(page)
        if name == "flows":  # an open edit fits too
            page.locator("#flow-results button.edit").first.click()
            expect(page.locator("#flow-results .edit-parallelism")).to_be_visible()
            shot("tablet-768-flows-editing")
            assert_laid_out_as_a_table(page, selector)
            assert_controls_reachable(page, selector)
            page.locator("#flow-results tr.editing").get_by_role("button", name="Cancel").click()
    page.set_viewport_size({"width": 400, "height": 844})
    assert_stacked(page, "#topic-detail table:has(tr[data-publish])")


def test_a_table_too_wide_for_a_small_tablet_keeps_its_buttons_on_screen(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        shot: Callable[[str], Path]) -> None:
    """At 640 px the seven columns of a task do not fit: the table scrolls in its own box (the
    page does not), and its buttons' column stays at the right, on the screen."""
    prefix = f"s{uid()}"
    key = f"{prefix}-invoice-1040-reminder"
    create(api, key, receiver.url("/tablet"), delay=3600)
    page.set_viewport_size({"width": 640, "height": 960})
    open_ui(page, service, f"#/tasks?status=scheduled&prefix={prefix}")
    expect(page.locator(f'#task-results tr[data-key="{key}"]')).to_be_visible()
    assert_laid_out_as_a_table(page, "#task-results table", fits=False, tallest=120)
    assert_no_sideways_page_scroll(page)
    assert_controls_reachable(page, "#task-results table")
    shot("tablet-640-tasks")
