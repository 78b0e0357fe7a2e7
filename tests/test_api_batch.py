"""POST /tasks/batch against a real Redis, fake clock, no ticker: per-item outcomes in request
order, whole-request refusals that store nothing, the size limit, NOSCRIPT, Redis down."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hiredis
import httpx
import pytest
from fastapi.responses import JSONResponse
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tests.conftest import START_MS, running_app
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until
from tests.test_api import URL, expected_view, snapshot
from tests.test_api_redis_down import make_settings, poll, task_keys
from timewheel.api.app import MAX_REQUEST_BYTES, create_app
from timewheel.api.batch import created_view
from timewheel.api.views import FastJSONResponse, task_view
from timewheel.errors import StoreUnavailable
from timewheel.models import MAX_BODY_BYTES, BatchResult, TaskFields, format_ms
from timewheel.operations.prepare import prepare, sent_as_json
from timewheel.settings import Settings
from timewheel.store import ScheduleReply, Store
from timewheel.store.batch import CALL_TASKS, get_many, schedule_many, script_calls
from timewheel.store.keys import Keyspace

LATER = "2027-01-15T08:01:00.000Z"  # START_MS + 60 s


def item(key: str | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"callback_url": URL, **fields}
    if key is not None:
        body["key"] = key
    return body


async def test_mixed_batch_answers_each_item_in_request_order(
        client: httpx.AsyncClient, redis: Redis) -> None:
    """Created, identical repeat (200), conflict (409), invalid (422), generated key: each
    answered at its position; only the valid ones are stored."""
    r = await client.post("/tasks", json=item("old", delay=60))
    assert r.status_code == 201
    r = await client.post("/tasks/batch", json={"tasks": [
        item("a"),
        item("old", delay=60),                      # identical to the stored one
        item("old", delay=30),                      # same key, other content
        item("bad", callback_url="ftp://x"),        # invalid
        item(None, method="put"),                   # key generated
        "not an object",                            # invalid, no key
    ]})
    assert r.status_code == 200
    BatchResult.model_validate(r.json())  # the documented response model
    results = r.json()["results"]
    assert [(x["key"], x["status"]) for x in results] == [
        ("a", 201), ("old", 200), ("old", 409), ("bad", 422), (results[4]["key"], 201),
        (None, 422)]
    assert results[0] == {"key": "a", "status": 201, "task": expected_view("a"), "detail": None}
    assert results[1] == {"key": "old", "status": 200, "detail": None,
                          "task": expected_view("old", execute_at=LATER)}
    assert results[2] == {"key": "old", "status": 409,
                          "detail": "task 'old' exists with other content",
                          "task": expected_view("old", execute_at=LATER)}
    assert results[3]["task"] is None
    assert [(e["loc"], e["type"]) for e in results[3]["detail"]] == [
        (["body", "tasks", 3, "callback_url"], "value_error")]
    generated = results[4]["key"]
    assert results[4]["task"] == expected_view(generated, method="PUT")
    assert [(e["loc"], e["type"]) for e in results[5]["detail"]] == [
        (["body", "tasks", 5], "model_type")]
    for key, view in (("a", expected_view("a")), (generated, expected_view(generated,
                                                                            method="PUT"))):
        got = await client.get(f"/tasks/{key}")
        assert (got.status_code, got.json()) == (200, view)
    assert sorted(await redis.keys("*t:*")) == sorted(
        f"{{tw:{b}}}:t:{k}".encode() for k, b in (
            (k, _bucket(k)) for k in ("a", "old", generated)))
    assert (await client.get("/tasks/bad")).status_code == 404


def _bucket(key: str) -> int:
    return Keyspace("tw").bucket_of(key)


async def test_a_key_given_twice_acts_as_two_posts_in_order(client: httpx.AsyncClient) -> None:
    """First created; a later identical copy 200; a later different copy 409 (the stored task
    is the first one)."""
    r = await client.post("/tasks/batch", json={"tasks": [
        item("dup", delay=5), item("x"), item("dup", delay=5), item("dup", delay=9),
        item("dup", delay=5)]})
    assert [(x["key"], x["status"]) for x in r.json()["results"]] == [
        ("dup", 201), ("x", 201), ("dup", 200), ("dup", 409), ("dup", 200)]
    view = (await client.get("/tasks/dup")).json()
    assert view["execute_at"] == "2027-01-15T08:00:05.000Z"


async def test_settings_limits_and_oversize_body_are_item_422s(
        make_client: Callable[..., Any], settings: Settings, redis: Redis) -> None:
    """Horizon, timeout over the deadline, a blocked address, a body over 1 MiB: each that
    item's 422 in FastAPI's shape, located under body.tasks.<i>; the valid item is stored."""
    guarded = settings.model_copy(update={"allow_private_networks": False,
                                          "max_horizon_seconds": 3600.0})
    async with make_client(guarded) as client:
        r = await client.post("/tasks/batch", json={"tasks": [
            item("far", callback_url="https://example.com/h", delay=3601),
            item("slow", callback_url="https://example.com/h", timeout=31),
            item("local", callback_url="http://127.0.0.1/h"),
            item("big", callback_url="https://example.com/h", body="x" * MAX_BODY_BYTES),
            item("ok", callback_url="https://example.com/h"),
        ]})
    assert r.status_code == 200
    results = r.json()["results"]
    assert [(x["key"], x["status"]) for x in results] == [
        ("far", 422), ("slow", 422), ("local", 422), ("big", 422), ("ok", 201)]
    locs = [[(e["loc"], e["type"]) for e in x["detail"]] for x in results[:4]]
    assert locs == [[(["body", "tasks", 0, "delay"], "value_error")],
                    [(["body", "tasks", 1, "timeout"], "value_error")],
                    [(["body", "tasks", 2, "callback_url"], "value_error")],
                    [(["body", "tasks", 3, "body"], "too_large")]]
    assert "TIMEWHEEL_MAX_HORIZON_SECONDS" in results[0]["detail"][0]["msg"]
    assert results[2]["detail"][0]["msg"] == (
        "127.0.0.1 is loopback, not a public address; set TIMEWHEEL_ALLOW_PRIVATE_NETWORKS=true "
        "(or serve --allow-private-networks) to allow it, or list its network in "
        "TIMEWHEEL_ALLOWED_NETWORKS")
    assert str(MAX_BODY_BYTES) in results[3]["detail"][0]["msg"]
    assert await redis.keys("*t:*") == [f"{{tw:{_bucket('ok')}}}:t:ok".encode()]


@pytest.mark.parametrize("body", [
    {"tasks": []},
    {"tasks": [item(f"k{i}") for i in range(1001)]},
    {"tasks": item("k")},
    {"tasks": "k"},
    {"tasks": None},
    {},
    {"tasks": [item("k")], "extra": 1},
    [item("k")],
], ids=["empty", "1001", "object", "string", "null", "missing", "extra-field", "bare-list"])
async def test_bad_envelope_is_422_and_stores_nothing(client: httpx.AsyncClient, redis: Redis,
                                                      body: Any) -> None:
    before = await snapshot(redis)
    r = await client.post("/tasks/batch", json=body)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][0] == "body"
    assert await snapshot(redis) == before
    assert await redis.keys("*t:*") == []


async def test_1000_items_are_accepted(client: httpx.AsyncClient, redis: Redis) -> None:
    r = await client.post("/tasks/batch", json={"tasks": [item(f"k{i}") for i in range(1000)]})
    assert r.status_code == 200
    assert [x["status"] for x in r.json()["results"]] == [201] * 1000
    assert [x["key"] for x in r.json()["results"]] == [f"k{i}" for i in range(1000)]
    assert len(await redis.keys("*t:*")) == 1000


async def test_request_over_size_limit_is_413_and_stores_nothing(
        client: httpx.AsyncClient, redis: Redis) -> None:
    """Items each small, the whole request over the limit: 413, nothing stored."""
    per_item = MAX_REQUEST_BYTES // 1000 + 1
    body = {"tasks": [item(f"k{i}", body="x" * per_item) for i in range(1000)]}
    before = await snapshot(redis)
    r = await client.post("/tasks/batch", json=body)
    assert r.status_code == 413
    assert r.json()["detail"][0]["type"] == "too_large"
    assert await snapshot(redis) == before
    assert await redis.keys("*t:*") == []


async def test_malformed_json_is_422_and_token_comes_first(
        make_client: Callable[..., Any], settings: Settings, redis: Redis) -> None:
    """Without the token: 401 before the body is read; with it, NaN is refused as json_invalid."""
    secured = Settings(redis_url=settings.redis_url, allow_private_networks=True,
                       data_dir=settings.data_dir, api_tokens="s3cret")
    json_type = {"Content-Type": "application/json"}
    async with make_client(secured) as client:
        r = await client.post("/tasks/batch", content=b'{"tasks": [NaN]}', headers=json_type)
        assert r.status_code == 401
        r = await client.post("/tasks/batch", content=b'{"tasks": [NaN]}',
                              headers={"Authorization": "Bearer s3cret", **json_type})
        assert (r.status_code, r.json()["detail"][0]["type"]) == (422, "json_invalid")
        r = await client.post("/tasks/batch", json={"tasks": [item("k")]},
                              headers={"Authorization": "Bearer s3cret"})
        assert r.json()["results"][0]["status"] == 201
    assert len(await redis.keys("*t:*")) == 1


async def test_task_keyed_batch_is_still_reachable(client: httpx.AsyncClient) -> None:
    """The batch route does not hide a task whose key is "batch" from PUT, GET and DELETE."""
    assert (await client.put("/tasks/batch", json={"callback_url": URL})).status_code == 201
    assert (await client.get("/tasks/batch")).json() == expected_view("batch")
    assert (await client.delete("/tasks/batch")).status_code == 204


async def test_openapi_documents_items_as_task_create(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    body = schema["paths"]["/tasks/batch"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/BatchCreate"}
    tasks = schema["components"]["schemas"]["BatchCreate"]["properties"]["tasks"]
    assert tasks["items"] == {"$ref": "#/components/schemas/TaskCreate"}
    assert (tasks["minItems"], tasks["maxItems"]) == (1, 1000)
    ok = schema["paths"]["/tasks/batch"]["post"]["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/BatchResult"}


@pytest.mark.parametrize("body", [{"a": [1, 2.5, -0.0, 1e16, None]}, "text", None, 2**70, [],
                                  "[1, 2]"])
@pytest.mark.parametrize("headers", [{}, {"Content-Type": "application/json"},
                                     {"content-type": "text/plain"}])
def test_created_view_takes_a_body_sent_as_json_as_given(body: Any,
                                                         headers: dict[str, str]) -> None:
    """A body sent as its JSON text is shown as the request's value without decoding the
    stored bytes (a string with its own Content-Type is not: the view decodes it, and a JSON
    Content-Type shows "[1, 2]" as the list)."""
    fields = TaskFields(callback_url=URL, delay=1, headers=headers, body=body)
    task = prepare(fields, "k", START_MS, default_timeout=10)
    expected = task_view(task.as_record(START_MS)).model_dump(mode="json")
    given = created_view(task, format_ms(START_MS) or "", body=fields.body)
    decoded = created_view(task, format_ms(START_MS) or "")
    assert decoded == expected
    if sent_as_json(fields):
        assert given == expected
    else:
        assert isinstance(body, str) and headers  # the control: only such bodies are not
        parsed = body == "[1, 2]" and "json" in str(headers)  # a JSON type: decoded if it can be
        assert expected["body"] == (json.loads(body) if parsed else body)


@pytest.mark.parametrize("due_ms", [0, 999, 1000, START_MS, START_MS + 1, 4_102_444_799_999])
def test_created_view_is_the_models_view(due_ms: int) -> None:
    """The dict built for a created item equals NewTask.view dumped by its model."""
    fields = TaskFields(callback_url=URL, execute_at=due_ms / 1000, method="patch",
                        max_attempts=7, headers={"X-A": "1"}, body=[1, "two"], timeout=2.5)
    task = prepare(fields, "k", START_MS + 7, default_timeout=10)
    assert created_view(task, format_ms(START_MS + 7) or "") == task_view(
        task.as_record(START_MS + 7)).model_dump(mode="json")


async def test_batch_views_show_each_body_as_sent(client: httpx.AsyncClient) -> None:
    """The batch's response is encoded by orjson: JSON bodies come back as the same values,
    text as the same text, and an integer beyond 64 bits (which orjson refuses) through
    json.dumps; the control is a single POST's view, encoded by FastAPI."""
    bodies: list[Any] = [{"n": 1, "f": 0.1, "big": 1e300, "s": "ünï 😀 \u2028", "l": [None, True]},
                         "plain text", {"huge": 2**70}, None]
    r = await client.post("/tasks/batch", json={"tasks": [
        item(f"b{i}", body=body) for i, body in enumerate(bodies)]})
    assert r.status_code == 200
    assert [res["task"]["body"] for res in r.json()["results"]] == bodies
    for i, body in enumerate(bodies):
        single = await client.post("/tasks", json=item(f"s{i}", body=body))
        assert single.json()["body"] == body


