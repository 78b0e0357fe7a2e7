"""Shared fixtures: a real redis-server per test worker, a fake clock, a Store, an app.

Every test gets an empty Redis (FLUSHALL); time is a FakeClock the test moves by hand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import uvloop
from pytest_timeout import _get_item_settings  # private: the item's limit, as it reads it
from redis.asyncio import Redis

from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer
from timewheel.api.app import create_app
from timewheel.clock import FakeClock
from timewheel.settings import Settings
from timewheel.store import Store

START_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a minute boundary

# No time limits on property tests: Hypothesis's deadline (200 ms an example) and its
# too_slow health check are timed assertions, and 4 workers on 2 cores (CI) miss them at
# random (an example took 329 ms, then 0.18 ms when replayed).
hypothesis.settings.register_profile(
    "suite", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile("suite")


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> dict[str, Callable[[], Any]]:
    """Async tests run on uvloop, the loop `timewheel serve` runs on (cli.py), whose timers
    differ from asyncio's own (whole milliseconds; a delay under 0.5 ms runs at once)."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.hookimpl(trylast=True)
def pytest_exception_interact(node: pytest.Item | pytest.Collector) -> None:
    """pytest-timeout stops timing a test once it has failed (for --pdb), and a teardown
    that then hung would hold the run for ever: time the rest of the test again, with the
    test's own limit (tests/test_suite_hangs.py), unless a debugger comes next."""
    if not isinstance(node, pytest.Item) or node.config.getoption("usepdb"):
        return
    settings = _get_item_settings(node)
    if settings.timeout and not settings.func_only:  # timed, setup and teardown included
        node.config.hook.pytest_timeout_set_timer(item=node, settings=settings)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
def receiver() -> Iterator[ThreadedReceiver]:
    """A real local HTTP receiver in a thread of its own (e2e and cluster tests)."""
    with ThreadedReceiver() as r:
        yield r


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock(START_MS)


@pytest.fixture
async def store(redis: Redis) -> Store:
    store = Store(redis, "tw", retention_ms=7 * 86_400_000, lease_margin_ms=5000)
    await store.init()
    return store


@pytest.fixture
def settings(redis_server: RedisServer, tmp_path: Path) -> Settings:
    return Settings(redis_url=redis_server.url, allow_private_networks=True, data_dir=tmp_path)


@asynccontextmanager
async def running_app(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and hand its state to each request, as uvicorn does."""
    async with app.router.lifespan_context(app) as state:
        async def with_state(scope: Any, receive: Any, send: Any) -> None:
            scope["state"] = dict(state)
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(transport=transport, base_url="http://timewheel") as client:
            yield client


@pytest.fixture
def make_client(redis: Redis, fake_clock: FakeClock
                ) -> Callable[..., Any]:
    """``async with make_client(settings, **kwargs) as client``: no ticker, fake clock."""
    def factory(settings: Settings, **kwargs: Any) -> Any:
        kwargs.setdefault("clock", fake_clock)
        kwargs.setdefault("run_ticker", False)
        return running_app(create_app(settings, **kwargs))
    return factory


@pytest.fixture
async def client(make_client: Callable[..., Any], settings: Settings
                 ) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(settings) as client:
        yield client
