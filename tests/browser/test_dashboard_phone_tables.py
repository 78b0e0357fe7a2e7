"""Every dashboard table on a phone (390 px), in a real headless Chromium against a real
`timewheel serve`: the page does not scroll sideways, each row is a block whose cells are named
by their column, its buttons on the screen, and the table keeps its table semantics for screen
readers (roles said by the table itself, and Chromium's accessibility tree). At a desktop's
width the same tables are laid out as tables. Screenshots go to the test's tmp dir."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
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

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1200, "height": 800}
ROLES = {"table": "table", "thead": "rowgroup", "tbody": "rowgroup", "tr": "row",
         "th": "columnheader", "td": "cell"}

# Each data cell: its column's name (the header's text) and the label shown before it (the
# first string of its ::before content, None when there is none).
CELLS = """table => {
  const headers = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
  return [...table.querySelectorAll("tbody tr")].map((tr) => [...tr.children].map((td, i) => {
    const shown = /^"((?:[^"\\\\]|\\\\.)*)"/.exec(getComputedStyle(td, "::before").content);
    return [headers[i], shown ? shown[1] : null];
  }));
}"""


def dead_letter(api: httpx.Client, receiver: ThreadedReceiver, key: str) -> None:
    """`key` fails for good on a 400; its receiver answers 200 to a replay."""
    receiver.respond(f"/{key}", [400, 200])
    create(api, key, receiver.url(f"/{key}"), max_attempts=3)
    settle(lambda: status_of(api, key) == "failed", 20.0, f"{key} to fail")


def assert_no_sideways_scroll(page: Any) -> None:
    scroll, client = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll <= client, f"the page is {scroll} px wide in {client} px"
    for wrap in page.locator(".table-wrap").all():
        scroll, client = wrap.evaluate("w => [w.scrollWidth, w.clientWidth]")
        assert scroll <= client, f"a table is {scroll} px wide in {client} px"


def assert_cells_labelled(table: Any, headings: Iterable[str]) -> None:
    """Each cell shows its column's name before it, but the row's heading cells (its key, the
    status badge beside it) and the buttons' column (no name)."""
    headings = set(headings)
    rows = table.evaluate(CELLS)
    assert rows
    for cells in rows:
        labelled = [(column, label) for column, label in cells if column and column not in headings]
        assert labelled, cells
        for column, label in labelled:
            assert label == column, f"the {column!r} cell shows {label!r}"


def assert_table_roles(page: Any, selector: str) -> None:
    """The table `selector` and its parts say their roles (WebKit has taken a table's semantics
    away when CSS changed its display), and Chromium's accessibility tree has those roles; a
    cell's shown label is not in its name (a screen reader says the column's header)."""
    table = page.locator(selector)
    parts = table.evaluate("""t => [t, ...t.querySelectorAll("thead, tbody, tr, th, td")]
      .map((e) => [e.localName, e.getAttribute("role")])""")
    assert [role for _, role in parts] == [ROLES[name] for name, _ in parts], parts
    cdp = page.context.new_cdp_session(page)
    try:
        root = cdp.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        every = ", ".join(f"{selector} {part}" for part in ("thead", "tbody", "tr", "th", "td"))
        ids = cdp.send("DOM.querySelectorAll", {"nodeId": root,
                                                "selector": f"{selector}, {every}"})["nodeIds"]
        assert len(ids) == len(parts)
        for node_id in ids:
            node = cdp.send("DOM.describeNode", {"nodeId": node_id})["node"]
            tree = cdp.send("Accessibility.getPartialAXTree", {
                "backendNodeId": node["backendNodeId"], "fetchRelatives": False})
            role, name = tree["nodes"][0].get("role", {}).get("value"), node["localName"]
            assert role == ROLES[name], f"Chromium makes a {name} a {role}"
            label = dict(zip(node.get("attributes", [])[::2], node.get("attributes", [])[1::2],
                             strict=True)).get("data-label")
            read = tree["nodes"][0].get("name", {}).get("value", "")
            assert not (label and read.startswith(label)), f"{read!r} is read with its label"
    finally:
        cdp.detach()


def read_as(page: Any, selector: str) -> tuple[str, str | None]:
    """What Chromium's accessibility tree gives a screen reader for the element `selector`:
    its name and its description."""
    cdp = page.context.new_cdp_session(page)
    try:
        root = cdp.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        node_id = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        node = cdp.send("DOM.describeNode", {"nodeId": node_id})["node"]
        [ax, *_] = cdp.send("Accessibility.getPartialAXTree", {
            "backendNodeId": node["backendNodeId"], "fetchRelatives": False})["nodes"]
        return ax.get("name", {}).get("value", ""), ax.get("description", {}).get("value")
    finally:
        cdp.detach()


def assert_reachable(page: Any, selector: str) -> None:
    """Every button, link and box in the table (if any) is within the screen's width."""
    width = page.viewport_size["width"]
    for control in page.locator(selector).locator("button:visible, a:visible, input:visible").all():
        box = control.bounding_box()
        assert 0 <= box["x"] and box["x"] + box["width"] <= width, (
            f"{control.evaluate('e => e.outerHTML')} is off the screen")