def test_fast_json_response_writes_what_json_response_writes() -> None:
    content = {"results": [{"key": "k", "task": {"body": {"é": [1, 2.5, None, "x\ny"]},
                                                 "headers": {}}, "detail": None}]}
    assert json.loads(FastJSONResponse(content).body) == content
    assert json.loads(FastJSONResponse(content).body) == json.loads(JSONResponse(content).body)
    huge = {"body": {"huge": 2**70}}
    assert FastJSONResponse(huge).body == JSONResponse(huge).body  # orjson refuses, json.dumps


# -- the store half ----------------------------------------------------------------------------

def test_script_calls_group_by_bucket_and_keep_a_keys_occurrences_together() -> None:
    bucket = {"a": 0, "b": 1, "c": 0, "d": 0}.__getitem__
    assert script_calls(["a", "b", "a", "c", "d", "b"], bucket) == [(0, [0, 2, 3, 4]),
                                                                     (1, [1, 5])]
    assert script_calls([], bucket) == []
    # A bucket's calls take CALL_TASKS keys at most; a key given again joins its first's call.
    keys = [f"k{i}" for i in range(CALL_TASKS + 1)] + ["k0", f"k{CALL_TASKS}"]
    calls = script_calls(keys, lambda key: 0)
    assert calls == [(0, [*range(CALL_TASKS), CALL_TASKS + 1]),
                     (0, [CALL_TASKS, CALL_TASKS + 2])]


