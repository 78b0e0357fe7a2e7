"""``/schedules`` over HTTP against a real Redis, with a fake clock and no ticker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS
from tests.support.cursors import assert_cursor_refused, b64, cursors_not_handed_out
from tests.support.redis_server import RedisServer
from timewheel.api.app import create_app
from timewheel.clock import FakeClock
from timewheel.service import Wheel
from timewheel.settings import Settings

NOW = START_MS
URL = "http://127.0.0.1:9/cb"
TASK = {"callback_url": URL}


@pytest.fixture
async def app_and_wheel(settings: Settings, fake_clock: FakeClock, redis: Redis
                        ) -> AsyncIterator[tuple[httpx.AsyncClient, Wheel]]:
    """An app on the test's empty Redis (the redis fixture flushes it) and its Wheel."""
    async with _running(settings, fake_clock) as pair:
        yield pair


def _running(settings: Settings, clock: FakeClock) -> Any:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def run() -> AsyncIterator[tuple[httpx.AsyncClient, Wheel]]:
        app = create_app(settings, clock=clock, run_ticker=False)
        async with app.router.lifespan_context(app) as state:
            async def with_state(scope: Any, receive: Any, send: Any) -> None:
                scope["state"] = dict(state)
                await app(scope, receive, send)

            transport = httpx.ASGITransport(app=with_state)
            async with httpx.AsyncClient(transport=transport, base_url="http://tw") as client:
                yield client, state["wheel"]
    return run()


@pytest.fixture
def client(app_and_wheel: tuple[httpx.AsyncClient, Wheel]) -> httpx.AsyncClient:
    return app_and_wheel[0]


async def schedule_keys(redis: Redis) -> list[bytes]:
    return sorted([k async for k in redis.scan_iter(match="*}:s*")])


# -- create, read, replace --------------------------------------------------------------------

async def test_put_creates_then_replaces(client: httpx.AsyncClient) -> None:
    body = {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "task": TASK}
    r = await client.put("/schedules/nightly", json=body)
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/schedules/nightly"
    view = r.json()
    assert view == {
        "id": "nightly", "cron": "30 2 * * *", "every": None, "timezone": "Europe/Berlin",
        "task": {**TASK, "method": "POST", "headers": {}, "body": None, "timeout": None,
                 "max_attempts": 5, "retry_backoff": 1.0, "flow_key": None,
                 "on_success": None, "on_failure": None},
        "paused": False, "next_run_at": "2027-01-16T01:30:00.000Z", "last_run_at": None,
        "created_at": "2027-01-15T08:00:00.000Z"}
    assert (await client.get("/schedules/nightly")).json() == view
    r = await client.put("/schedules/nightly", json={"every": 60, "task": TASK})
    assert r.status_code == 200
    assert r.json()["every"] == 60 and r.json()["cron"] is None
    assert r.json()["next_run_at"] == "2027-01-15T08:01:00.000Z"
    assert r.json()["created_at"] == view["created_at"]


async def test_the_template_shows_the_retry_fields_its_occurrences_get(
        client: httpx.AsyncClient) -> None:
    """A template that sets no max_attempts or retry_backoff shows those its occurrences get,
    its flow's defaults (as a task view does), not the service's as if set; one that sets them
    shows its own. Every view (PUT, GET, the listing, pause) shows the same."""
    flow = {"max_attempts": 2, "retry_backoff": 0.2}
    assert (await client.put("/flows/retrying", json=flow)).status_code == 200
    own = {**TASK, "flow_key": "retrying", "max_attempts": 7, "retry_backoff": 3}
    r = await client.put("/schedules/a-unset", json={"every": 60,
                                                     "task": {**TASK, "flow_key": "retrying"}})
    assert (r.json()["task"]["max_attempts"], r.json()["task"]["retry_backoff"]) == (2, 0.2)
    r = await client.put("/schedules/b-own", json={"every": 60, "task": own})
    assert (r.json()["task"]["max_attempts"], r.json()["task"]["retry_backoff"]) == (7, 3.0)
    views = {v["id"]: v["task"] for v in (await client.get("/schedules")).json()["schedules"]}
    assert [(t["max_attempts"], t["retry_backoff"]) for t in views.values()] == [(2, 0.2),
                                                                                   (7, 3.0)]
    for path in ("/schedules/a-unset", "/schedules/a-unset/pause"):
        task = (await client.request("GET" if "pause" not in path else "POST", path)).json()
        assert (task["task"]["max_attempts"], task["task"]["retry_backoff"]) == (2, 0.2)
    assert (await client.delete("/flows/retrying")).status_code == 204


