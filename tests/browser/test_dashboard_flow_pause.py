"""Pausing and resuming a flow from the dashboard (docs/api.md v3, "Flows: pause, retry
defaults, and what waiting counts"), in a real headless Chromium against a real `timewheel
serve` and a real receiver: the Flows page shows the pause, the waiting tasks and the retry
defaults; an edit of the limits keeps the pause and the defaults. (Which scopes see the
button: tests/browser/test_dashboard_scopes.py.)"""

from __future__ import annotations

import time
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


def test_pause_and_resume_a_flow(page: Any, service: Service, api: httpx.Client,
                                 receiver: ThreadedReceiver,
                                 shot: Callable[[str], Path]) -> None:
    flow = f"tenant-{uuid.uuid4().hex[:8]}"
    assert api.put(f"/flows/{flow}", json={"parallelism": 2, "max_attempts": 20,
                                           "retry_backoff": 30}).status_code == 200
    open_ui(page, service, "#/flows")
    row = page.locator(f'#flow-results tr[data-key="{flow}"]')
    expect(row.locator(".state")).to_have_text("running")
    expect(row.locator(".retries")).to_have_text("20 attempts, from 30 s")

    row.get_by_role("button", name="Pause").click()
    expect(row.locator(".state")).to_have_text("paused")
    assert api.get(f"/flows/{flow}").json()["paused"] is True

    path = f"/{flow}"
    due = time.time()
    keys = [f"{flow}-{i}" for i in range(3)]
    for i, key in enumerate(keys):
        assert api.post("/tasks", json={"key": key, "callback_url": receiver.url(path),
                                        "flow_key": flow, "execute_at": due + i / 10}
                        ).status_code == 201
    # The page refreshes every 5 s: the 3 due tasks show as waiting, and none went out.
    expect(row.locator(".waiting")).to_have_text("3", timeout=20_000)
    assert receiver.arrivals_for(path) == []

    # Editing the limits of a paused flow keeps it paused, with its retry defaults.
    row.get_by_role("button", name="Edit").click()
    row.locator(".edit-parallelism").fill("1")
    row.get_by_role("button", name="Save").click()
    expect(row.locator(".parallelism")).to_have_text("1")
    view = api.get(f"/flows/{flow}").json()
    assert (view["paused"], view["max_attempts"], view["retry_backoff"]) == (True, 20, 30.0)
    shot("flow-paused")

    row.get_by_role("button", name="Resume").click()
    expect(row.locator(".state")).to_have_text("running")
    receiver.wait_for_sync(3, timeout=30, path=path)
    assert [a.headers["webhook-id"] for a in receiver.arrivals_for(path)] == keys
    expect(row.locator(".waiting")).to_have_text("0", timeout=20_000)
    shot("flow-resumed")
