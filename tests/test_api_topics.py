"""``/topics`` over HTTP against a real Redis, with a fake clock and no ticker: topics, and
publishes that make one task per endpoint, all or none."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.support.cursors import assert_cursor_refused, b64, cursors_not_handed_out
from tests.support.redis_server import RedisServer
from timewheel.settings import Settings

URL = "http://127.0.0.1:9"
ENDPOINTS = [{"name": "billing", "url": f"{URL}/billing", "headers": {"X-Team": "billing"}},
             {"name": "email", "url": f"{URL}/email"},
             {"name": "ana.lytics-2", "url": "http://127.0.0.1:10/a"}]


async def snapshot(redis: Redis) -> dict[bytes, Any]:
    """Every key and its value's dump: what "nothing stored" compares."""
    return {key: await redis.dump(key) async for key in redis.scan_iter(match="*")}


async def put_topic(client: httpx.AsyncClient, name: str = "orders",
                    endpoints: list[dict[str, Any]] | None = None) -> httpx.Response:
    return await client.put(f"/topics/{name}", json={"endpoints": endpoints or ENDPOINTS})


# -- topics ---------------------------------------------------------------------------------------

async def test_put_creates_then_replaces(client: httpx.AsyncClient) -> None:
    created = await put_topic(client)
    assert created.status_code == 201
    assert created.headers["location"] == "/topics/orders"
    view = created.json()
    assert view["name"] == "orders"
    assert view["endpoints"][1] == {"name": "email", "url": f"{URL}/email", "headers": {}}
    replaced = await put_topic(client, endpoints=ENDPOINTS[:1])
    assert replaced.status_code == 200
    assert [e["name"] for e in replaced.json()["endpoints"]] == ["billing"]
    assert replaced.json()["created_at"] == view["created_at"]
    got = (await client.get("/topics/orders")).json()
    assert [e["name"] for e in got["endpoints"]] == ["billing"]
    assert got["recent_publishes"] == []


async def test_get_and_delete_unknown_are_404(client: httpx.AsyncClient) -> None:
    assert (await client.get("/topics/nope")).status_code == 404
    assert (await client.delete("/topics/nope")).status_code == 404
    await put_topic(client)
    assert (await client.delete("/topics/orders")).status_code == 204
    assert (await client.get("/topics/orders")).status_code == 404


