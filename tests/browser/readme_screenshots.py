"""Makes the README's dashboard screenshots (docs/img/dashboard-*.png) from a real service
with made-up but plausible data. Not a test; run it by hand after changing the dashboard:

    python3 -m tests.browser.readme_screenshots docs/img

It starts its own redis-server, `timewheel serve` (with a token) and receiver on loopback, and
drives Debian's Chromium like the browser tests do.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import expect, sync_playwright

from tests.browser.conftest import CHROMIUM_ARGS, TOKEN, chromium_path
from tests.e2e.conftest import Service
from tests.support.receiver import Reply, ThreadedReceiver
from tests.support.redis_server import RedisServer

VIEWPORT = {"width": 1100, "height": 680}


def seed(api: httpx.Client, receiver: ThreadedReceiver) -> None:
    rng = random.Random(7)
    receiver.respond("/hooks/broken", [400])
    receiver.respond("/hooks/slow", [Reply(200, delay=0.05)])
    tasks = []
    for i in range(420):  # reminders spread over the coming hours, most of them soon
        delay = 60 + rng.expovariate(1 / 2700)
        if delay < 3 * 3600:
            tasks.append({"key": f"invoice-{1000 + i}-reminder", "delay": delay,
                          "callback_url": receiver.url("/hooks/reminder")})
    for i in range(90):  # a report batch at the top of the hour
        tasks.append({"key": f"report-2026-11-{i:03d}", "delay": 3600 - time.time() % 3600 + i,
                      "callback_url": receiver.url("/hooks/report")})
    for i in range(150):  # due now and over the next minute: callbacks per second, lateness
        tasks.append({"key": f"ping-{i}", "delay": i / 2.5,
                      "callback_url": receiver.url("/hooks/slow")})
    for start in range(0, len(tasks), 1000):
        assert api.post("/tasks/batch", json={"tasks": tasks[start:start + 1000]}).is_success
    for name in ("order-7731-shipped", "order-7734-shipped", "signup-5521-welcome"):
        api.post("/tasks", json={
            "key": name, "callback_url": receiver.url("/hooks/broken"), "max_attempts": 3,
            "headers": {"X-Tenant": "acme"}, "flow_key": "tenant-acme", "timeout": 5,
            "body": {"order": name.split("-")[1], "event": name.split("-")[2]}})
    api.put("/flows/api.example.com:443", json={"parallelism": 10, "rate": 50})
    api.put("/flows/tenant-acme", json={"parallelism": 4})
    api.put("/flows/payments.internal:8443", json={
        "parallelism": 2, "rate": 0.5, "paused": True, "max_attempts": 30, "retry_backoff": 10,
        "max_backoff": 3600})
    api.put("/schedules/nightly-report", json={
        "cron": "30 2 * * *", "timezone": "Europe/Berlin",
        "task": {"callback_url": receiver.url("/hooks/report")}})
    api.put("/schedules/heartbeat", json={
        "every": 300, "task": {"callback_url": receiver.url("/hooks/heartbeat"), "method": "PUT"}})
    api.put("/schedules/weekly-digest", json={
        "cron": "0 8 * * 1", "timezone": "America/New_York", "paused": True,
        "task": {"callback_url": receiver.url("/hooks/digest")}})


def main(out: Path) -> None:
    chromium = chromium_path()
    if chromium is None:
        sys.exit("no Chromium: apt-get install chromium")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp) / "redis") as redis_server, \
            ThreadedReceiver() as receiver:
        service = Service(Path(tmp), redis_server.url, api_tokens=TOKEN).start()
        try:
            with httpx.Client(base_url=service.base_url, timeout=10,
                              headers={"Authorization": f"Bearer {TOKEN}"}) as api:
                seed(api, receiver)
                time.sleep(2)  # the broken ones fail, the first pings are sent
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport=VIEWPORT, timezone_id="Europe/Berlin")
                page.goto(f"{service.base_url}/ui")
                page.fill("#token-input", TOKEN)
                page.click("#token-save")
                expect(page.locator("#due-chart svg")).to_be_visible()
                expect(page.locator("#rate-note")).to_contain_text("over the last", timeout=15_000)
                page.screenshot(path=str(out / "dashboard-overview.png"))
                for name, fragment, ready, height in [
                    ("task", "#/task/order-7731-shipped", "#task-request", 900),
                    ("dead-letters", "#/dead-letters", "#dead-results table", 390),
                    ("flows", "#/flows", "#flow-results table", 390),
                    ("schedules", "#/schedules", "#schedule-results table", 390),
                ]:
                    page.goto(f"{service.base_url}/ui{fragment}")
                    expect(page.locator(ready)).to_be_visible()
                    page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
                    page.screenshot(path=str(out / f"dashboard-{name}.png"))
                browser.close()
        finally:
            service.kill()
    for png in sorted(out.glob("dashboard-*.png")):
        print(f"{png} {png.stat().st_size // 1024} KB")  # noqa: T201


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
