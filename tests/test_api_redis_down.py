"""Redis going away under a running app: 503 (never 500, never a false 201), then recovery
without restarting the app. Each test owns its redis-server, real RedisClock, ticker on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import running_app
from tests.support.ports import refused_port
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until
from timewheel.api.app import create_app
from timewheel.settings import Settings

URL = "http://127.0.0.1:9/hook"
RECOVERY_SECONDS = 20.0


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def make_settings(server: RedisServer, tmp_path: Path) -> Settings:
    return Settings(redis_url=server.url, allow_private_networks=True, data_dir=tmp_path,
                    tick_seconds=0.2)


async def task_keys(server: RedisServer) -> list[bytes]:
    client = Redis.from_url(server.url)
    try:
        return sorted([key async for key in client.scan_iter(match="*t:*")])
    finally:
        await client.aclose()


async def poll(client: httpx.AsyncClient, method: str, path: str, want: int,
               **kwargs: Any) -> list[int]:
    """Repeat a request until it answers ``want``; returns every status seen on the way."""
    seen: list[int] = []

    async def answered() -> bool:
        seen.append((await client.request(method, path, **kwargs)).status_code)
        return seen[-1] == want

    await wait_until(answered, lambda: f"{method} {path} to answer {want} (last: {seen[-5:]})",
                     RECOVERY_SECONDS)
    return seen


DOWN_CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/tasks", {"json": {"key": "lost", "callback_url": URL, "delay": 3600}}),
    ("PUT", "/tasks/lost-put", {"json": {"callback_url": URL, "delay": 3600}}),
    ("GET", "/tasks/kept", {}),
    ("GET", "/tasks/kept/attempts", {}),
    ("DELETE", "/tasks/kept", {}),
    ("POST", "/tasks/kept/replay", {}),
    ("GET", "/tasks", {"params": {"status": "failed"}}),
]


async def test_redis_down_answers_503_then_recovers(own_redis: RedisServer,
                                                    tmp_path: Path) -> None:
    """Redis stopped: /healthz and every /tasks call 503 and nothing is written; Redis
    back on the same port: both recover in the same app, and earlier tasks are still there."""
    app = create_app(make_settings(own_redis, tmp_path), run_ticker=True)
    async with running_app(app) as client:
        r = await client.post("/tasks", json={"key": "kept", "callback_url": URL,
                                              "delay": 3600})
        assert r.status_code == 201
        assert (await client.get("/healthz")).json() == {"status": "ok"}

        await asyncio.to_thread(own_redis.stop)
        r = await client.get("/healthz")
        assert (r.status_code, r.json()) == (503, {"status": "unavailable"})
        assert (await client.get("/livez")).json() == {"status": "ok"}  # alive: no restart
        for method, path, kwargs in DOWN_CALLS * 2:
            r = await client.request(method, path, **kwargs)
            assert r.status_code == 503, (method, path, r.status_code, r.text)
            assert r.headers["retry-after"] == "1"
            assert r.json() == {"detail": "Redis is unavailable; try again later"}

        await asyncio.to_thread(own_redis.start)
        seen = await poll(client, "GET", "/healthz", 200)
        assert set(seen) <= {503, 200}
        r = await client.post("/tasks", json={"key": "after", "callback_url": URL,
                                              "delay": 3600})
        assert r.status_code == 201, r.text
        assert (await client.get("/tasks/kept")).json()["status"] == "scheduled"
        assert (await client.get("/tasks/lost")).status_code == 404
        assert (await client.get("/tasks/lost-put")).status_code == 404
        keys = await task_keys(own_redis)
        assert [k.rsplit(b":", 1)[1] for k in keys] == [b"after", b"kept"]


async def test_app_started_while_redis_is_down(own_redis: RedisServer, tmp_path: Path) -> None:
    """The app starts with Redis down (no clock read yet): 503 everywhere, never 500; once
    Redis starts the ticker reads the clock and POST succeeds, without a restart."""
    await asyncio.to_thread(own_redis.stop)
    app = create_app(make_settings(own_redis, tmp_path), run_ticker=True)
    async with running_app(app) as client:
        assert (await client.get("/healthz")).status_code == 503
        for method, path, kwargs in DOWN_CALLS:
            r = await client.request(method, path, **kwargs)
            assert r.status_code == 503, (method, path, r.status_code, r.text)

        await asyncio.to_thread(own_redis.start)
        assert set(await poll(client, "GET", "/healthz", 200)) <= {503, 200}
        body = {"key": "after", "callback_url": URL, "delay": 3600}
        assert set(await poll(client, "POST", "/tasks", 201, json=body)) <= {503, 201}
        assert (await client.get("/tasks/after")).json()["status"] == "scheduled"
        assert (await client.get("/tasks/lost")).status_code == 404
        keys = await task_keys(own_redis)
        assert [k.rsplit(b":", 1)[1] for k in keys] == [b"after"]


async def test_metrics_are_served_while_redis_is_down(own_redis: RedisServer,
                                                      tmp_path: Path) -> None:
    """An outage is when an operator needs the process's metrics: /metrics answers 200 with
    `timewheel_redis_up 0` and the failing ticks counted; the per-flow series, which need
    Redis, are left out rather than shown stale, and Redis's memory ratio is NaN (it kept its
    last value, so an alert on it went on firing, or stayed quiet, through an outage); they
    come back with Redis."""
    app = create_app(make_settings(own_redis, tmp_path), run_ticker=True)
    async with running_app(app) as client:
        assert (await client.put("/flows/tenant-1", json={"parallelism": 5})).status_code == 200
        text = (await client.get("/metrics")).text
        assert "timewheel_redis_up 1.0" in text
        assert 'timewheel_flow_in_flight{flow="tenant-1"} 0.0' in text
        assert "timewheel_redis_memory_used_ratio 0.0" in text

        await asyncio.to_thread(own_redis.stop)

        async def tick_failed() -> bool:
            return "timewheel_tick_errors_total 0.0" not in (await client.get("/metrics")).text

        await wait_until(tick_failed, "a failed tick counted in /metrics", RECOVERY_SECONDS)
        r = await client.get("/metrics")
        assert r.status_code == 200, r.text
        assert "timewheel_redis_up 0.0" in r.text
        assert 'flow="' not in r.text
        assert "timewheel_redis_memory_used_ratio NaN" in r.text

        await asyncio.to_thread(own_redis.start)
        await poll(client, "GET", "/healthz", 200)
        text = (await client.get("/metrics")).text
        assert "timewheel_redis_up 1.0" in text
        assert 'timewheel_flow_in_flight{flow="tenant-1"} 0.0' in text
        assert "timewheel_redis_memory_used_ratio 0.0" in text


async def test_metrics_are_served_by_a_process_started_while_redis_is_down(
        own_redis: RedisServer, tmp_path: Path) -> None:
    """README, Operations: /metrics "answers while Redis is away too". A process started
    during an outage answered 503 until Redis first answered (its wheel was taken through
    WheelDep, which waits for that first read), so a scrape showed nothing of it, not even
    `timewheel_redis_up 0`. Now 200 with `timewheel_redis_up 0`, then 1 once Redis is back."""
    await asyncio.to_thread(own_redis.stop)
    app = create_app(make_settings(own_redis, tmp_path), run_ticker=True)
    async with running_app(app) as client:
        r = await client.get("/metrics")
        assert r.status_code == 200, r.text
        assert "timewheel_redis_up 0.0" in r.text
        assert "timewheel_tick_errors_total" in r.text

        await asyncio.to_thread(own_redis.start)

        async def redis_up() -> bool:
            r = await client.get("/metrics")
            assert r.status_code == 200, r.text
            return "timewheel_redis_up 1.0" in r.text

        await wait_until(redis_up, "timewheel_redis_up 1 once Redis is back", RECOVERY_SECONDS)


async def test_a_cluster_that_cannot_be_reached_is_503_not_a_crash(tmp_path: Path) -> None:
    """TIMEWHEEL_REDIS_CLUSTER=true with no node reachable: redis-py's cluster client raises
    RedisClusterException ("cannot be connected"), which is no RedisError, and the service
    exited at start (code 3: pods crash-looping through a cluster outage; found in a deploy
    review) or, running, answered 500. It starts and answers 503, as for a single Redis."""
    with refused_port() as port:
        settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0", redis_cluster=True,
                            allow_private_networks=True, data_dir=tmp_path, tick_seconds=0.2)
        app = create_app(settings, run_ticker=True)
        async with running_app(app) as client:
            assert (await client.get("/healthz")).status_code == 503
            assert (await client.get("/livez")).json() == {"status": "ok"}
            for method, path, kwargs in DOWN_CALLS:
                r = await client.request(method, path, **kwargs)
                assert r.status_code == 503, (method, path, r.status_code, r.text)


async def test_a_scrape_does_not_wait_on_redis_for_long(
        own_redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster client retries a silent master for minutes: the per-flow gauges' reads are
    given up after GAUGES_READ_S, and the scrape answers with what the process knows."""
    from timewheel.api import flows, ops

    monkeypatch.setattr(ops, "GAUGES_READ_S", 0.05)

    async def silent(wheel: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(flows, "refresh_gauges", silent)
    app = create_app(make_settings(own_redis, tmp_path), run_ticker=False)
    async with running_app(app) as client:
        r = await client.get("/metrics")
        assert r.status_code == 200 and "timewheel_redis_up 0.0" in r.text


async def test_a_silent_redis_is_a_503_within_the_request_deadline(
        own_redis: RedisServer, tmp_path: Path) -> None:
    """A Redis that stops answering (SIGSTOP: a frozen VM, a network that drops): every request
    is answered 503 with Retry-After once TIMEWHEEL_REQUEST_DEADLINE_SECONDS pass, rather than
    when the client library gives up (minutes for a cluster's silent master); the same app
    serves again once Redis answers."""
    settings = make_settings(own_redis, tmp_path).model_copy(
        update={"request_deadline_seconds": 1.0})
    app = create_app(settings, run_ticker=False)
    async with running_app(app) as client:
        r = await client.post("/tasks", json={"key": "kept", "callback_url": URL,
                                              "delay": 3600})
        assert r.status_code == 201
        with own_redis.stopped():
            for method, path, kwargs in [
                    ("POST", "/tasks", {"json": {"key": "late", "callback_url": URL,
                                                 "delay": 3600}}),
                    ("GET", "/tasks/kept", {}), ("GET", "/healthz", {})]:
                r = await client.request(method, path, **kwargs)
                assert (r.status_code, r.headers.get("retry-after")) == (503, "1"), r.text
                assert r.json()["detail"].startswith("Redis did not answer within 1 s"), r.text
            # A request that needs no Redis is not held back.
            assert (await client.get("/livez")).status_code == 200
        await poll(client, "GET", "/tasks/kept", 200)
        # The POST's script was in Redis's socket when it stopped: it may have run since.
        assert (await client.get("/tasks/late")).status_code in (200, 404)


async def test_the_deadline_answers_only_for_its_own_expiry() -> None:
    """The watchdog's cancel of a request past its deadline becomes a 503; an app's own
    TimeoutError is its error, a cancel from elsewhere (shutdown) stays a cancel, and an
    answer already started cannot be replaced (the server closes the connection)."""
    from timewheel.api.deadline import RequestDeadline

    async def silent(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.Event().wait()

    async def own_timeout(scope: Any, receive: Any, send: Any) -> None:
        raise TimeoutError("the app's own")

    async def started_then_silent(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.Event().wait()

    def client(app: Any, seconds: float) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=RequestDeadline(app, seconds=seconds))
        return httpx.AsyncClient(transport=transport, base_url="http://t")

    async with client(silent, 0.05) as http:
        r = await http.get("/")
        assert (r.status_code, r.headers["retry-after"]) == (503, "1")
        assert r.json()["detail"].startswith("Redis did not answer within 0.05 s")
    async with client(own_timeout, 0.05) as http:
        with pytest.raises(TimeoutError, match="the app's own"):
            await http.get("/")
    async with client(silent, 60) as http:
        elsewhere = asyncio.create_task(http.get("/"))
        await asyncio.sleep(0.05)
        elsewhere.cancel()
        with pytest.raises(asyncio.CancelledError):
            await elsewhere
    async with client(started_then_silent, 0.05) as http:
        # The app runs in this very task (httpx's ASGI transport): the watchdog's cancel is
        # this task's, and the middleware took it back (tests/test_request_deadline.py).
        with pytest.raises(asyncio.CancelledError):
            await http.get("/")
        me = asyncio.current_task()
        assert me is not None and me.cancelling() == 0