def test_hiredis_packs_a_schedule_call_as_redis_py_does(store: Store) -> None:
    """The batch path packs with hiredis; the bytes equal redis-py's own packing."""
    fields = TaskFields(callback_url=URL + "/é?q=1", headers={"X-Name": "ünï"}, delay=1.5,
                        body={"text": "日本", "n": [1, 2.5, None]}, max_attempts=9)
    task = prepare(fields, "k:1", START_MS, default_timeout=10)
    keys = [store.keys.prefix(store.keys.bucket_of(task.key))]
    args = ["create", START_MS, *store.schedule_args(task, "b.1")]
    command = ("EVALSHA", store.scripts.schedule.sha, 1, *keys, *args)
    assert hiredis.pack_command(command) == b"".join(Connection().pack_command(*command))


async def test_schedule_many_after_script_flush(store: Store, redis: Redis) -> None:
    """NOSCRIPT (the script cache emptied, as after a restart) inside the pipeline: each call
    runs again through the registered script; every task stored once, codes as usual."""
    def task(key: str, delay: float = 0) -> Any:
        return prepare(TaskFields(callback_url=URL, delay=delay), key, 1000, default_timeout=10)

    assert await schedule_many(store, [task("a")], 1000) == [0]
    await redis.script_flush()
    codes = await schedule_many(store, [task("a"), task("b"), task("a", 5), task("b")], 1000)
    assert codes == [2, 0, -1, 2]
    assert await redis.script_exists(store.scripts.schedule.sha) == [True]
    views = await get_many(store, ["a", "b", "missing"])
    assert [v.key if v else None for v in views] == ["a", "b", None]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


