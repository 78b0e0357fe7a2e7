"""HTTP API against a real Redis, fake clock, no ticker: every status code and field of
docs/api.md."""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS
from timewheel.clock import FakeClock
from timewheel.models import MAX_BODY_BYTES
from timewheel.store import Outcome, Store

URL = "http://127.0.0.1:9/hook"
NOW = "2027-01-15T08:00:00.000Z"  # START_MS
HORIZON_MS = 31_536_000 * 1000


class _Missing:
    def __repr__(self) -> str:  # a stable test id, the same on every xdist worker
        return "MISSING"


MISSING = _Missing()


def expected_view(key: str, **changes: Any) -> dict[str, Any]:
    view = {"key": key, "status": "scheduled", "execute_at": NOW, "callback_url": URL,
            "method": "POST", "attempts": 0, "max_attempts": 5, "next_attempt_at": NOW,
            "last_attempt_at": None, "last_status_code": None, "last_error": None,
            "created_at": NOW, "finished_at": None, "headers": {}, "body": None, "timeout": 10.0,
            "retry_backoff": 1.0, "flow_key": "127.0.0.1:9",
            "attempts_url": f"/tasks/{key}/attempts", "on_success": None, "on_failure": None}
    view.update(changes)
    if "execute_at" in changes and "next_attempt_at" not in changes:
        view["next_attempt_at"] = changes["execute_at"]
    return view


async def snapshot(redis: Redis) -> dict[bytes, bytes]:
    """Every key with its serialized value: equal snapshots mean nothing was written."""
    return {key: await redis.dump(key) for key in sorted(await redis.keys("*"))}


async def test_post_creates_with_location_and_exact_view(client: httpx.AsyncClient) -> None:
    """201, Location, the whole view; GET shows the same view."""
    r = await client.post("/tasks", json={"key": "order-1", "callback_url": URL})
    assert r.status_code == 201
    assert r.headers["location"] == "/tasks/order-1"
    assert r.json() == expected_view("order-1")
    got = await client.get("/tasks/order-1")
    assert (got.status_code, got.json()) == (200, expected_view("order-1"))