def assert_phone_table(page: Any, selector: str, headings: Iterable[str]) -> None:
    assert_no_sideways_scroll(page)
    assert_cells_labelled(page.locator(selector), headings)
    assert_table_roles(page, selector)
    assert_reachable(page, selector)


def assert_desktop_table(page: Any, selector: str) -> None:
    """At a desktop's width the table is a table: its header row shown, no label before a
    cell, and its roles the same."""
    page.set_viewport_size(DESKTOP)
    table = page.locator(selector)
    assert table.evaluate("t => getComputedStyle(t).display") == "table"
    expect(table.locator("thead th").nth(1)).to_be_visible()
    assert all(label is None for cells in table.evaluate(CELLS) for _, label in cells)
    assert_table_roles(page, selector)


def test_tasks_on_a_phone(page: Any, service: Service, api: httpx.Client,
                          receiver: ThreadedReceiver, shot: Callable[[str], Path]) -> None:
    """The tasks list was stacked first (test_dashboard_layout.py): it says its roles too."""
    prefix = f"p{uid()}"
    create(api, f"{prefix}-invoice-42-reminder", receiver.url("/phone"), delay=3600)
    page.set_viewport_size(PHONE)
    open_ui(page, service, f"#/tasks?status=scheduled&prefix={prefix}")
    expect(page.locator("#task-results tbody tr")).to_have_count(1)
    shot("phone-tasks")
    assert_phone_table(page, "#task-results table", headings=["Key", "Status"])
    assert_desktop_table(page, "#task-results table")
    shot("desktop-tasks")

def test_dead_letters_on_a_phone(page: Any, service: Service, api: httpx.Client,
                                 receiver: ThreadedReceiver,
                                 shot: Callable[[str], Path]) -> None:
    key = f"dead-{uid()}-order-7731-shipped"
    dead_letter(api, receiver, key)
    page.set_viewport_size(PHONE)
    open_ui(page, service, "#/dead-letters")
    expect(page.locator(f'#dead-results tr[data-key="{key}"]')).to_contain_text("400")
    shot("phone-dead-letters")
    assert_phone_table(page, "#dead-results table", headings=["Key", "Select all"])
    # Said once: a title on the box itself was read again as its description.
    assert read_as(page, "#select-all") == ("Select all", None)
    assert_desktop_table(page, "#dead-results table")
    shot("desktop-dead-letters")
    assert read_as(page, "#select-all") == ("Select all", None)
    assert page.locator("label.select-all").get_attribute("title") == "Select all"  # on hover


def test_schedules_on_a_phone(page: Any, service: Service, api: httpx.Client,
                              receiver: ThreadedReceiver, shot: Callable[[str], Path]) -> None:
    tag = uid()
    hourly, nightly = f"hourly-{tag}", f"nightly-report-{tag}"
    assert api.put(f"/schedules/{hourly}", json={
        "every": 3600, "task": {"callback_url": receiver.url("/hourly")}}).status_code == 201
    assert api.put(f"/schedules/{nightly}", json={
        "cron": "30 2 * * *", "timezone": "Europe/Berlin",
        "task": {"callback_url": receiver.url(f"/hooks/reports/nightly/{tag}?format=pdf")},
    }).status_code == 201
    assert api.post(f"/schedules/{hourly}/pause").status_code == 200
    page.set_viewport_size(PHONE)
    open_ui(page, service, "#/schedules")
    expect(page.locator(f'#schedule-results tr[data-id="{nightly}"]')).to_contain_text(
        "Europe/Berlin")
    expect(page.locator(f'#schedule-results tr[data-id="{hourly}"] .badge')).to_have_text(
        "paused")
    shot("phone-schedules")
    assert_phone_table(page, "#schedule-results table", headings=["Schedule", "State"])
    assert_desktop_table(page, "#schedule-results table")
    shot("desktop-schedules")


def test_flows_on_a_phone(page: Any, service: Service, api: httpx.Client,
                          shot: Callable[[str], Path]) -> None:
    tag = uid()
    limited, paused = f"api-{tag}.example.com:443", f"payments-{tag}.internal:8443"
    assert api.put(f"/flows/{limited}", json={"parallelism": 10, "rate": 50}).status_code == 200
    assert api.put(f"/flows/{paused}", json={
        "parallelism": 2, "rate": 0.5, "paused": True, "max_attempts": 30, "retry_backoff": 10,
        "max_backoff": 3600}).status_code == 200
    page.set_viewport_size(PHONE)
    open_ui(page, service, "#/flows")
    row = page.locator(f'#flow-results tr[data-key="{paused}"]')
    expect(row.locator(".state")).to_have_text("paused")
    shot("phone-flows")
    assert_phone_table(page, "#flow-results table", headings=["Flow", "State"])
    # Its "Reset" question and an open edit fit too.
    row.get_by_role("button", name="Reset").click()
    expect(row.get_by_role("button", name="No")).to_be_visible()
    assert_reachable(page, "#flow-results table")
    row.get_by_role("button", name="No").click()
    row.get_by_role("button", name="Edit").click()
    expect(row.locator(".edit-parallelism")).to_have_value("2")
    shot("phone-flows-editing")
    assert_phone_table(page, "#flow-results table", headings=["Flow", "State"])
    row.get_by_role("button", name="Cancel").click()
    assert_desktop_table(page, "#flow-results table")
    shot("desktop-flows")