async def test_a_cancelled_batch_leaves_no_unread_replies(redis_server: RedisServer,
                                                         redis: Redis) -> None:
    """A request cancelled while its replies are pending (a client gone, a timeout): the
    connection is dropped, so the next batch on the same single-connection pool reads its
    own replies, not the stale ones."""
    pool = BlockingConnectionPool.from_url(redis_server.url, max_connections=1)
    client = Redis.from_pool(pool)
    store = Store(client, "tw", retention_ms=1000, lease_margin_ms=1000)
    await store.init()

    def task(key: str) -> Any:
        return prepare(TaskFields(callback_url=URL), key, START_MS, default_timeout=10)

    await schedule_many(store, [task("warm")], START_MS)  # script loaded, connection made

    async def held(count: int) -> bool:  # connections whose command Redis holds back
        return (await redis.info("clients"))["blocked_clients"] == count

    # Paused for writes, Redis holds the batch's scripts until the pause ends, so the cancel
    # comes while the replies are pending however slowly this runs (a DEBUG SLEEP of 0.3 s,
    # with fixed sleeps of 0.1 s before the cancel, could end first on a loaded machine).
    await redis.client_pause(30_000, all=False)
    try:
        first = asyncio.create_task(schedule_many(store, [task(f"a{i}") for i in range(50)],
                                                  START_MS))
        await wait_until(lambda: held(1), "the batch held by Redis")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        # Dropped: Redis frees the connection, and the batch it held back with it.
        await wait_until(lambda: held(0), "the cancelled batch's connection closed")
    finally:
        await redis.client_unpause()
    codes = await schedule_many(store, [task("a0"), task("b0"), task("warm")], START_MS)
    assert codes == [ScheduleReply.CREATED, ScheduleReply.CREATED, ScheduleReply.EXISTS]
    await client.aclose()