async def test_a_flow_backoff_over_a_tasks_limit_is_shown_not_a_500(
        client: httpx.AsyncClient) -> None:
    """Found by review: PUT /flows takes retry_backoff up to a day, a task's at most an hour,
    and the filled-in template was validated again as a task's: every view of the schedule
    answered 500 (the PUT after the schedule was written)."""
    assert (await client.put("/flows/slow", json={"retry_backoff": 7200})).status_code == 200
    r = await client.put("/schedules/nightly", json={"every": 60,
                                                     "task": {**TASK, "flow_key": "slow"}})
    assert r.status_code == 201, r.text
    assert r.json()["task"]["retry_backoff"] == 7200.0
    g = await client.get("/schedules")
    assert g.status_code == 200 and g.json()["schedules"][0]["task"]["retry_backoff"] == 7200.0


async def test_unknown_schedule_is_404(client: httpx.AsyncClient) -> None:
    for method, path in [("GET", "/schedules/nope"), ("DELETE", "/schedules/nope"),
                         ("POST", "/schedules/nope/pause"), ("POST", "/schedules/nope/resume")]:
        r = await client.request(method, path)
        assert r.status_code == 404, (method, path)
        assert r.json() == {"detail": "no schedule with id 'nope'"}


async def put_schedules(client: httpx.AsyncClient, ids: list[str]) -> None:
    for i in ids:
        assert (await client.put(f"/schedules/{i}", json={"every": 5, "task": TASK})
                ).status_code == 201


async def every_page(client: httpx.AsyncClient, limit: int) -> list[dict[str, Any]]:
    """The listing's pages, first to last, following ``next_cursor``."""
    pages: list[dict[str, Any]] = []
    cursor = None
    while not pages or cursor is not None:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        r = await client.get("/schedules", params=params)
        assert r.status_code == 200, r.text
        pages.append(r.json())
        cursor = pages[-1]["next_cursor"]
    return pages


async def test_list_is_cursor_paginated_in_id_order(client: httpx.AsyncClient) -> None:
    ids = ["a", "b.1", "b-2", "c", "d_9", "e"]
    await put_schedules(client, ids)
    pages = await every_page(client, 4)
    assert [s["id"] for p in pages for s in p["schedules"]] == sorted(ids) and len(pages) == 2
    assert (await client.get("/schedules", params={"limit": 0})).status_code == 422


async def test_list_cursor_is_opaque_and_pages_every_schedule_once(
        client: httpx.AsyncClient) -> None:
    """Each page's cursor is opaque (not the page's last id, which is any string a schedule
    could be named), reusable, and the cursors lead through every schedule exactly once."""
    ids = [f"sched.{n:02d}" for n in range(7)] + ["sched-x", "sched_y"]
    await put_schedules(client, ids)
    pages = await every_page(client, 2)
    seen = [s["id"] for p in pages for s in p["schedules"]]
    assert seen == sorted(ids) and len(pages) == 5
    for page in pages[:-1]:
        last = page["schedules"][-1]["id"]
        assert page["next_cursor"] and last not in page["next_cursor"]
    again = [(await client.get("/schedules", params={"limit": 2,
                                                     "cursor": pages[0]["next_cursor"]})).json()
             for _ in range(2)]
    assert again[0] == again[1] == pages[1]


