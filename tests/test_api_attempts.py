"""GET /tasks/{key}/attempts against a real Redis, fake clock, no ticker: the history as stored
(lua/lib/attempts.lua; entries written by Python's ``attempts.entry`` and by the scripts'
cjson) read back field by field, oldest first; 404 and 422 like GET /tasks/{key}; in OpenAPI.
Tokens and Redis down: tests/test_auth_limits.py and tests/test_api_redis_down.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS
from timewheel.store import attempts
from timewheel.store.keys import Keyspace

URL = "http://127.0.0.1:9/hook"
KEYS = Keyspace("tw")
NOW = "2027-01-15T08:00:00.000Z"  # START_MS


def attempts_key(key: str) -> str:
    return KEYS.attempts(KEYS.bucket_of(key), key)


async def new_task(client: httpx.AsyncClient, key: str) -> None:
    r = await client.post("/tasks", json={"key": key, "callback_url": URL})
    assert r.status_code == 201, r.text


async def seed(redis: Redis, key: str, *entries: str) -> None:
    await redis.rpush(attempts_key(key), *entries)


def retry_503() -> str:
    return attempts.entry(
        attempt=1, started_ms=START_MS + 5, duration_ms=412, verdict="retry", status_code=503,
        error=None, headers={"retry-after": "30", "content-type": "text/plain"},
        body="busy, try later", body_truncated=True, next_attempt_ms=START_MS + 30_417,
        process="host-a:4711")


async def test_a_full_entry_field_by_field(client: httpx.AsyncClient, redis: Redis) -> None:
    """Every field of the contract's attempt object, from an entry as the engine writes it."""
    await new_task(client, "t")
    await seed(redis, "t", retry_503())
    r = await client.get("/tasks/t/attempts")
    assert r.status_code == 200
    assert r.json() == {"attempts": [{
        "attempt": 1, "started_at": "2027-01-15T08:00:00.005Z", "duration_ms": 412,
        "outcome": "retry", "status_code": 503, "error": None,
        "response_headers": {"retry-after": "30", "content-type": "text/plain"},
        "response_body": "busy, try later", "response_body_truncated": True,
        "next_attempt_at": "2027-01-15T08:00:30.417Z", "process": "host-a:4711"}]}


async def test_oldest_first_with_every_outcome(client: httpx.AsyncClient,
                                               redis: Redis) -> None:
    """Entries come back in list order (oldest first), whichever way they were written: by
    Python (absent fields left out), by cjson in lua/claim.lua and lua/cancel.lua (an unanswered
    attempt: number, outcome, error only), and an empty header table, which cjson writes as {}."""
    await new_task(client, "t")
    timeout = attempts.entry(
        attempt=2, started_ms=START_MS + 31_000, duration_ms=10_000, verdict="retry",
        status_code=None, error="timed out after 10 s", headers=None, body=None,
        body_truncated=False, next_attempt_ms=START_MS + 101_000, process="host-b:99")
    lost = json.dumps({"e": "no outcome within its lease: its process died or stalled",
                       "o": "lost", "n": 3})
    cjson_empty_headers = ('{"n":4,"s":1800000200000,"d":3,"o":"failed","c":410,"h":{},'
                           '"b":"","p":"host-a:4711"}')
    delivered = attempts.entry(
        attempt=5, started_ms=START_MS + 300_000, duration_ms=7, verdict="ok", status_code=200,
        error=None, headers={"content-length": "2"}, body="ok", body_truncated=False,
        next_attempt_ms=None, process="host-a:4711")
    cancelled = json.dumps({"n": 6, "o": "cancelled",
                            "e": "stopped by a DELETE before it was sent"})
    await seed(redis, "t", retry_503(), timeout, lost, cjson_empty_headers, delivered, cancelled)

    r = await client.get("/tasks/t/attempts")
    assert r.status_code == 200
    shown = r.json()["attempts"]
    assert [a["attempt"] for a in shown] == [1, 2, 3, 4, 5, 6]
    assert [a["outcome"] for a in shown] == ["retry", "retry", "lost", "failed", "delivered",
                                             "cancelled"]
    unanswered: dict[str, Any] = {
        "started_at": None, "duration_ms": None, "status_code": None, "response_headers": None,
        "response_body": None, "response_body_truncated": False, "next_attempt_at": None,
        "process": None}
    assert shown[1] == {
        **unanswered, "attempt": 2, "outcome": "retry", "error": "timed out after 10 s",
        "started_at": "2027-01-15T08:00:31.000Z", "duration_ms": 10_000,
        "next_attempt_at": "2027-01-15T08:01:41.000Z", "process": "host-b:99"}
    assert shown[2] == {**unanswered, "attempt": 3, "outcome": "lost",
                        "error": "no outcome within its lease: its process died or stalled"}
    assert shown[3] == {
        **unanswered, "attempt": 4, "outcome": "failed", "status_code": 410, "error": None,
        "started_at": "2027-01-15T08:03:20.000Z", "duration_ms": 3, "response_body": "",
        "process": "host-a:4711"}
    assert shown[4] == {
        **unanswered, "attempt": 5, "outcome": "delivered", "status_code": 200, "error": None,
        "started_at": "2027-01-15T08:05:00.000Z", "duration_ms": 7,
        "response_headers": {"content-length": "2"}, "response_body": "ok",
        "process": "host-a:4711"}
    assert shown[5] == {**unanswered, "attempt": 6, "outcome": "cancelled",
                        "error": "stopped by a DELETE before it was sent"}