def test_topics_on_a_phone(page: Any, service: Service, api: httpx.Client,
                           receiver: ThreadedReceiver, shot: Callable[[str], Path]) -> None:
    name = f"orders-{uid()}"
    endpoints = [{"name": "billing", "url": receiver.url("/hooks/billing/orders"),
                  "headers": {"X-Team": "billing", "X-Signature-Version": "2"}},
                 {"name": "email", "url": receiver.url("/hooks/email")}]
    assert api.put(f"/topics/{name}", json={"endpoints": endpoints}).status_code == 201
    for key in ("order-7731", "order-7734"):
        answer = api.post(f"/topics/{name}/publish", json={"key": key, "delay": 3600})
        assert answer.status_code == 201, answer.text
    page.set_viewport_size(PHONE)
    open_ui(page, service, "#/topics")
    expect(page.locator(f"#topic-results tr[data-name='{name}']")).to_contain_text(
        "2: billing, email")
    shot("phone-topics")
    assert_phone_table(page, "#topic-results table", headings=["Topic"])
    assert_desktop_table(page, "#topic-results table")
    shot("desktop-topics")

    page.set_viewport_size(PHONE)
    page.locator(f"#topic-results tr[data-name='{name}'] a").click()
    publishes = page.locator("#topic-detail tr[data-publish]")
    expect(publishes).to_have_count(2)
    shot("phone-topic")
    endpoints_table = "#topic-detail table:has(tr[data-endpoint])"
    publishes_table = "#topic-detail table:has(tr[data-publish])"
    assert_phone_table(page, endpoints_table, headings=["Endpoint"])
    assert_phone_table(page, publishes_table, headings=["Publish"])
    assert_desktop_table(page, endpoints_table)
    assert_desktop_table(page, publishes_table)
    shot("desktop-topic")


def test_select_a_dead_letter_on_a_phone_and_replay_it(
        page: Any, service: Service, api: httpx.Client, receiver: ThreadedReceiver,
        shot: Callable[[str], Path], tmp_path: Path) -> None:
    """On a phone the selection is a box a finger can hit before each key, "Select all" is
    shown, and "Replay selected" stays on the screen while the user scrolls down the list to
    pick a row further down."""
    tag = uid()
    keys = [f"pick-{tag}-signup-{i}-welcome" for i in range(6)]
    for key in keys:
        dead_letter(api, receiver, key)
    page.set_viewport_size(PHONE)
    open_ui(page, service, "#/dead-letters")
    for key in keys:
        expect(page.locator(f'#dead-results tr[data-key="{key}"]')).to_be_visible()
    select_all = page.get_by_role("checkbox", name="Select all")
    expect(select_all).to_be_visible()
    button = page.locator("#replay-selected")

    picked = keys[0]  # the oldest: the last row
    row = page.locator(f'#dead-results tr[data-key="{picked}"]')
    box = row.get_by_role("checkbox", name=f"select {picked}")
    box.scroll_into_view_if_needed()
    size = box.bounding_box()
    assert size["width"] >= 20 and size["height"] >= 20, f"the box is {size}"
    key_box = row.locator("a.key").bounding_box()
    assert size["x"] + size["width"] <= key_box["x"], "the box is not before its key"
    assert abs((size["y"] + size["height"] / 2) - (key_box["y"] + key_box["height"] / 2)) < 12
    box.check()
    expect(button).to_have_text("Replay selected (1)")
    expect(button).to_be_in_viewport()  # scrolled down, and still in view
    assert page.evaluate("window.scrollY") > 0
    page.screenshot(path=str(tmp_path / "phone-dead-letters-selected-screen.png"))
    shot("phone-dead-letters-selected")
    assert_no_sideways_scroll(page)

    button.click()
    expect(page.locator("#notice")).to_contain_text(f"Replayed 1 task: {picked}")
    expect(row).to_have_count(0)
    settle(lambda: status_of(api, picked) == "succeeded", 20.0, f"{picked} to succeed")
    assert len(receiver.arrivals_for(f"/{picked}")) == 2
    assert all(status_of(api, key) == "failed" for key in keys[1:])
    shot("phone-dead-letters-replayed")

    select_all.check()
    expect(button).to_have_text(re.compile(r"Replay selected \(\d+\)"))
    assert page.locator("#dead-results tbody input.pick:checked").count() == (
        page.locator("#dead-results tbody tr").count())