async def test_post_generates_a_key_when_absent(client: httpx.AsyncClient) -> None:
    """A missing key is generated: URL-safe, matching the key rules, shown in Location."""
    r = await client.post("/tasks", json={"callback_url": URL, "method": "patch"})
    assert r.status_code == 201
    key = r.json()["key"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", key)
    assert r.headers["location"] == f"/tasks/{key}"
    assert r.json() == expected_view(key, method="PATCH")
    assert (await client.get(f"/tasks/{key}")).json() == expected_view(key, method="PATCH")


@pytest.mark.parametrize(("execute_at", "shown"), [
    ("2027-01-15T10:00:00.1234+02:00", "2027-01-15T08:00:00.124Z"),  # a fraction rounds up
    ("2027-01-15t08:01:00z", "2027-01-15T08:01:00.000Z"),
    ("2027-01-14T23:30:00.5-08:30", "2027-01-15T08:00:00.500Z"),
    (1_800_000_060, "2027-01-15T08:01:00.000Z"),
    (1_800_000_060.0001, "2027-01-15T08:01:00.001Z"),  # never early: up to the next ms
    (1_800_000_000.25, "2027-01-15T08:00:00.250Z"),
    ("2020-01-01T00:00:00Z", "2020-01-01T00:00:00.000Z"),  # late: accepted, fires at once
])
async def test_execute_at_forms(client: httpx.AsyncClient, execute_at: Any, shown: str) -> None:
    """RFC 3339 with any offset or epoch seconds with fractions, shown as UTC milliseconds."""
    r = await client.post("/tasks", json={"key": "t", "callback_url": URL,
                                          "execute_at": execute_at})
    assert r.status_code == 201, r.text
    assert r.json() == expected_view("t", execute_at=shown)
    assert (await client.get("/tasks/t")).json() == expected_view("t", execute_at=shown)


async def test_largest_valid_values_are_accepted(client: httpx.AsyncClient) -> None:
    """Every limit is inclusive: 200-char key, 2048-char URL, 50 headers, the horizon, ..."""
    key, url = "k" * 200, "http://127.0.0.1/" + "a" * 2031
    r = await client.post("/tasks", json={
        "key": key, "callback_url": url, "headers": {f"X-H{i}": "v" for i in range(50)},
        "execute_at": (START_MS + HORIZON_MS) / 1000, "timeout": 30, "max_attempts": 100,
        "retry_backoff": 3600})
    assert r.status_code == 201, r.text
    assert r.json() == expected_view(key, callback_url=url, max_attempts=100,
                                     execute_at="2028-01-15T08:00:00.000Z",
                                     headers={f"X-H{i}": "v" for i in range(50)}, timeout=30.0,
                                     retry_backoff=3600.0, flow_key="127.0.0.1:80")
    r = await client.post("/tasks", json={"key": "d", "callback_url": URL, "delay": 1.5})
    assert r.json() == expected_view("d", execute_at="2027-01-15T08:00:01.500Z")
    r = await client.put("/tasks/h", json={"callback_url": URL, "delay": HORIZON_MS / 1000})
    assert (r.status_code, r.json()["execute_at"]) == (201, "2028-01-15T08:00:00.000Z")


async def test_repeated_post_is_idempotent(client: httpx.AsyncClient, fake_clock: FakeClock,
                                           redis: Redis) -> None:
    """Same key and content again: 200 with the stored view (not re-created, no Location)."""
    body = {"key": "same", "callback_url": URL, "delay": 60, "headers": {"X-A": "1"},
            "body": {"n": 1}}
    first = await client.post("/tasks", json=body)
    assert first.status_code == 201
    before = await snapshot(redis)
    fake_clock.advance(5000)
    again = await client.post("/tasks", json=dict(reversed(list(body.items()))))
    assert again.status_code == 200
    assert "location" not in again.headers
    assert again.json() == first.json() == expected_view(
        "same", execute_at="2027-01-15T08:01:00.000Z", body={"n": 1},
        headers={"X-A": "1", "Content-Type": "application/json"})
    assert await snapshot(redis) == before


@pytest.mark.parametrize("change", [
    {"callback_url": URL + "?x"}, {"method": "PUT"}, {"headers": {"X-A": "2"}},
    {"body": {"n": 2}}, {"body": None}, {"delay": 61}, {"timeout": 3},
    {"max_attempts": 4}, {"retry_backoff": 2},
])
async def test_same_key_other_content_conflicts(client: httpx.AsyncClient, redis: Redis,
                                                change: dict[str, Any]) -> None:
    """Same key, different content: 409, and the stored task is untouched."""
    body = {"key": "k", "callback_url": URL, "delay": 60, "headers": {"X-A": "1"},
            "body": {"n": 1}}
    assert (await client.post("/tasks", json=body)).status_code == 201
    before = await snapshot(redis)
    r = await client.post("/tasks", json={**body, **change})
    assert r.status_code == 409
    assert "k" in r.json()["detail"]
    assert await snapshot(redis) == before


async def test_put_creates_then_replaces_and_moves(client: httpx.AsyncClient, store: Store,
                                                   fake_clock: FakeClock, redis: Redis) -> None:
    """PUT: 201 created, then 200 replaced; the task moves to its new minute."""
    r = await client.put("/tasks/p", json={"callback_url": URL, "delay": 30})
    assert (r.status_code, r.headers["location"]) == (201, "/tasks/p")
    assert r.json() == expected_view("p", execute_at="2027-01-15T08:00:30.000Z")
    fake_clock.advance(1000)
    r = await client.put("/tasks/p", json={"callback_url": URL, "execute_at":
                                           "2027-01-15T08:05:00.007Z", "method": "GET"})
    assert r.status_code == 200
    moved = expected_view("p", execute_at="2027-01-15T08:05:00.007Z", method="GET",
                          created_at="2027-01-15T08:00:01.000Z")
    assert r.json() == moved
    assert (await client.get("/tasks/p")).json() == moved
    bucket, minute = store.keys.bucket_of("p"), START_MS // 60000
    assert await redis.zrange(store.keys.slice(bucket, minute + 5), 0, -1,
                              withscores=True) == [(b"p", START_MS + 300_007)]
    assert await redis.smembers(store.keys.delete_set(bucket, minute)) == {b"p"}
    r = await client.put("/tasks/p", json={"key": "p", "callback_url": URL})
    assert r.status_code == 422


async def test_delete_then_conflict_then_not_found(client: httpx.AsyncClient,
                                                   fake_clock: FakeClock) -> None:
    """DELETE: 204 once, then 409 with the finished view; unknown key 404."""
    await client.post("/tasks", json={"key": "c", "callback_url": URL, "delay": 10})
    fake_clock.advance(2500)
    r = await client.delete("/tasks/c")
    assert (r.status_code, r.content) == (204, b"")
    cancelled = expected_view("c", status="cancelled", execute_at="2027-01-15T08:00:10.000Z",
                              next_attempt_at=None, finished_at="2027-01-15T08:00:02.500Z")
    assert (await client.get("/tasks/c")).json() == cancelled
    r = await client.delete("/tasks/c")
    assert r.status_code == 409
    body = r.json()
    assert "already finished" in body.pop("detail")
    assert body == cancelled
    r = await client.delete("/tasks/nope")
    assert r.status_code == 404
    assert (await client.get("/tasks/nope")).status_code == 404


async def fail_due(store: Store, now_ms: int, kind: str = "fail") -> list[str]:
    """Claim, start and complete (``kind``) everything due by ``now_ms`` in every bucket."""
    done = []
    for bucket in range(store.keys.buckets):
        token = f"tok-{bucket}-{now_ms}"
        _, tasks = await store.claim(bucket, now_ms=now_ms, horizon_ms=now_ms, limit=100,
                                     token=token)
        if not tasks:
            continue
        claims = [(t.key, token) for t in tasks]
        started = await store.start(bucket, claims=claims)
        assert [s.attempt for s in started] == [1] * len(tasks)
        outcomes = [Outcome(t.key, token, kind, status_code=400, error="HTTP 400",  # type: ignore[arg-type]
                            started_ms=now_ms) for t in tasks]
        assert await store.complete(bucket, now_ms=now_ms, outcomes=outcomes) == [1] * len(tasks)
        done += [t.key for t in tasks]
    return sorted(done)


FAILED_AT = {"dead-a": 1000, "dead-b": 2000, "dead-c": 2000, "dead-d": 3000, "dead-e": 4000}


@pytest.mark.parametrize(("limit", "pages"), [
    (2, [["dead-e", "dead-d"], ["dead-c", "dead-b"], ["dead-a"]]),
    (3, [["dead-e", "dead-d", "dead-c"], ["dead-b", "dead-a"]]),
    (100, [["dead-e", "dead-d", "dead-c", "dead-b", "dead-a"]]),
])
async def test_dead_letters_paginate_newest_first(client: httpx.AsyncClient, store: Store,
                                                  limit: int, pages: list[list[str]]) -> None:
    """Failed tasks only, newest first (ties by key), every one exactly once across pages."""
    for key, at in FAILED_AT.items():
        await client.post("/tasks", json={"key": key, "callback_url": URL,
                                          "execute_at": (START_MS + at) / 1000})
    await client.post("/tasks", json={"key": "ok", "callback_url": URL})
    await client.post("/tasks", json={"key": "waiting", "callback_url": URL, "delay": 3600})
    assert await fail_due(store, START_MS, kind="ok") == ["ok"]
    for at in sorted(set(FAILED_AT.values())):
        assert await fail_due(store, START_MS + at) == sorted(
            k for k, v in FAILED_AT.items() if v == at)
    seen, cursor = [], None
    for page in pages:
        params: dict[str, Any] = {"status": "failed", "limit": limit}
        if cursor:
            params["cursor"] = cursor
        r = await client.get("/tasks", params=params)
        assert r.status_code == 200
        assert [t["key"] for t in r.json()["tasks"]] == page
        seen += r.json()["tasks"]
        cursor = r.json()["next_cursor"]
        assert (cursor is None) == (page is pages[-1])
    for view in seen:
        at = f"2027-01-15T08:00:0{FAILED_AT[view['key']] // 1000}.000Z"
        assert view == expected_view(
            view["key"], status="failed", execute_at=at, next_attempt_at=None, attempts=1,
            last_attempt_at=at, last_status_code=400, last_error="HTTP 400", finished_at=at)


@pytest.mark.parametrize("params", [
    {"status": "other"}, {}, {"status": "failed", "limit": 0},
    {"status": "failed", "limit": 1001}, {"status": "failed", "cursor": "nope"},
])
async def test_list_bad_query(client: httpx.AsyncClient, params: dict[str, Any]) -> None:
    """A known status, limit 1..1000 and a cursor of this listing are required
    (tests/test_api_list.py has the rest)."""
    r = await client.get("/tasks", params=params)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][0] == "query"


