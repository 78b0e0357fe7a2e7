"""on_success / on_failure through the API (docs/api.md v3, "Result callbacks"): accepted by
POST and PUT /tasks, batch items and schedules' task templates, shown in the task view; bad
input is a 422 and stores nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS
from tests.test_api import URL, expected_view, snapshot
from timewheel.store import Outcome, Store
from timewheel.store.results import ResultCallback

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


async def finish(store: Store, key: str, kind: str, url: str) -> None:
    """Claim, start and finish (``ok`` or ``fail``) the due task ``key``, reporting to its
    result callback ``url``: the outcome's script creates the result task."""
    bucket = store.keys.bucket_of(key)
    _, tasks = await store.claim(bucket, now_ms=START_MS, horizon_ms=START_MS, limit=10,
                                 token="tok")
    assert [t.key for t in tasks] == [key]
    await store.start(bucket, claims=[(key, "tok")])
    result = ResultCallback(url=url, verdict=kind, attempt=1,  # type: ignore[arg-type]
                            status_code=200 if kind == "ok" else 400, scheduled_at_ms=START_MS,
                            timeout_ms=10_000)
    assert await store.complete(bucket, now_ms=START_MS, outcomes=[Outcome(
        key, "tok", kind, status_code=result.status_code, started_ms=START_MS,  # type: ignore[arg-type]
        result=result)]) == [1]


LONGEST = "k" * 200  # the longest key a request may give


@pytest.mark.parametrize(("kind", "suffix", "url"), [
    ("ok", ".on_success", OK), ("fail", ".on_failure", NO)], ids=["on_success", "on_failure"])
async def test_the_result_task_of_the_longest_key_is_reachable_by_its_key(
        client: httpx.AsyncClient, store: Store, kind: str, suffix: str, url: str) -> None:
    """docs/api.md v3: a result task is "listed, visible" like any task. Under a 200-character
    key its key has 211: GET, its attempts, PATCH, DELETE and replay take it as they take
    any task's key (they answered 422: the path allowed 200)."""
    r = await client.post("/tasks", json={"key": LONGEST, "callback_url": URL, **BOTH})
    assert r.status_code == 201, r.text
    await finish(store, LONGEST, kind, url)
    key = LONGEST + suffix
    assert len(key) == 211
    listed = (await client.get("/tasks", params={"status": "scheduled"})).json()["tasks"]
    assert [t["key"] for t in listed] == [key]
    r = await client.get(f"/tasks/{key}")
    assert r.status_code == 200, r.text
    assert (r.json()["key"], r.json()["status"], r.json()["callback_url"]) == (
        key, "scheduled", url)
    assert r.json()["attempts_url"] == f"/tasks/{key}/attempts"
    r = await client.get(f"/tasks/{key}/attempts")
    assert (r.status_code, r.json()) == (200, {"attempts": []})
    r = await client.patch(f"/tasks/{key}", json={"delay": 60})
    assert (r.status_code, r.json()["execute_at"]) == (200, "2027-01-15T08:01:00.000Z")
    assert (await client.delete(f"/tasks/{key}")).status_code == 204
    assert (await client.get(f"/tasks/{key}")).json()["status"] == "cancelled"
    r = await client.post(f"/tasks/{key}/replay")
    assert (r.status_code, r.json()["status"]) == (200, "scheduled")
    # Its parent is untouched by all this.
    parent = (await client.get(f"/tasks/{LONGEST}")).json()
    assert parent["status"] == ("succeeded" if kind == "ok" else "failed")


@pytest.mark.parametrize("key", [
    pytest.param("k" * 201, id="201"),
    pytest.param("k" * 211, id="211-no-suffix"),
    pytest.param("k" * 200 + ".on_succes0", id="211-another-suffix"),
    pytest.param("k" * 201 + ".on_success", id="212-a-longer-parent"),
    pytest.param("k" * 200 + ".on_success.on_success", id="a-result-of-a-result"),
])
async def test_a_key_over_200_is_422_unless_a_result_tasks(
        client: httpx.AsyncClient, redis: Redis, key: str) -> None:
    """Only a 200-character key and a result suffix is longer than 200: anything else is a
    422 on every path, and nothing is stored or changed."""
    await client.post("/tasks", json={"key": LONGEST, "callback_url": URL, **BOTH})
    before = await snapshot(redis)
    for method, path, body in [
            ("GET", f"/tasks/{key}", None), ("GET", f"/tasks/{key}/attempts", None),
            ("DELETE", f"/tasks/{key}", None), ("PATCH", f"/tasks/{key}", {"delay": 5}),
            ("POST", f"/tasks/{key}/replay", None),
            ("PUT", f"/tasks/{key}", {"callback_url": URL})]:
        r = await client.request(method, path, json=body)
        assert r.status_code == 422, (method, path, r.text)
        assert r.json()["detail"][0]["loc"] == ["path", "key"], (method, r.text)
    assert await snapshot(redis) == before


@pytest.mark.parametrize("suffix", [".on_success", ".on_failure"])
async def test_creating_keeps_the_200_limit_for_a_result_key(
        client: httpx.AsyncClient, redis: Redis, suffix: str) -> None:
    """A result task's key over 200 is made by the service only: POST and PUT (its body and
    its path) refuse it, and store nothing. An unknown one is a 404 where a task's key is
    read (the control: it passes the path's pattern)."""
    key = LONGEST + suffix
    before = await snapshot(redis)
    r = await client.post("/tasks", json={"key": key, "callback_url": URL})
    assert (r.status_code, r.json()["detail"][0]["loc"]) == (422, ["body", "key"])
    r = await client.put(f"/tasks/{key}", json={"callback_url": URL})
    assert (r.status_code, r.json()["detail"][0]["loc"]) == (422, ["path", "key"])
    r = await client.post("/tasks/batch", json={"tasks": [{"key": key, "callback_url": URL}]})
    assert r.json()["results"][0]["status"] == 422
    assert await snapshot(redis) == before
    assert (await client.get(f"/tasks/{key}")).status_code == 404
    assert (await client.get(f"/tasks/{key}/attempts")).status_code == 404
    assert (await client.delete(f"/tasks/{key}")).status_code == 404
    assert await snapshot(redis) == before
