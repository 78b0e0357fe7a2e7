"""on_success / on_failure through the API (docs/api.md v3, "Result callbacks"): accepted by
POST and PUT /tasks, batch items and schedules' task templates, shown in the task view; bad
input is a 422 and stores nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.test_api import URL, expected_view, snapshot

OK = "http://127.0.0.1:9/ok"
NO = "https://example.com/failed"
BOTH = {"on_success": OK, "on_failure": NO}


async def test_post_put_and_get_show_the_urls(client: httpx.AsyncClient) -> None:
    r = await client.post("/tasks", json={"key": "a", "callback_url": URL, **BOTH})
    assert (r.status_code, r.json()) == (201, expected_view("a", **BOTH))
    assert (await client.get("/tasks/a")).json() == expected_view("a", **BOTH)
    # A repeat is the same task; other result URLs are other content.
    r = await client.post("/tasks", json={"key": "a", "callback_url": URL, **BOTH})
    assert r.status_code == 200
    r = await client.post("/tasks", json={"key": "a", "callback_url": URL, "on_success": OK})
    assert r.status_code == 409
    # PUT replaces the whole task: without them, the task has none any more.
    r = await client.put("/tasks/a", json={"callback_url": URL, "on_failure": NO})
    assert (r.status_code, r.json()["on_success"], r.json()["on_failure"]) == (200, None, NO)
    r = await client.put("/tasks/a", json={"callback_url": URL})
    assert (r.json()["on_success"], r.json()["on_failure"]) == (None, None)
    assert (await client.get("/tasks/a")).json() == expected_view("a")
    listed = (await client.get("/tasks", params={"status": "scheduled"})).json()["tasks"]
    assert [(t["key"], t["on_failure"]) for t in listed] == [("a", None)]


async def test_batch_items_and_schedule_templates_take_them(client: httpx.AsyncClient) -> None:
    r = await client.post("/tasks/batch", json={"tasks": [
        {"key": "b1", "callback_url": URL, **BOTH}, {"key": "b2", "callback_url": URL}]})
    assert [x["status"] for x in r.json()["results"]] == [201, 201]
    assert r.json()["results"][0]["task"] == expected_view("b1", **BOTH)
    assert (await client.get("/tasks/b1")).json()["on_failure"] == NO
    r = await client.put("/schedules/s", json={"every": 60, "task": {"callback_url": URL,
                                                                     "on_failure": NO}})
    assert r.status_code == 201, r.text
    assert r.json()["task"]["on_failure"] == NO


BAD: list[tuple[dict[str, Any], str]] = [
    ({"on_success": "/relative"}, "on_success"),
    ({"on_failure": "ftp://example.com/x"}, "on_failure"),
    ({"on_success": "http://example.com/" + "x" * 2048}, "on_success"),
    ({"on_success": 42}, "on_success"),
]


@pytest.mark.parametrize(("fields", "field"), BAD)
async def test_bad_urls_are_422_and_store_nothing(client: httpx.AsyncClient, redis: Redis,
                                                  fields: dict[str, Any], field: str) -> None:
    before = await snapshot(redis)
    r = await client.post("/tasks", json={"key": "a", "callback_url": URL, **fields})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", field]
    r = await client.put("/tasks/a", json={"callback_url": URL, **fields})
    assert r.status_code == 422
    r = await client.put("/schedules/s", json={"every": 5, "task": {"callback_url": URL,
                                                                    **fields}})
    assert r.status_code == 422
    r = await client.post("/tasks/batch", json={"tasks": [{"callback_url": URL, **fields}]})
    assert r.json()["results"][0]["status"] == 422
    assert await snapshot(redis) == before


async def test_private_network_result_urls_are_refused(make_client: Any, settings: Any,
                                                       redis: Redis) -> None:
    """The callback URL's SSRF guard applies to them: a loopback on_success is a 422 (and the
    same request with a public one is accepted: the control)."""
    guarded = settings.model_copy(update={"allow_private_networks": False})
    async with make_client(guarded) as client:
        before = await snapshot(redis)
        for field in ("on_success", "on_failure"):
            body = {"key": "a", "callback_url": "https://example.com/hook",
                    field: "http://127.0.0.1:9000/result"}
            r = await client.post("/tasks", json=body)
            assert r.status_code == 422, r.text
            assert r.json()["detail"][0]["loc"] == ["body", field]
            assert "TIMEWHEEL_ALLOW_PRIVATE_NETWORKS" in r.json()["detail"][0]["msg"]
            r = await client.put("/schedules/s", json={"every": 5, "task": {
                "callback_url": "https://example.com/hook", field: "http://10.0.0.1/r"}})
            assert r.status_code == 422
            assert r.json()["detail"][0]["loc"] == ["body", "task", field]
        assert await snapshot(redis) == before
        r = await client.post("/tasks", json={"key": "a", "callback_url": "https://example.com/h",
                                              "on_success": "https://example.com/result"})
        assert r.status_code == 201, r.text


@pytest.mark.parametrize("key", ["x.on_success", "x.on_failure"])
async def test_a_result_task_takes_no_result_callback(client: httpx.AsyncClient, redis: Redis,
                                                      key: str) -> None:
    """Its own outcome calls no further result callback: a task under a result key may not
    have one (a plain task under such a key is allowed: the control)."""
    before = await snapshot(redis)
    r = await client.post("/tasks", json={"key": key, "callback_url": URL, "on_failure": NO})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "on_failure"]
    r = await client.put(f"/tasks/{key}", json={"callback_url": URL, "on_success": OK})
    assert r.status_code == 422
    assert await snapshot(redis) == before
    assert (await client.post("/tasks", json={"key": key, "callback_url": URL})).status_code == 201
