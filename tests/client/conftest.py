"""Fixtures of the client tests: both clients behind one awaitable interface (respx answers),
and the real app behind an ASGI transport for each of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import respx
from redis.asyncio import Redis

from timewheel.api.app import create_app
from timewheel.client import AsyncClient, Client
from timewheel.clock import FakeClock
from timewheel.settings import Settings

BASE = "http://timewheel.test:8080"
TOKEN = "tok-123"



@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    """Every request must hit a route: nothing leaves the process."""
    with respx.mock(base_url=BASE, assert_all_called=False, assert_all_mocked=True) as mock:
        yield mock


class Both:
    """One of the two clients, driven the same way: ``await call("get_task", "k")`` and
    ``await collect("iter_tasks", "failed")`` whichever it is."""

    def __init__(self, client: Client | AsyncClient) -> None:
        self.client = client

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.client, name)(*args, **kwargs)
        return await result if isinstance(self.client, AsyncClient) else result

    async def collect(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        items = getattr(self.client, name)(*args, **kwargs)
        if isinstance(self.client, AsyncClient):
            return [item async for item in items]
        return list(items)


@pytest.fixture(params=["sync", "async"])
async def both(request: pytest.FixtureRequest, router: respx.MockRouter
               ) -> AsyncIterator[Both]:
    """The sync and the async client, each with a token and a 3 s timeout, against respx."""
    if request.param == "sync":
        with Client(BASE, token=TOKEN, timeout=3) as client:
            yield Both(client)
    else:
        async with AsyncClient(BASE, token=TOKEN, timeout=3) as aclient:
            yield Both(aclient)


class LoopBridge(httpx.BaseTransport):
    """A sync transport that runs each request through an async one on the test's event loop,
    so the blocking ``Client`` (called from a worker thread) can talk to the ASGI app that
    lives on that loop."""

    def __init__(self, inner: httpx.AsyncBaseTransport, loop: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self.loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> httpx.Response:
            response = await self.inner.handle_async_request(request)
            content = await response.aread()
            return httpx.Response(response.status_code, headers=response.headers,
                                  content=content)
        return asyncio.run_coroutine_threadsafe(send(), self.loop).result(timeout=30)


@pytest.fixture
def app_transport(redis: Redis, fake_clock: FakeClock
                  ) -> Callable[[Settings], Any]:
    """``async with app_transport(settings) as transport``: the real app (real Redis, fake
    clock, no ticker) with its lifespan running, as an ``httpx.ASGITransport``."""
    @asynccontextmanager
    async def running(settings: Settings) -> AsyncIterator[httpx.ASGITransport]:
        app = create_app(settings, clock=fake_clock, run_ticker=False)
        async with app.router.lifespan_context(app) as state:
            async def with_state(scope: Any, receive: Any, send: Any) -> None:
                scope["state"] = dict(state)
                await app(scope, receive, send)
            yield httpx.ASGITransport(app=with_state)
    return running


class ThreadedBoth(Both):
    """The sync client with each call in a worker thread: it blocks, and the app it talks to
    runs on this event loop."""

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.client, name), *args, **kwargs)

    async def collect(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        return await asyncio.to_thread(lambda: list(getattr(self.client, name)(*args, **kwargs)))


@pytest.fixture(params=["sync", "async"])
async def real(request: pytest.FixtureRequest, app_transport: Callable[[Settings], Any],
               settings: Settings) -> AsyncIterator[Both]:
    """Each client against the real app. The sync one runs in a worker thread (its calls
    block), bridged to the app on this loop."""
    async with app_transport(settings) as transport:
        if request.param == "async":
            async with AsyncClient("http://timewheel", transport=transport) as aclient:
                yield Both(aclient)
            return
        bridge = LoopBridge(transport, asyncio.get_running_loop())
        client = Client("http://timewheel", transport=bridge)
        try:
            yield ThreadedBoth(client)
        finally:
            client.close()
