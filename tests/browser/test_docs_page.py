"""/docs in a real headless Chromium with every request to anything but the service refused:
Swagger UI comes from the service itself (the fastapi-offline package), not a CDN, so the page
renders its operations offline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Service

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


def offline(page: Any, service: Service) -> list[str]:
    """Abort every request that does not go to the service; returns the URLs refused."""
    refused: list[str] = []

    def route(handle: Any) -> None:
        if handle.request.url.startswith(service.base_url + "/"):
            handle.continue_()
        else:
            refused.append(handle.request.url)
            handle.abort()

    page.route("**/*", route)
    return refused


def test_docs_renders_every_operation_offline(page: Any, service: Service,
                                              shot: Callable[[str], Path]) -> None:
    refused = offline(page, service)
    fetched: list[str] = []
    page.on("requestfinished", lambda request: fetched.append(request.url))
    page.goto(f"{service.base_url}/docs")
    page.locator(".opblock").first.wait_for()
    operations = {
        (block.locator(".opblock-summary-method").inner_text().strip(),
         block.locator(".opblock-summary-path").inner_text().strip().replace("\u200b", ""))
        for block in page.locator(".opblock").all()}
    assert {("POST", "/tasks"), ("GET", "/tasks/{key}"), ("PATCH", "/tasks/{key}"),
            ("PUT", "/flows/{flow_key}"), ("GET", "/schedules")} <= operations
    assert page.locator(".info .title").inner_text().startswith("timewheel")
    path = shot("docs")
    assert path.stat().st_size > 10_000
    assert refused == []  # the page asked for nothing outside the service
    assert f"{service.base_url}/docs/assets/swagger-ui-bundle.js" in fetched


def test_the_control_a_cdn_page_stays_blank_offline(browser: Any, service: Service) -> None:
    """The control for the test above: FastAPI's default page (assets from a CDN) under the
    same blocking renders no operation, so the blocking is what the test above survives.
    (A page of its own: this one fails to load its script, which the page fixture forbids.)"""
    from fastapi.openapi.docs import get_swagger_ui_html

    context = browser.new_context()
    page = context.new_page()
    refused = offline(page, service)
    cdn_page = get_swagger_ui_html(openapi_url=f"{service.base_url}/openapi.json",
                                   title="cdn").body.decode()
    page.route(f"{service.base_url}/cdn-docs", lambda handle: handle.fulfill(
        status=200, content_type="text/html", body=cdn_page))
    page.goto(f"{service.base_url}/cdn-docs")
    page.wait_for_load_state("load")
    # "load" fires after every script of the page was fetched or refused: without its script
    # Swagger UI cannot render anything, whatever the wait.
    assert page.locator(".opblock").count() == 0
    assert any("swagger-ui-bundle.js" in url for url in refused)
    context.close()