@pytest.mark.parametrize("cursor", [
    *cursors_not_handed_out("schedules", "s00"),
    pytest.param(b64("schedules\n" + "x" * 151), id="an-id-too-long-inside"),
])
async def test_a_cursor_the_listing_did_not_hand_out_is_422(
        client: httpx.AsyncClient, redis: Redis, cursor: str) -> None:
    """As GET /tasks and GET /topics: a cursor the listing could not have handed out is a 422
    naming the cursor, and nothing is read or stored for it, not a page from somewhere (a
    bare schedule id was one: the listing used to hand out its last id as it was)."""
    await put_schedules(client, ["s00", "s01"])
    await assert_cursor_refused(client, redis, "/schedules", cursor)
    # Control: the cursor the listing hands out for "s00" works.
    r = await client.get("/schedules", params={"cursor": b64("schedules\ns00")})
    assert [s["id"] for s in r.json()["schedules"]] == ["s01"]


# -- pause, resume, delete, and the occurrences they stop -------------------------------------

async def test_pause_resume_delete(app_and_wheel: tuple[httpx.AsyncClient, Wheel],
                                   fake_clock: FakeClock) -> None:
    client, wheel = app_and_wheel
    await client.put("/schedules/hb", json={"every": 1, "task": TASK})
    await wheel.materializer.tick(NOW)
    first = (await client.get(f"/tasks/hb.{NOW + 1000}")).json()
    assert first["status"] == "scheduled" and first["execute_at"] == "2027-01-15T08:00:01.000Z"

    r = await client.post("/schedules/hb/pause")
    assert r.status_code == 200
    assert r.json()["paused"] is True and r.json()["next_run_at"] is None
    for occ in (NOW + 1000, NOW + 2000):  # materialized, not started: cancelled
        assert (await client.get(f"/tasks/hb.{occ}")).json()["status"] == "cancelled"
    assert (await client.post("/schedules/hb/pause")).status_code == 200  # idempotent

    fake_clock.set(NOW + 30_500)
    r = await client.post("/schedules/hb/resume")
    assert r.status_code == 200
    assert r.json()["paused"] is False
    assert r.json()["next_run_at"] == "2027-01-15T08:00:31.000Z"  # from now, no backlog
    await wheel.materializer.tick(NOW + 30_500)
    assert (await client.get(f"/tasks/hb.{NOW + 31_000}")).json()["status"] == "scheduled"
    fake_clock.set(NOW + 31_200)
    assert (await client.get("/schedules/hb")).json()["last_run_at"] == (
        "2027-01-15T08:00:31.000Z")

    assert (await client.delete("/schedules/hb")).status_code == 204
    assert (await client.get(f"/tasks/hb.{NOW + 32_000}")).json()["status"] == "cancelled"
    assert (await client.get("/schedules/hb")).status_code == 404
    assert (await client.delete("/schedules/hb")).status_code == 404
    assert (await client.get("/schedules")).json() == {"schedules": [], "next_cursor": None}


async def test_put_paused_cancels_materialized_occurrences(
        app_and_wheel: tuple[httpx.AsyncClient, Wheel]) -> None:
    client, wheel = app_and_wheel
    await client.put("/schedules/hb", json={"every": 1, "task": TASK})
    await wheel.materializer.tick(NOW)
    r = await client.put("/schedules/hb", json={"every": 1, "task": TASK, "paused": True})
    assert r.status_code == 200 and r.json()["paused"] is True
    assert (await client.get(f"/tasks/hb.{NOW + 1000}")).json()["status"] == "cancelled"


# -- invalid input: 422 naming the field, nothing stored --------------------------------------

INVALID: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("bad cron", {"cron": "61 * * * *", "task": TASK}, ("body", "cron")),
    ("four fields", {"cron": "* * * *", "task": TASK}, ("body", "cron")),
    ("never fires", {"cron": "0 0 30 2 *", "task": TASK}, ("body", "cron")),
    ("unknown zone", {"every": 5, "timezone": "Mars/Olympus", "task": TASK}, ("body", "timezone")),
    ("path as zone", {"every": 5, "timezone": "../../etc/passwd", "task": TASK},
     ("body", "timezone")),
    ("both", {"cron": "* * * * *", "every": 5, "task": TASK}, ("body", "every")),
    ("neither", {"task": TASK}, ("body", "every")),
    ("every zero", {"every": 0, "task": TASK}, ("body", "every")),
    ("every fraction", {"every": 1.5, "task": TASK}, ("body", "every")),
    ("no task", {"every": 5}, ("body", "task")),
    ("bad url", {"every": 5, "task": {"callback_url": "ftp://x/"}},
     ("body", "task", "callback_url")),
    ("execute_at", {"every": 5, "task": {**TASK, "execute_at": 5}},
     ("body", "task", "execute_at")),
    ("delay", {"every": 5, "task": {**TASK, "delay": 5}}, ("body", "task", "delay")),
    ("key", {"every": 5, "task": {**TASK, "key": "k"}}, ("body", "task", "key")),
    ("timeout over deadline", {"every": 5, "task": {**TASK, "timeout": 31}},
     ("body", "task", "timeout")),
    ("extra", {"every": 5, "task": TASK, "name": "x"}, ("body", "name")),
    ("paused not bool", {"every": 5, "task": TASK, "paused": "yes"}, ("body", "paused")),
]


