"""``/stats/due``, ``/stats`` and the ``/ui`` page itself, against a real Redis with a fake
clock and no ticker (the browser tests in tests/browser/ drive the page)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import START_MS
from tests.support.redis_server import RedisServer
from timewheel.api.stats import MAX_CELLS
from timewheel.api.ui import STATIC
from timewheel.clock import FakeClock
from timewheel.metrics import Metrics
from timewheel.settings import Settings
from timewheel.store import Outcome, Store

URL = "http://127.0.0.1:9/hook"
MINUTE = 60_000
TOKEN = "stats-token-1"


def minute_iso(n: int) -> str:
    """START_MS is 2027-01-15T08:00:00Z, a minute boundary."""
    return f"2027-01-15T08:{n:02d}:00.000Z"


async def add(client: httpx.AsyncClient, key: str, at_ms: int) -> None:
    r = await client.post("/tasks", json={"key": key, "callback_url": URL,
                                          "execute_at": at_ms / 1000})
    assert r.status_code == 201, r.text


async def due(client: httpx.AsyncClient, minutes: int) -> list[int]:
    r = await client.get("/stats/due", params={"minutes": minutes})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [m["minute"] for m in body["minutes"]] == [minute_iso(i) for i in range(minutes)]
    assert body["clamped"] is False
    return [m["due"] for m in body["minutes"]]


async def test_due_per_minute_counts_every_bucket(client: httpx.AsyncClient,
                                                  store: Store) -> None:
    """Tasks land in their minute whatever their bucket; the edges of a minute count in it."""
    for i in range(40):  # 40 keys spread over the 16 buckets, all in minute 1
        await add(client, f"spread-{i}", START_MS + MINUTE + 1000 * i % MINUTE)
    await add(client, "first-ms", START_MS)
    await add(client, "last-ms", START_MS + MINUTE - 1)
    await add(client, "minute-3", START_MS + 3 * MINUTE + 59_999)
    await add(client, "beyond", START_MS + 5 * MINUTE)
    assert len({store.keys.bucket_of(f"spread-{i}") for i in range(40)}) > 8
    assert await due(client, 5) == [2, 40, 0, 1, 0]
    body = (await client.get("/stats/due", params={"minutes": 6})).json()
    assert body["buckets"] == 16
    assert [m["due"] for m in body["minutes"]] == [2, 40, 0, 1, 0, 1]


async def test_due_starts_at_the_current_minute(client: httpx.AsyncClient,
                                                fake_clock: FakeClock) -> None:
    await add(client, "a", START_MS + 2 * MINUTE + 5)
    fake_clock.advance(MINUTE + 30_000)  # now in minute 1: minute 0 is not shown
    r = await client.get("/stats/due", params={"minutes": 2})
    assert r.json()["minutes"] == [{"minute": minute_iso(1), "due": 0},
                                   {"minute": minute_iso(2), "due": 1}]


async def test_cancel_and_replace_leave_the_count_at_once(client: httpx.AsyncClient) -> None:
    """Cancel and replace are lazy in Redis (the slice entry stays until the minute drains);
    the delete-sets are subtracted, so the figure is exact for minutes not yet claimed."""
    for key in ("a", "b", "c"):
        await add(client, key, START_MS + 2 * MINUTE)
    assert await due(client, 5) == [0, 0, 3, 0, 0]
    assert (await client.delete("/tasks/a")).status_code == 204
    assert await due(client, 5) == [0, 0, 2, 0, 0]
    r = await client.put("/tasks/b", json={"callback_url": URL,
                                           "execute_at": (START_MS + 4 * MINUTE) / 1000})
    assert r.status_code == 200
    assert await due(client, 5) == [0, 0, 1, 0, 1]
    # Back into minute 2: the entry is live again there and stale in minute 4.
    r = await client.put("/tasks/b", json={"callback_url": URL,
                                           "execute_at": (START_MS + 2 * MINUTE) / 1000})
    assert r.status_code == 200
    assert await due(client, 5) == [0, 0, 2, 0, 0]
    # A cancelled task replayed is due now, in the current minute.
    assert (await client.post("/tasks/a/replay")).status_code == 200
    assert await due(client, 5) == [1, 0, 2, 0, 0]


async def test_claimed_tasks_leave_the_count(client: httpx.AsyncClient, store: Store) -> None:
    await add(client, "now-1", START_MS)
    await add(client, "now-2", START_MS + 10)
    await add(client, "later", START_MS + MINUTE)
    assert await due(client, 2) == [2, 1]
    claimed = await claim_all(store, START_MS + 10)
    assert sorted(claimed) == ["now-1", "now-2"]
    assert await due(client, 2) == [0, 1]


async def claim_all(store: Store, now_ms: int) -> list[str]:
    keys = []
    for bucket in range(store.keys.buckets):
        _, tasks = await store.claim(bucket, now_ms=now_ms, horizon_ms=now_ms, limit=100,
                                     token=f"t-{bucket}")
        keys += [t.key for t in tasks]
    return keys


@pytest.mark.parametrize("minutes", ["0", "1441", "-5", "x"])
async def test_minutes_out_of_range_is_422(client: httpx.AsyncClient, minutes: str) -> None:
    r = await client.get("/stats/due", params={"minutes": minutes})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "minutes"]


async def test_default_is_three_hours(client: httpx.AsyncClient) -> None:
    r = await client.get("/stats/due")
    assert len(r.json()["minutes"]) == 180


async def test_many_buckets_clamp_the_minutes(make_client: Callable[..., Any],
                                              redis_server: RedisServer,
                                              tmp_path: Path) -> None:
    """The read stays within MAX_CELLS bucket-minute cells; the answer says it was cut."""
    settings = Settings(redis_url=redis_server.url, allow_private_networks=True,
                        data_dir=tmp_path, buckets=2000)
    async with make_client(settings) as client:
        await add(client, "x", START_MS + 10 * MINUTE)
        r = await client.get("/stats/due", params={"minutes": 1440})
        body = r.json()
        assert body["buckets"] == 2000
        assert body["clamped"] is True
        assert len(body["minutes"]) == MAX_CELLS // 2000
        assert body["minutes"][10] == {"minute": minute_iso(10), "due": 1}
        r = await client.get("/stats/due", params={"minutes": MAX_CELLS // 2000})
        assert r.json()["clamped"] is False


async def fail_now(store: Store, now_ms: int) -> None:
    """Claim, start and fail (HTTP 400) everything due by now_ms."""
    for bucket in range(store.keys.buckets):
        token = f"f-{bucket}"
        _, tasks = await store.claim(bucket, now_ms=now_ms, horizon_ms=now_ms, limit=100,
                                     token=token)
        if tasks:
            claims = [(t.key, token) for t in tasks]
            await store.start(bucket, claims=claims)
            await store.complete(bucket, now_ms=now_ms, outcomes=[
                Outcome(t.key, token, "fail", status_code=400, error="HTTP 400",
                        started_ms=now_ms) for t in tasks])


async def test_process_stats(make_client: Callable[..., Any], settings: Settings,
                             store: Store) -> None:
    """The process's own counters as /metrics has them, and the wheel's dead letters."""
    metrics = Metrics()
    async with make_client(settings, metrics=metrics) as client:
        for key in ("d1", "d2", "d3"):
            await add(client, key, START_MS)
        await fail_now(store, START_MS)
        metrics.outcomes["succeeded"].inc(7)
        metrics.outcomes["failed"].inc(3)
        metrics.claimed.inc(10)
        metrics.inflight.set_function(lambda: 2)  # (the app's dispatcher counts its own)
        for seconds in (0.0015, 0.004, 0.004, 400):
            metrics.lateness_first.observe(seconds)
        r = await client.get("/stats")
    assert r.status_code == 200
    body = r.json()
    assert body["now"] == "2027-01-15T08:00:00.000Z"
    assert body["process"].endswith(f":{os.getpid()}")
    assert body["in_flight"] == 2
    assert body["claimed"] == 10
    assert body["callbacks"] == {"succeeded": 7, "retried": 0, "failed": 3, "abandoned": 0}
    assert body["dead_letters"] == 3
    first = body["lateness"]["first"]
    assert first["count"] == 4
    assert first["sum"] == pytest.approx(400.0095)
    assert first["buckets"][:3] == [[0.001, 0], [0.002, 1], [0.005, 3]]
    assert first["buckets"][-1] == [300.0, 3]  # the 400 s one is only in count (+Inf)
    assert body["lateness"]["retry"]["count"] == 0


@pytest.fixture
def token_settings(redis_server: RedisServer, tmp_path: Path) -> Settings:
    return Settings(redis_url=redis_server.url, allow_private_networks=True, data_dir=tmp_path,
                    api_tokens=TOKEN)


@pytest.mark.parametrize("path", ["/stats", "/stats/due"])
async def test_stats_need_the_token(make_client: Callable[..., Any], token_settings: Settings,
                                    path: str) -> None:
    async with make_client(token_settings) as client:
        r = await client.get(path)
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        r = await client.get(path, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200


async def test_ui_needs_no_token_and_serves_its_assets(make_client: Callable[..., Any],
                                                       token_settings: Settings) -> None:
    """The page holds no data: it loads without a token, with a strict CSP; its assets by
    name only."""
    async with make_client(token_settings) as client:
        r = await client.get("/ui")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "'unsafe-inline'" not in csp
        assert 'src="ui/assets/app.js?v=' in r.text and "{{version}}" not in r.text
        for name, kind in [("app.js", "text/javascript"), ("style.css", "text/css"),
                           ("page-tasks.js", "text/javascript"), ("favicon.svg", "image/svg")]:
            r = await client.get(f"/ui/assets/{name}")
            assert r.status_code == 200, name
            assert r.headers["content-type"].startswith(kind)
            assert r.content == (STATIC / name).read_bytes()
        for bad in ["index.html", "nope.js", "..%2F__init__.py", "%2e%2e%2fstats.py"]:
            assert (await client.get(f"/ui/assets/{bad}")).status_code == 404, bad
        assert (await client.get("/ui/assets/../__init__.py")).status_code == 404
        assert (await client.get("/stats/due")).status_code == 401


async def test_openapi_documents_stats_not_ui(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert "/stats/due" in paths and "/stats" in paths
    params = paths["/stats/due"]["get"]["parameters"]
    assert params[0]["name"] == "minutes"
    assert params[0]["schema"]["maximum"] == 1440
    assert not any(p.startswith("/ui") for p in paths)