async def test_replay(client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    """Replay: failed or cancelled → scheduled now with attempts 0, its execute_at now too (a
    task cancelled before its time and replayed goes out now: not before its execute_at);
    others 409; unknown 404."""
    for key in ("f", "x", "live"):
        await client.post("/tasks", json={"key": key, "callback_url": URL,
                                          "delay": 3600 if key == "live" else 0})
    await client.post("/tasks", json={"key": "later", "callback_url": URL, "delay": 3600})
    await client.delete("/tasks/x")
    await client.delete("/tasks/later")
    assert await fail_due(store, START_MS + 100) == ["f"]
    fake_clock.advance(7000)
    r = await client.post("/tasks/f/replay")
    assert r.status_code == 200
    assert r.json() == expected_view(
        "f", execute_at="2027-01-15T08:00:07.000Z", last_status_code=400,
        last_attempt_at="2027-01-15T08:00:00.100Z", last_error="HTTP 400")
    assert (await client.get("/tasks", params={"status": "failed"})).json() == {
        "tasks": [], "next_cursor": None}
    r = await client.post("/tasks/x/replay")
    assert r.json() == expected_view("x", execute_at="2027-01-15T08:00:07.000Z")
    r = await client.post("/tasks/later/replay")
    assert r.json() == expected_view("later", execute_at="2027-01-15T08:00:07.000Z")
    r = await client.post("/tasks/live/replay")
    assert r.status_code == 409
    assert r.json()["status"] == "scheduled"
    assert (await client.post("/tasks/unknown/replay")).status_code == 404


HOP = ["Host", "Connection", "Content-Length", "Transfer-Encoding", "TE", "Trailer", "Upgrade",
       "Keep-Alive", "Proxy-Authorization", "proxy-connection", "HOST"]
INVALID: dict[str, list[Any]] = {
    "key": ["", "k" * 201, "a b", "a/b", "caf\u00e9", 12],
    "callback_url": [MISSING, "/hook", "ftp://127.0.0.1/x", "http://127.0.0.1/" + "a" * 2032,
                     "http://127.0.0.1/a b", "http://127.0.0.1/a\n", None],
    "method": ["HEAD", 123],
    "headers": [{f"X-H{i}": "v" for i in range(51)}, {"Bad Name": "v"}, {"X:Y": "v"},
                {"": "v"}, {"X-A": "a\rb"}, {"X-A": "a\nb"}, {"X-A": "a\x00b"}, {"X-A": 1},
                {"X-A": None}, [["X-A", "1"]], *({name: "x"} for name in HOP)],
    "execute_at": ["tomorrow", "2027-01-15T08:00:00", "2027-01-15", "2027-02-30T08:00:00Z", -1,
                   True, (START_MS + HORIZON_MS + 1) / 1000],
    "delay": [-0.001, HORIZON_MS / 1000 + 0.001, "5"],
    "timeout": [0, -1, 30.001],
    "max_attempts": [0, 101, 1.5, True, "3"],
    "retry_backoff": [0, -1],
    "surprise": [1],  # an unknown field
}
BAD_FIELDS = [({field: value}, field) for field, values in INVALID.items() for value in values]
BAD_FIELDS.append(({"execute_at": 1_800_000_000, "delay": 1}, "execute_at"))  # both


@pytest.mark.parametrize(("override", "field"), BAD_FIELDS,
                         ids=[f"{f}-{str(o)[:40]}" for o, f in BAD_FIELDS])
async def test_invalid_field_is_422_and_stores_nothing(
        client: httpx.AsyncClient, redis: Redis, override: dict[str, Any], field: str) -> None:
    """Each invalid field: 422 in FastAPI's shape naming the field; Redis unchanged."""
    body: dict[str, Any] = {"key": "bad", "callback_url": URL}
    body.update(override)
    body = {k: v for k, v in body.items() if v is not MISSING}
    before = await snapshot(redis)
    for path, method in (("/tasks", "POST"), ("/tasks/bad", "PUT")):
        sent = dict(body)
        if method == "PUT":
            sent.pop("key", None)
            if field == "key":
                continue
        r = await client.request(method, path, json=sent)
        assert r.status_code == 422, (method, r.text)
        detail = r.json()["detail"]
        assert isinstance(detail, list) and detail
        assert all({"loc", "msg", "type"} <= item.keys() for item in detail)
        assert any(field in item["loc"] or field in item["msg"] for item in detail), detail
    assert await snapshot(redis) == before
    assert (await client.get("/tasks/bad")).status_code == 404


RAW = '{"key": "bad", "callback_url": "http://127.0.0.1:9/hook", '
BAD_RAW: list[tuple[str, str, str]] = [
    ("malformed", RAW + '"delay": }', "application/json"),
    ("truncated", RAW[:-2], "application/json"),
    ("array", "[1, 2]", "application/json"),
    ("string", '"hello"', "application/json"),
    ("null", "null", "application/json"),
    ("empty", "", "application/json"),
    ("text-plain", RAW + '"delay": 1}', "text/plain"),
    ("form", "key=bad&callback_url=http%3A%2F%2F127.0.0.1%2F",
     "application/x-www-form-urlencoded"),
]


@pytest.mark.parametrize(("content", "content_type"), [r[1:] for r in BAD_RAW],
                         ids=[r[0] for r in BAD_RAW])
async def test_invalid_json_is_422_and_stores_nothing(
        client: httpx.AsyncClient, redis: Redis, content: str, content_type: str) -> None:
    """Malformed or non-object JSON, other content types: 422 on the body, no write."""
    before = await snapshot(redis)
    r = await client.post("/tasks", content=content, headers={"content-type": content_type})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail
    assert all(item["loc"][0] == "body" for item in detail), detail
    assert await snapshot(redis) == before


NON_FINITE = [("delay", "NaN"), ("delay", "Infinity"), ("timeout", "NaN"),
              ("retry_backoff", "Infinity"), ("execute_at", "NaN"), ("execute_at", "-Infinity"),
              ("delay", "1e400"), ("execute_at", "-1e400")]  # past a float: read as infinity


@pytest.mark.parametrize(("field", "value"), NON_FINITE, ids=[f"{f}-{v}" for f, v in NON_FINITE])
async def test_non_finite_number_field_is_422(client: httpx.AsyncClient, redis: Redis,
                                              field: str, value: str) -> None:
    """NaN/Infinity (accepted by Python's JSON parser) or a number past a float's range (read
    by it as infinity) in a number field: 422, no write."""
    before = await snapshot(redis)
    r = await client.post("/tasks", content=RAW + f'"{field}": {value}}}',
                          headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    # Refused by the strict JSON parser (NaN and Infinity are not JSON), before validation.
    [error] = r.json()["detail"]
    assert error["type"] == "json_invalid"
    assert value.lstrip("-") in error["ctx"]["error"], error
    assert await snapshot(redis) == before


@pytest.mark.parametrize("value", ["NaN", "Infinity", '{"x": [-Infinity]}', '{"x": [1e999]}'])
async def test_non_finite_number_in_body_is_422(client: httpx.AsyncClient, redis: Redis,
                                                value: str) -> None:
    """``body`` must be JSON: a NaN/Infinity in it would be sent as invalid JSON."""
    before = await snapshot(redis)
    r = await client.post("/tasks", content=RAW + f'"body": {value}}}',
                          headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert await snapshot(redis) == before


@pytest.mark.parametrize(("body", "headers"), [
    ("x" * MAX_BODY_BYTES, {}),  # the JSON encoding adds the two quotes
    ({"a": "y" * (MAX_BODY_BYTES - 7)}, {}),
    ("\u00e9" * (MAX_BODY_BYTES // 2 + 1), {"Content-Type": "text/plain"}),  # UTF-8 bytes count
], ids=["json-string", "json-object", "raw-utf8"])
async def test_body_over_one_mib_encoded_is_413(client: httpx.AsyncClient, redis: Redis,
                                                store: Store, body: Any,
                                                headers: dict[str, str]) -> None:
    """An encoded body over 1 MiB: 413 in the 422 shape; nothing stored. At the limit: 201."""
    before = await snapshot(redis)
    r = await client.post("/tasks", json={"key": "big", "callback_url": URL, "body": body,
                                          "headers": headers})
    assert r.status_code == 413
    assert r.json()["detail"][0]["loc"] == ["body", "body"]
    assert await snapshot(redis) == before
    r = await client.post("/tasks", json={"key": "fits", "callback_url": URL,
                                          "body": "x" * (MAX_BODY_BYTES - 2)})
    assert r.status_code == 201
    record = await store.record("fits")
    assert record is not None and len(stored := record["body"]) == MAX_BODY_BYTES
    assert json.loads(stored) == "x" * (MAX_BODY_BYTES - 2)



async def test_huge_delay_is_422_not_an_overflow(client: httpx.AsyncClient, redis: Redis) -> None:
    """Found by schemathesis: a delay of 1e305 s overflowed when turned into milliseconds."""
    before = await snapshot(redis)
    r = await client.post("/tasks", json={"callback_url": "https://example.com/h",
                                          "delay": 1.797693134862316e305})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "delay"]
    assert await snapshot(redis) == before


async def test_a_loopback_callback_refused_names_the_setting_that_allows_it(
        make_client: Any, settings: Any, redis: Redis) -> None:
    """The first callback of a new user goes to a local receiver: the 422 says how to allow
    it, and nothing is stored."""
    guarded = settings.model_copy(update={"allow_private_networks": False})
    async with make_client(guarded) as client:
        before = await snapshot(redis)
        r = await client.post("/tasks", json={"callback_url": "http://127.0.0.1:9000/hook"})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "callback_url"]
        assert r.json()["detail"][0]["msg"] == (
            "127.0.0.1 is loopback, not a public address; set "
            "TIMEWHEEL_ALLOW_PRIVATE_NETWORKS=true (or serve --allow-private-networks) to "
            "allow it, or list its network in TIMEWHEEL_ALLOWED_NETWORKS")
        assert await snapshot(redis) == before


async def test_the_allowed_networks_hint_is_followed_and_the_task_is_created(
        make_client: Any, settings: Any) -> None:
    """The refusal's hint works when followed, for the name localhost too."""
    strict = settings.model_copy(update={"allow_private_networks": False})
    body = {"key": "local", "callback_url": "http://localhost:9000/hook", "delay": 60}
    async with make_client(strict) as client:
        r = await client.post("/tasks", json=body)
        assert r.status_code == 422
        assert "TIMEWHEEL_ALLOWED_NETWORKS" in r.json()["detail"][0]["msg"]
    allowed = strict.model_copy(update={"allowed_networks": [
        ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]})
    async with make_client(allowed) as client:
        r = await client.post("/tasks", json=body)
        assert r.status_code == 201, r.text


@pytest.mark.parametrize(("fields", "headers", "body"), [
    ({}, {}, None),
    ({"body": {"a": [1, 2]}}, {"Content-Type": "application/json"}, {"a": [1, 2]}),
    ({"body": "hello"}, {"Content-Type": "application/json"}, "hello"),
    ({"body": "a,b\n1,2", "headers": {"content-type": "text/csv"}},
     {"content-type": "text/csv"}, "a,b\n1,2"),
    ({"body": None}, {"Content-Type": "application/json"}, None),
])
async def test_the_view_shows_the_request_each_attempt_sends(
        client: httpx.AsyncClient, fields: dict[str, Any], headers: dict[str, str],
        body: Any) -> None:
    """docs/api.md v3: headers (as sent), body (its JSON value, or the text of a body that is
    not JSON), timeout, retry_backoff, flow_key and attempts_url, in every answer."""
    task = {"key": "req", "callback_url": URL, "timeout": 2.5, "retry_backoff": 0.5,
            "flow_key": "billing", **fields}
    expected = expected_view("req", headers=headers, body=body, timeout=2.5,
                             retry_backoff=0.5, flow_key="billing")
    assert (await client.post("/tasks", json=task)).json() == expected
    assert (await client.get("/tasks/req")).json() == expected
    listed = (await client.get("/tasks", params={"status": "scheduled"})).json()["tasks"]
    assert listed == [expected]


async def test_the_view_shows_that_put_replaced_the_whole_task(client: httpx.AsyncClient
                                                               ) -> None:
    """PUT is replace: a PUT without body and headers leaves the task with neither, which the
    view now shows (PATCH keeps them: tests/test_api_reschedule.py)."""
    await client.post("/tasks", json={"key": "w", "callback_url": URL, "delay": 60,
                                      "headers": {"X-A": "1"}, "body": {"n": 1}})
    r = await client.put("/tasks/w", json={"callback_url": URL, "delay": 120})
    assert (r.json()["headers"], r.json()["body"]) == ({}, None)
    assert (await client.get("/tasks/w")).json() == r.json()