async def test_an_outcome_without_a_request_has_no_process(client: httpx.AsyncClient,
                                                           redis: Redis) -> None:
    """A record set aside (undecodable, never sent) is recorded with process "": shown as
    null, not as an empty host:pid."""
    await new_task(client, "t")
    await seed(redis, "t", '{"n":1,"s":1800000000000,"d":0,"o":"failed","e":"bad record",'
                           '"p":""}')
    shown = (await client.get("/tasks/t/attempts")).json()["attempts"][0]
    assert (shown["outcome"], shown["error"], shown["process"]) == ("failed", "bad record", None)


async def test_text_is_shown_as_stored(client: httpx.AsyncClient, redis: Redis) -> None:
    """A body excerpt with non-ASCII text, quotes and markup comes back character for
    character (ensure_ascii=False on the way in, JSON on the way out)."""
    await new_task(client, "t")
    body = 'Überlastet "bitte" später <b>wieder</b> — 503 ✓\n'
    await seed(redis, "t", attempts.entry(
        attempt=1, started_ms=START_MS, duration_ms=1, verdict="fail", status_code=400,
        error=None, headers={"x-request-id": "req-ü-1"}, body=body, body_truncated=False,
        next_attempt_ms=None, process="h:1"))
    shown = (await client.get("/tasks/t/attempts")).json()["attempts"][0]
    assert (shown["response_body"], shown["response_headers"]) == (body,
                                                                   {"x-request-id": "req-ü-1"})


async def test_a_task_never_tried_has_an_empty_history(client: httpx.AsyncClient,
                                                       redis: Redis) -> None:
    """A pending task: 200 with no attempts, and no history key in Redis (the control: the
    same task with one entry shows it)."""
    await new_task(client, "t")
    r = await client.get("/tasks/t/attempts")
    assert (r.status_code, r.json()) == (200, {"attempts": []})
    assert await redis.exists(attempts_key("t")) == 0
    await seed(redis, "t", retry_503())
    assert len((await client.get("/tasks/t/attempts")).json()["attempts"]) == 1


async def test_unknown_task_is_404_like_get(client: httpx.AsyncClient, redis: Redis) -> None:
    """No such task: the same 404 as GET /tasks/{key}, even when a history list was left
    behind (the record is what says a task exists)."""
    r = await client.get("/tasks/nope/attempts")
    assert r.status_code == 404
    assert r.json() == (await client.get("/tasks/nope")).json() == {
        "detail": "no task with key 'nope'"}
    await seed(redis, "orphan", retry_503())
    r = await client.get("/tasks/orphan/attempts")
    assert (r.status_code, r.json()) == (404, {"detail": "no task with key 'orphan'"})


@pytest.mark.parametrize("key", ["a b", "x" * 201, "a*b"])
async def test_a_malformed_key_is_422_like_get(client: httpx.AsyncClient, key: str) -> None:
    r = await client.get(f"/tasks/{key}/attempts")
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["path", "key"]
    assert (await client.get(f"/tasks/{key}")).status_code == 422


async def test_keys_with_colons_and_dots(client: httpx.AsyncClient, redis: Redis) -> None:
    """Keys may hold ':' and '.': the history is read under the same key."""
    for key in ("order:17.v2", "..x", "a.attempts"):
        await new_task(client, key)
        await seed(redis, key, retry_503())
        r = await client.get(f"/tasks/{key}/attempts")
        assert (r.status_code, len(r.json()["attempts"])) == (200, 1), key


async def test_other_methods_are_405(client: httpx.AsyncClient) -> None:
    r = await client.post("/tasks/t/attempts")
    assert r.status_code == 405
    assert r.headers["allow"] == "GET"


async def test_in_openapi(client: httpx.AsyncClient) -> None:
    """The route, its 404, and the attempt object with every field of the contract."""
    spec = (await client.get("/openapi.json")).json()
    route = spec["paths"]["/tasks/{key}/attempts"]["get"]
    assert set(route["responses"]) >= {"200", "404", "422", "503"}
    ok = route["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/AttemptList"}
    view = spec["components"]["schemas"]["AttemptView"]
    assert set(view["properties"]) == {
        "attempt", "started_at", "duration_ms", "outcome", "status_code", "error",
        "response_headers", "response_body", "response_body_truncated", "next_attempt_at",
        "process"}
    assert spec["components"]["schemas"]["AttemptOutcome"]["enum"] == [
        "delivered", "retry", "failed", "lost", "cancelled"]