async def test_a_batch_reading_past_the_socket_timeout_fails_and_the_next_one_is_clean(
        redis_server: RedisServer, redis: Redis) -> None:
    """The replies of a round share one deadline (store/batch.py _exchange) instead of a timeout
    per read_response: Redis stalled past the socket timeout is still a redis TimeoutError,
    the connection is dropped (no stale replies for the next batch); a stall shorter than the
    socket timeout is waited for."""
    pool = BlockingConnectionPool.from_url(redis_server.url, max_connections=1,
                                           socket_timeout=0.25, retry=Retry(NoBackoff(), 0))
    client = Redis.from_pool(pool)
    store = Store(client, "tw", retention_ms=1000, lease_margin_ms=1000)
    await store.init()

    def task(key: str) -> Any:
        return prepare(TaskFields(callback_url=URL), key, START_MS, default_timeout=10)

    await schedule_many(store, [task("warm")], START_MS)  # script loaded, connection made

    async def stalled(seconds: float, keys: list[str]) -> list[int]:
        busy = asyncio.create_task(redis.execute_command("DEBUG", "SLEEP", str(seconds)))
        await asyncio.sleep(0.02)
        try:
            return await schedule_many(store, [task(k) for k in keys], START_MS)
        finally:
            await busy

    assert await stalled(0.1, ["s0", "s1"]) == [ScheduleReply.CREATED, ScheduleReply.CREATED]
    with pytest.raises(StoreUnavailable, match="TimeoutError: Timeout reading from"):
        await stalled(0.6, [f"a{i}" for i in range(50)])
    codes = await schedule_many(store, [task("a0"), task("b0"), task("warm")], START_MS)
    assert codes == [ScheduleReply.EXISTS, ScheduleReply.CREATED, ScheduleReply.EXISTS]
    await client.aclose()


async def test_redis_down_is_503_and_the_app_recovers(own_redis: RedisServer,
                                                     tmp_path: Path) -> None:
    """Redis stopped: 503 with Retry-After, never a partial 200, nothing stored; back on the
    same port (script cache empty): the same batch is created."""
    async with running_app(create_app(make_settings(own_redis, tmp_path))) as client:
        batch = {"tasks": [item("k1", delay=3600), item("k2", delay=3600)]}
        await asyncio.to_thread(own_redis.stop)
        for _ in range(2):
            r = await client.post("/tasks/batch", json=batch)
            assert (r.status_code, r.headers["retry-after"]) == (503, "1")
            assert r.json() == {"detail": "Redis is unavailable; try again later"}
        await asyncio.to_thread(own_redis.start)
        assert await task_keys(own_redis) == []
        assert set(await poll(client, "GET", "/healthz", 200)) <= {503, 200}
        r = await client.post("/tasks/batch", json=batch)
        assert [x["status"] for x in r.json()["results"]] == [201, 201]
        views = [(await client.get(f"/tasks/{k}")).json()["status"] for k in ("k1", "k2")]
        assert views == ["scheduled", "scheduled"]
