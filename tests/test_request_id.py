"""X-Request-ID: generated or accepted, returned on every response, and on every log record
emitted while the request is served."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.conftest import running_app
from timewheel.api.app import MAX_REQUEST_BYTES, create_app
from timewheel.api.request_id import MAX_LENGTH, RequestId
from timewheel.clock import FakeClock
from timewheel.logs import REQUEST_ID, configure_logging
from timewheel.settings import Settings

GENERATED = re.compile(r"^[0-9a-f]{32}$")
log = logging.getLogger("timewheel.test.request_id")


@pytest.fixture
def log_output() -> Iterator[io.StringIO]:
    """The service's own JSON logging, into a buffer; root logger restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buffer = io.StringIO()
    configure_logging("info", "json", stream=buffer)
    yield buffer
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture
async def client(settings: Settings, fake_clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    """The real app plus one route that logs twice around a pause (as a handler awaiting Redis
    would), so concurrent requests interleave their log records."""
    app: FastAPI = create_app(settings, clock=fake_clock, run_ticker=False)

    @app.get("/test-log")
    async def test_log(tag: str) -> dict[str, str]:
        log.info("before %s", tag)
        await asyncio.sleep(0)
        log.info("after %s", tag)
        return {"tag": tag}

    async with running_app(app) as client:
        yield client


async def test_a_request_without_id_gets_a_fresh_one(client: httpx.AsyncClient) -> None:
    first = await client.get("/healthz")
    second = await client.get("/healthz")
    assert first.status_code == second.status_code == 200
    assert GENERATED.match(first.headers["x-request-id"])
    assert GENERATED.match(second.headers["x-request-id"])
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


@pytest.mark.parametrize("incoming", [
    "abc-123", "0af7651916cd43dd8448eb211c80319c", "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
    "lb.example:42/7+x=", "x" * MAX_LENGTH])
async def test_a_valid_incoming_id_is_echoed(client: httpx.AsyncClient, incoming: str) -> None:
    response = await client.get("/tasks/nothing-here", headers={"X-Request-ID": incoming})
    assert response.status_code == 404
    assert response.headers.get_list("x-request-id") == [incoming]


@pytest.mark.parametrize("incoming", [
    "", "has space", "x" * (MAX_LENGTH + 1), "<script>", 'quote"d', "semi;colon", "tab\tid",
    "caf\u00e9"])
async def test_an_invalid_incoming_id_is_replaced(client: httpx.AsyncClient,
                                                  incoming: str) -> None:
    response = await client.get("/healthz", headers={"X-Request-ID": incoming.encode("utf-8")})
    assert GENERATED.match(response.headers["x-request-id"])


async def test_refusals_carry_the_id_too(client: httpx.AsyncClient) -> None:
    """The middleware is outermost: a 413 from the body-size guard and a 422 get an id."""
    too_big = await client.post("/tasks", content=b"x" * (MAX_REQUEST_BYTES + 1),
                                headers={"content-type": "application/json", "X-Request-ID": "r1"})
    invalid = await client.post("/tasks", json={"callback_url": "nope"},
                                headers={"X-Request-ID": "r2"})
    assert (too_big.status_code, invalid.status_code) == (413, 422)
    assert too_big.headers["x-request-id"] == "r1"
    assert invalid.headers["x-request-id"] == "r2"


async def test_log_records_of_a_request_carry_its_id(client: httpx.AsyncClient,
                                                     log_output: io.StringIO) -> None:
    responses = await asyncio.gather(
        client.get("/test-log", params={"tag": "a"}, headers={"X-Request-ID": "id-a"}),
        client.get("/test-log", params={"tag": "b"}),
    )
    log.info("between requests")
    ids = {r.json()["tag"]: r.headers["x-request-id"] for r in responses}
    assert ids["a"] == "id-a" and GENERATED.match(ids["b"])
    records = [json.loads(line) for line in log_output.getvalue().splitlines()]
    ours = [r for r in records if r["logger"] == log.name]
    by_message = {r["message"]: r.get("request_id") for r in ours}
    assert by_message == {"before a": "id-a", "after a": "id-a", "before b": ids["b"],
                          "after b": ids["b"], "between requests": None}
    assert REQUEST_ID.get() is None


async def test_non_http_scopes_pass_through_untouched() -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope["type"], REQUEST_ID.get()))
        await send({"type": "lifespan.startup.complete"})

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await RequestId(app)({"type": "lifespan"}, None, send)  # type: ignore[arg-type]
    assert seen == [("lifespan", None)]
    assert sent == [{"type": "lifespan.startup.complete"}]


async def test_the_id_stays_bound_for_the_servers_error_log() -> None:
    """When the app raises, the server logs the traceback after the middleware returns, in the
    request's own task: the id is still bound there, and never leaks into other tasks."""

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def serve_one() -> str | None:
        scope = {"type": "http", "headers": [(b"x-request-id", b"failing-1")]}
        with pytest.raises(RuntimeError):
            await RequestId(failing)(scope, None, None)  # type: ignore[arg-type]
        return REQUEST_ID.get()

    assert await asyncio.create_task(serve_one()) == "failing-1"
    assert REQUEST_ID.get() is None