@pytest.mark.parametrize(("body", "loc"), [(b, loc) for _, b, loc in INVALID],
                         ids=[name for name, _, _ in INVALID])
async def test_invalid_put_is_422_naming_the_field(client: httpx.AsyncClient, redis: Redis,
                                                   body: dict[str, Any],
                                                   loc: tuple[str, ...]) -> None:
    r = await client.put("/schedules/s", json=body)
    assert r.status_code == 422, r.text
    assert tuple(r.json()["detail"][0]["loc"]) == loc, r.json()
    assert await schedule_keys(redis) == []
    assert (await client.get("/schedules/s")).status_code == 404


@pytest.mark.parametrize("path", ["/schedules/bad%20id", "/schedules/" + "x" * 151])
async def test_invalid_id_is_422(client: httpx.AsyncClient, redis: Redis, path: str) -> None:
    r = await client.put(path, json={"every": 5, "task": TASK})
    assert r.status_code == 422
    assert await schedule_keys(redis) == []


async def test_non_json_constants_are_refused(client: httpx.AsyncClient, redis: Redis) -> None:
    r = await client.put("/schedules/s", content=b'{"every": NaN, "task": {}}',
                         headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert await schedule_keys(redis) == []


async def test_private_callback_refused_unless_allowed(redis_server: RedisServer,
                                                       tmp_path: Path, redis: Redis,
                                                       fake_clock: FakeClock) -> None:
    settings = Settings(redis_url=redis_server.url, data_dir=tmp_path)
    async with _running(settings, fake_clock) as (client, _):
        r = await client.put("/schedules/s", json={"every": 5, "task": TASK})
        assert r.status_code == 422
        assert tuple(r.json()["detail"][0]["loc"]) == ("body", "task", "callback_url")
    assert await schedule_keys(redis) == []


async def test_token_checked_before_the_body(redis_server: RedisServer, tmp_path: Path,
                                             fake_clock: FakeClock, redis: Redis) -> None:
    settings = Settings(redis_url=redis_server.url, data_dir=tmp_path, api_tokens="s3cret",
                        allow_private_networks=True)
    async with _running(settings, fake_clock) as (client, _):
        assert (await client.put("/schedules/s", content=b"{bad")).status_code == 401
        assert (await client.get("/schedules")).status_code == 401
        r = await client.put("/schedules/s", json={"every": 5, "task": TASK},
                             headers={"authorization": "Bearer s3cret"})
        assert r.status_code == 201


# -- Redis down ---------------------------------------------------------------------------------

@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


async def test_redis_down_is_503(own_redis: RedisServer, tmp_path: Path,
                                 fake_clock: FakeClock) -> None:
    settings = Settings(redis_url=own_redis.url, data_dir=tmp_path, allow_private_networks=True)
    async with _running(settings, fake_clock) as (client, _):
        assert (await client.put("/schedules/s", json={"every": 5, "task": TASK})
                ).status_code == 201
        await asyncio.to_thread(own_redis.stop)
        for method, path, kwargs in [
                ("PUT", "/schedules/t", {"json": {"every": 5, "task": TASK}}),
                ("GET", "/schedules/s", {}), ("GET", "/schedules", {}),
                ("DELETE", "/schedules/s", {}), ("POST", "/schedules/s/pause", {}),
                ("POST", "/schedules/s/resume", {})]:
            r = await client.request(method, path, **kwargs)
            assert r.status_code == 503, (method, path, r.text)