async def test_list_pages_in_name_order(client: httpx.AsyncClient) -> None:
    names = [f"t{i:02d}" for i in range(7)]
    for name in reversed(names):
        await put_topic(client, name)
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/topics", params=params)).json()
        seen += [t["name"] for t in page["topics"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == names


async def test_list_cursor_is_opaque_and_reusable(client: httpx.AsyncClient) -> None:
    for name in ("t00", "t01", "t02"):
        await put_topic(client, name)
    cursor = (await client.get("/topics", params={"limit": 1})).json()["next_cursor"]
    assert cursor and "t00" not in cursor
    pages = [(await client.get("/topics", params={"limit": 1, "cursor": cursor})).json()
             for _ in range(2)]
    assert pages[0] == pages[1] and [t["name"] for t in pages[0]["topics"]] == ["t01"]


@pytest.mark.parametrize("cursor", cursors_not_handed_out("topics", "t00"))
async def test_a_cursor_the_listing_did_not_hand_out_is_422(
        client: httpx.AsyncClient, redis: Redis, cursor: str) -> None:
    """As GET /tasks: a cursor the listing could not have handed out is a 422 naming the
    cursor, not a page from somewhere (a bare topic name was one: the listing used to hand
    out its last name as it was); nothing is read or stored for it."""
    await put_topic(client, "t00")
    await put_topic(client, "t01")
    await assert_cursor_refused(client, redis, "/topics", cursor)
    # Control: the cursor the listing hands out for "t00" works.
    r = await client.get("/topics", params={"cursor": b64("topics\nt00")})
    assert [t["name"] for t in r.json()["topics"]] == ["t01"]


@pytest.mark.parametrize("endpoints", [
    pytest.param([], id="none"),
    pytest.param([{"name": f"e{i}", "url": f"{URL}/{i}"} for i in range(101)], id="101"),
    pytest.param([{"name": "a", "url": f"{URL}/1"}, {"name": "a", "url": f"{URL}/2"}],
                 id="duplicate-names"),
    pytest.param([{"name": "a b", "url": f"{URL}/1"}], id="name-chars"),
    pytest.param([{"name": "a:b", "url": f"{URL}/1"}], id="name-colon"),
    pytest.param([{"name": "a", "url": "ftp://example.com/x"}], id="not-http"),
    pytest.param([{"name": "a", "url": f"{URL}/1", "headers": {"Host": "x"}}], id="hop-header"),
    pytest.param([{"name": "a", "url": f"{URL}/1", "extra": 1}], id="unknown-field"),
])
async def test_bad_topics_are_422_and_store_nothing(client: httpx.AsyncClient, redis: Redis,
                                                    endpoints: list[dict[str, Any]]) -> None:
    await put_topic(client, "kept")
    before = await snapshot(redis)
    answer = await client.put("/topics/orders", json={"endpoints": endpoints})
    assert answer.status_code == 422, answer.text
    assert await snapshot(redis) == before


async def test_exactly_100_endpoints_are_accepted(client: httpx.AsyncClient) -> None:
    """Control of the 101 case: the limit is 100."""
    endpoints = [{"name": f"e{i}", "url": f"{URL}/{i}"} for i in range(100)]
    assert (await put_topic(client, endpoints=endpoints)).status_code == 201


async def test_a_private_endpoint_is_refused_by_the_network_guard(
        make_client: Callable[..., Any], redis_server: RedisServer, redis: Redis,
        tmp_path: Path) -> None:
    guarded = Settings(redis_url=redis_server.url, allow_private_networks=False,
                       data_dir=tmp_path)
    async with make_client(guarded) as client:
        before = await snapshot(redis)
        answer = await client.put("/topics/orders", json={"endpoints": [
            {"name": "ok", "url": "https://example.com/hook"},
            {"name": "inside", "url": "http://10.1.2.3/hook"}]})
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == ["body", "endpoints", 1, "url"]
        assert "TIMEWHEEL_ALLOW_PRIVATE_NETWORKS" in answer.json()["detail"][0]["msg"]
        assert await snapshot(redis) == before
        # Control: the same topic without the private endpoint is stored.
        fine = await client.put("/topics/orders", json={"endpoints": [
            {"name": "ok", "url": "https://example.com/hook"}]})
        assert fine.status_code == 201


# -- publish --------------------------------------------------------------------------------------

async def test_publish_makes_one_task_per_endpoint(client: httpx.AsyncClient) -> None:
    await put_topic(client)
    answer = await client.post("/topics/orders/publish", json={
        "key": "o1", "delay": 5, "body": {"id": 1}, "max_attempts": 3,
        "headers": {"x-team": "all", "X-Trace": "t1"}})
    assert answer.status_code == 201, answer.text
    tasks = answer.json()["tasks"]
    assert [t["key"] for t in tasks] == ["o1.billing", "o1.email", "o1.ana.lytics-2"]
    assert [t["callback_url"] for t in tasks] == [e["url"] for e in ENDPOINTS]
    # Endpoint headers over the published ones (names compared case-insensitively).
    assert tasks[0]["headers"] == {"X-Trace": "t1", "X-Team": "billing",
                                   "Content-Type": "application/json"}
    assert tasks[1]["headers"] == {"x-team": "all", "X-Trace": "t1",
                                   "Content-Type": "application/json"}
    assert {t["execute_at"] for t in tasks} == {"2027-01-15T08:00:05.000Z"}
    assert {t["max_attempts"] for t in tasks} == {3}
    # Each its own flow: its endpoint's destination.
    assert [t["flow_key"] for t in tasks] == ["127.0.0.1:9", "127.0.0.1:9", "127.0.0.1:10"]
    for task in tasks:
        stored = (await client.get(f"/tasks/{task['key']}")).json()
        assert stored == task
    recent = (await client.get("/topics/orders")).json()["recent_publishes"]
    assert recent == [{"key": "o1", "published_at": "2027-01-15T08:00:00.000Z"}]


async def test_publish_repeat_is_200_and_other_content_409(client: httpx.AsyncClient,
                                                           redis: Redis) -> None:
    await put_topic(client)
    body = {"key": "o1", "body": {"id": 1}}
    first = await client.post("/topics/orders/publish", json=body)
    assert first.status_code == 201
    again = await client.post("/topics/orders/publish", json=body)
    assert again.status_code == 200
    assert again.json() == first.json()
    # Still the same tasks after the topic changed: the publish is what it was.
    await put_topic(client, endpoints=ENDPOINTS[:1])
    later = await client.post("/topics/orders/publish", json=body)
    assert later.status_code == 200
    assert [t["key"] for t in later.json()["tasks"]] == [t["key"] for t in first.json()["tasks"]]
    before = await snapshot(redis)
    other = await client.post("/topics/orders/publish", json={"key": "o1", "body": {"id": 2}})
    assert other.status_code == 409
    assert await snapshot(redis) == before


async def test_publish_to_an_unknown_topic_is_404(client: httpx.AsyncClient,
                                                  redis: Redis) -> None:
    before = await snapshot(redis)
    answer = await client.post("/topics/nope/publish", json={"key": "o1"})
    assert answer.status_code == 404
    assert await snapshot(redis) == before


async def test_publish_without_key_gets_one(client: httpx.AsyncClient) -> None:
    await put_topic(client)
    tasks = (await client.post("/topics/orders/publish", json={})).json()["tasks"]
    keys = [t["key"].rsplit(".", 1)[0] for t in tasks[:2]]
    assert keys[0] == keys[1] and len(keys[0]) >= 16


@pytest.mark.parametrize(("body", "status"), [
    pytest.param({"callback_url": f"{URL}/x"}, 422, id="callback_url"),
    pytest.param({"key": "a" * 195}, 422, id="task-key-too-long"),
    pytest.param({"key": "bad key"}, 422, id="bad-key"),
    pytest.param({"delay": 400 * 86400}, 422, id="beyond-horizon"),
    pytest.param({"timeout": 31}, 422, id="timeout-over-deadline"),
    pytest.param({"headers": {f"H{i}": "v" for i in range(50)}}, 422, id="merged-headers-51"),
    pytest.param({"body": "x" * (1024 * 1024 + 1)}, 413, id="body-too-large"),
])
async def test_bad_publishes_store_nothing(client: httpx.AsyncClient, redis: Redis,
                                           body: dict[str, Any], status: int) -> None:
    await put_topic(client)
    before = await snapshot(redis)
    answer = await client.post("/topics/orders/publish", json=body)
    assert answer.status_code == status, answer.text
    assert await snapshot(redis) == before


async def test_a_publish_stores_at_most_4_mib_of_bodies_in_all(client: httpx.AsyncClient,
                                                               redis: Redis) -> None:
    """Each endpoint's task stores the body, all in one script call: five copies of 900 KiB
    (4.4 MiB) are refused with nothing stored, four (3.5 MiB) are created."""
    body = {"key": "big", "body": "x" * (900 * 1024)}
    await put_topic(client, endpoints=[{"name": f"e{i}", "url": f"{URL}/{i}"} for i in range(5)])
    before = await snapshot(redis)
    answer = await client.post("/topics/orders/publish", json=body)
    assert answer.status_code == 413, answer.text
    assert "5 endpoints" in answer.json()["detail"][0]["msg"]
    assert await snapshot(redis) == before
    await put_topic(client, endpoints=[{"name": f"e{i}", "url": f"{URL}/{i}"} for i in range(4)])
    assert (await client.post("/topics/orders/publish", json=body)).status_code == 201


async def test_a_taken_task_key_refuses_the_whole_publish(client: httpx.AsyncClient,
                                                          redis: Redis) -> None:
    """A task made by hand under one of the publish's keys, with other content: 409 naming it,
    and none of the other tasks is created (one script checks all before writing)."""
    await put_topic(client)
    made = await client.post("/tasks", json={"key": "o1.email", "callback_url": f"{URL}/x"})
    assert made.status_code == 201
    before = await snapshot(redis)
    answer = await client.post("/topics/orders/publish", json={"key": "o1"})
    assert answer.status_code == 409
    assert "o1.email" in answer.json()["detail"]
    assert await snapshot(redis) == before
    assert (await client.get("/tasks/o1.billing")).status_code == 404
    # Control: the same publish under a free key is created.
    assert (await client.post("/topics/orders/publish", json={"key": "o2"})).status_code == 201


async def test_publish_tasks_are_spread_over_buckets(client: httpx.AsyncClient,
                                                     redis: Redis) -> None:
    """The tasks of one publish live in their own buckets (crc32 of their keys), so one
    script call wrote several buckets: the atomic step is not a single-bucket one."""
    await put_topic(client)
    await client.post("/topics/orders/publish", json={"key": "o1"})
    task_keys = [k.decode() async for k in redis.scan_iter(match="*}:t:o1.*")]
    assert len(task_keys) == 3
    assert len({k.split("}")[0] for k in task_keys}) > 1


async def test_a_publish_passes_result_callbacks_to_each_task(client: httpx.AsyncClient,
                                                              redis: Redis) -> None:
    """on_success / on_failure of a publish, as POST /tasks takes them, go to every task."""
    await put_topic(client)
    answer = await client.post("/topics/orders/publish", json={
        "key": "o1", "on_success": f"{URL}/ok", "on_failure": f"{URL}/failed"})
    assert answer.status_code == 201, answer.text
    for task in answer.json()["tasks"]:
        assert (task["on_success"], task["on_failure"]) == (f"{URL}/ok", f"{URL}/failed")
        stored = (await client.get(f"/tasks/{task['key']}")).json()
        assert (stored["on_success"], stored["on_failure"]) == (f"{URL}/ok", f"{URL}/failed")
    before = await snapshot(redis)
    bad = await client.post("/topics/orders/publish", json={"key": "o2", "on_success": "ftp://x"})
    assert bad.status_code == 422
    assert await snapshot(redis) == before


async def test_published_tasks_are_sealed_like_any_task(
        make_client: Callable[..., Any], redis_server: RedisServer, redis: Redis,
        tmp_path: Path) -> None:
    """TIMEWHEEL_ENCRYPTION_KEYS: a published task's headers and body are stored sealed (no
    plaintext in a dump of Redis), shown opened, and a repeat still answers 200."""
    sealed = Settings(redis_url=redis_server.url, allow_private_networks=True, data_dir=tmp_path,
                      encryption_keys=f"k0:{base64.b64encode(bytes(range(32))).decode()}")
    async with make_client(sealed) as client:
        await put_topic(client, endpoints=ENDPOINTS[1:2])
        body = {"key": "o1", "body": {"card": "s3cr3t-body"}, "headers": {"X-Api": "s3cr3t-hdr"}}
        assert (await client.post("/topics/orders/publish", json=body)).status_code == 201
        dumped = b"".join([value for value in (await snapshot(redis)).values() if value])
        assert b"s3cr3t" not in dumped
        # Control: the same dump holds the plaintext of what is not sealed (the endpoint URL).
        assert b"/email" in dumped
        task = (await client.get("/tasks/o1.email")).json()
        assert task["body"] == {"card": "s3cr3t-body"} and task["headers"]["X-Api"] == "s3cr3t-hdr"
        assert (await client.post("/topics/orders/publish", json=body)).status_code == 200


async def test_a_spec_under_a_key_no_longer_listed_is_a_500_saying_so(
        make_client: Callable[..., Any], redis_server: RedisServer, tmp_path: Path) -> None:
    """A topic or schedule sealed under k0, read by a service that lists k1 only: no retry
    helps, so not the 503 "Redis is unavailable" (with its Retry-After) that it was; a 500
    naming the record and the key id. The listings still answer, without it."""
    def keys(*ids: str) -> str:
        return ",".join(f"{i}:{base64.b64encode(bytes([n]) * 32).decode()}"
                        for n, i in enumerate(ids))

    def sealed(*ids: str) -> Settings:
        return Settings(redis_url=redis_server.url, allow_private_networks=True,
                        data_dir=tmp_path, encryption_keys=keys(*ids))

    schedule = {"every": 3600, "task": {"callback_url": f"{URL}/nightly"}}
    async with make_client(sealed("k0")) as client:
        await put_topic(client)
        assert (await client.put("/schedules/nightly", json=schedule)).status_code == 201
    async with make_client(sealed("k1")) as client:  # k0 is not listed any more
        assert (await client.put("/schedules/other", json=schedule)).status_code == 201
        for method, path, name in [("GET", "/topics/orders", "topic 'orders'"),
                                   ("POST", "/topics/orders/publish", "topic 'orders'"),
                                   ("GET", "/schedules/nightly", "schedule 'nightly'")]:
            r = await client.request(method, path, json={"key": "o1"} if method == "POST"
                                     else None)
            assert r.status_code == 500, (path, r.text)
            assert "retry-after" not in r.headers
            assert name in r.json()["detail"] and "key id 'k0'" in r.json()["detail"]
        assert (await client.get("/topics")).json()["topics"] == []
        listed = (await client.get("/schedules")).json()["schedules"]
        assert [s["id"] for s in listed] == ["other"]
