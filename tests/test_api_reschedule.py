"""PATCH /tasks/{key}: reschedule a task that has not finished, keeping its request
(docs/api.md v3). Real Redis, fake clock, no ticker."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS
from tests.test_api import URL, fail_due, snapshot
from timewheel.clock import FakeClock
from timewheel.scopes import ApiToken
from timewheel.store import Outcome, Store

TASK = {"key": "r", "callback_url": URL, "method": "PUT", "delay": 60, "timeout": 3,
        "retry_backoff": 2, "max_attempts": 4, "flow_key": "orders",
        "headers": {"X-Order": "42"}, "body": {"order": 42}}


async def test_patch_moves_the_task_and_keeps_its_request(
        client: httpx.AsyncClient, store: Store, redis: Redis, fake_clock: FakeClock) -> None:
    created = (await client.post("/tasks", json=TASK)).json()
    before = await store.record("r")
    fake_clock.advance(1000)
    r = await client.patch("/tasks/r", json={"delay": 600})
    assert r.status_code == 200, r.text
    view = r.json()
    assert view == {**created, "execute_at": "2027-01-15T08:10:01.000Z",
                    "next_attempt_at": "2027-01-15T08:10:01.000Z"}
    assert (await client.get("/tasks/r")).json() == view
    after = await store.record("r")
    assert before is not None and after is not None
    kept = ("url", "meth", "headers", "body", "flow", "timeout", "backoff", "max", "created",
            "fp", "att")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}
    assert (after["due"], after["exec"]) == (START_MS + 601_000,) * 2
    bucket, minute = store.keys.bucket_of("r"), START_MS // 60000
    assert await redis.zrange(store.keys.slice(bucket, minute + 10), 0, -1,
                              withscores=True) == [(b"r", START_MS + 601_000)]
    assert await redis.smembers(store.keys.delete_set(bucket, minute + 1)) == {b"r"}
    # execute_at in either form, and a new max_attempts.
    r = await client.patch("/tasks/r", json={"execute_at": START_MS / 1000 + 30,
                                             "max_attempts": 9})
    assert r.status_code == 200, r.text
    assert (r.json()["execute_at"], r.json()["max_attempts"]) == ("2027-01-15T08:00:30.000Z", 9)


async def retry_once(store: Store, key: str, now_ms: int, next_due_ms: int) -> None:
    """Claim, start and record a 503 to retry at ``next_due_ms``."""
    bucket, token = store.keys.bucket_of(key), "tok"
    _, tasks = await store.claim(bucket, now_ms=now_ms, horizon_ms=now_ms, limit=10,
                                 token=token)
    assert [t.key for t in tasks] == [key]
    assert (await store.start(bucket, claims=[(key, token)]))[0].attempt == 1
    assert await store.complete(bucket, now_ms=now_ms, outcomes=[Outcome(
        key, token, "retry", status_code=503, error="HTTP 503", next_due_ms=next_due_ms,
        started_ms=now_ms)]) == [1]


async def test_patch_a_retrying_task_keeps_its_attempts_and_last_outcome(
        client: httpx.AsyncClient, store: Store) -> None:
    await client.post("/tasks", json={"key": "t", "callback_url": URL, "max_attempts": 2})
    await retry_once(store, "t", START_MS, START_MS + 1000)
    r = await client.patch("/tasks/t", json={"delay": 3600})
    assert r.status_code == 200, r.text
    view = r.json()
    assert (view["status"], view["attempts"], view["last_status_code"], view["last_error"]) \
        == ("retrying", 1, 503, "HTTP 503")
    assert view["next_attempt_at"] == view["execute_at"] == "2027-01-15T09:00:00.000Z"
    # max_attempts must leave room for one more attempt: 422, nothing written.
    before = await snapshot(store.redis)  # type: ignore[arg-type]
    r = await client.patch("/tasks/t", json={"delay": 5, "max_attempts": 1})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "max_attempts"]
    assert "more than the 1 attempts already made" in r.json()["detail"][0]["msg"]
    assert await snapshot(store.redis) == before  # type: ignore[arg-type]


async def test_patch_unknown_is_404_and_finished_is_409_with_the_view(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    assert (await client.patch("/tasks/nope", json={"delay": 1})).status_code == 404
    await client.post("/tasks", json={"key": "f", "callback_url": URL})
    await client.post("/tasks", json={"key": "c", "callback_url": URL, "delay": 60})
    assert await fail_due(store, START_MS) == ["f"]
    assert (await client.delete("/tasks/c")).status_code == 204
    for key, status in (("f", "failed"), ("c", "cancelled")):
        before = await snapshot(store.redis)  # type: ignore[arg-type]
        r = await client.patch(f"/tasks/{key}", json={"delay": 5})
        assert r.status_code == 409, r.text
        body = r.json()
        assert "already finished" in body.pop("detail")
        assert body == (await client.get(f"/tasks/{key}")).json()
        assert body["status"] == status
        assert await snapshot(store.redis) == before  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [
    {}, {"max_attempts": 3}, {"delay": 5, "execute_at": "2027-01-15T08:00:00Z"},
    {"delay": -1}, {"delay": "5"}, {"execute_at": "tomorrow"}, {"execute_at": -1},
    {"delay": 5, "max_attempts": 0}, {"delay": 5, "max_attempts": 101},
    {"delay": 5, "callback_url": URL}, {"delay": 5, "body": {"a": 1}},
    {"delay": 31_536_001}, {"execute_at": START_MS / 1000 + 31_536_001}, [], None,
])
async def test_patch_invalid_is_422_and_stores_nothing(client: httpx.AsyncClient,
                                                      redis: Redis, body: Any) -> None:
    await client.post("/tasks", json={"key": "i", "callback_url": URL, "delay": 60})
    before = await snapshot(redis)
    r = await client.patch("/tasks/i", json=body)
    assert r.status_code == 422, r.text
    assert await snapshot(redis) == before
    # The control: a valid PATCH of the same task changes the state.
    assert (await client.patch("/tasks/i", json={"delay": 5})).status_code == 200
    assert await snapshot(redis) != before


async def test_patch_needs_the_token_when_tokens_are_set(make_client: Any, settings: Any
                                                         ) -> None:
    guarded = settings.model_copy(update={"api_tokens": [ApiToken("s3cret")]})
    async with make_client(guarded) as client:
        assert (await client.patch("/tasks/x", json={"delay": 1})).status_code == 401
        r = await client.patch("/tasks/x", json={"delay": 1},
                               headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 404
