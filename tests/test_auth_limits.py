"""Bearer tokens on /tasks (and optionally /metrics, /docs), and the request size limit:
refused early, never read whole, and a burst of bad requests does not hurt good ones."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.support.redis_server import RedisServer
from timewheel.api.app import MAX_REQUEST_BYTES
from timewheel.models import MAX_BODY_BYTES
from timewheel.settings import Settings

URL = "http://127.0.0.1:9/hook"
TOKENS = ("tok-alpha-3f9c1e", "tok-beta-77d2a0")
WRONG = "tok-guess-000000"
CHUNK = 64 * 1024
MakeClient = Callable[..., Any]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def base(redis_server: RedisServer, tmp_path: Path) -> dict[str, Any]:
    return {"redis_url": redis_server.url, "allow_private_networks": True, "data_dir": tmp_path}


@pytest.fixture(params=["kwarg", "env"])
def token_settings(request: pytest.FixtureRequest, base: dict[str, Any],
                   monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Two tokens, given as a keyword argument or as TIMEWHEEL_API_TOKENS="a,b"."""
    if request.param == "env":
        monkeypatch.setenv("TIMEWHEEL_API_TOKENS", f" {TOKENS[0]} ,{TOKENS[1]}")
        settings = Settings(**base)
    else:
        settings = Settings(**base, api_tokens=",".join(TOKENS))
    assert [t.get_secret_value() for t in settings.api_tokens] == list(TOKENS)
    return settings


async def task_keys(redis: Redis) -> list[bytes]:
    return sorted([key.rsplit(b":t:", 1)[1] async for key in redis.scan_iter(match="*:t:*")])


CALLS: list[tuple[str, str, dict[str, Any], int]] = [
    ("POST", "/tasks", {"json": {"key": "k", "callback_url": URL, "delay": 60}}, 201),
    ("PUT", "/tasks/p", {"json": {"callback_url": URL, "delay": 60}}, 201),
    ("GET", "/tasks/k", {}, 200),
    ("GET", "/tasks/k/attempts", {}, 200),
    ("GET", "/tasks", {"params": {"status": "failed"}}, 200),
    ("DELETE", "/tasks/k", {}, 204),
    ("POST", "/tasks/k/replay", {}, 200),
]
REFUSED = [{}, auth(WRONG), {"Authorization": f"Basic {TOKENS[0]}"}, {"Authorization": "Bearer"},
           {"Authorization": f"Bearer {TOKENS[0]}x"}, {"Authorization": TOKENS[0]}]


async def test_tasks_endpoints_need_a_token(make_client: MakeClient, token_settings: Settings,
                                            redis: Redis) -> None:
    """Every /tasks call: 401 + WWW-Authenticate without a right token (nothing done);
    either configured token works."""
    async with make_client(token_settings) as client:
        for method, path, kwargs, _ in CALLS:
            for headers in REFUSED:
                r = await client.request(method, path, headers=headers, **kwargs)
                assert r.status_code == 401, (method, path, headers)
                assert r.headers["www-authenticate"] == "Bearer"
                assert r.json() == {"detail": "missing or invalid bearer token"}
        assert await task_keys(redis) == []
        for i, (method, path, kwargs, status) in enumerate(CALLS):
            r = await client.request(method, path, headers=auth(TOKENS[i % 2]), **kwargs)
            assert r.status_code == status, (method, path, r.text)
        r = await client.get("/tasks/k", headers={"authorization": f"bearer {TOKENS[1]}"})
        assert r.json()["status"] == "scheduled"
        assert await task_keys(redis) == [b"k", b"p"]


@pytest.mark.parametrize(("method", "path"), [("POST", "/tasks"), ("PUT", "/tasks/k")])
async def test_token_checked_before_the_body(make_client: MakeClient, token_settings: Settings,
                                             method: str, path: str) -> None:
    """docs/api.md: every /tasks call without a right token is 401, whatever its body."""
    async with make_client(token_settings) as client:
        r = await client.request(method, path, content=b'{"callback_url": ',
                                 headers={"content-type": "application/json"})
        assert r.status_code == 401, r.text


async def test_ops_endpoints_open_by_default(make_client: MakeClient,
                                             token_settings: Settings) -> None:
    """With tokens set, /healthz, /livez, /metrics, /docs and /openapi.json still need none."""
    async with make_client(token_settings) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/livez")).json() == {"status": "ok"}
        for path in ("/metrics", "/docs", "/openapi.json"):
            assert (await client.get(path)).status_code == 200, path
        assert "timewheel_tasks_scheduled_total" in (await client.get("/metrics")).text


async def test_metrics_and_docs_can_be_private(make_client: MakeClient,
                                               base: dict[str, Any]) -> None:
    """metrics_public=False / docs_public=False: 401 without a token, 200 with one."""
    settings = Settings(**base, api_tokens=",".join(TOKENS), metrics_public=False,
                        docs_public=False)
    async with make_client(settings) as client:
        assert (await client.get("/healthz")).status_code == 200
        for path in ("/metrics", "/docs", "/openapi.json"):
            for headers in REFUSED:
                r = await client.get(path, headers=headers)
                assert r.status_code == 401, (path, headers)
                assert r.headers["www-authenticate"] == "Bearer"
            r = await client.get(path, headers=auth(TOKENS[1]))
            assert r.status_code == 200, path
        r = await client.get("/openapi.json", headers=auth(TOKENS[0]))
        assert "/tasks" in r.json()["paths"]


async def test_tokens_never_echoed_or_logged(make_client: MakeClient, token_settings: Settings,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Neither the configured tokens nor a presented one show in a response or a log line."""
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    async with make_client(token_settings) as client:
        for headers in [*REFUSED, auth(TOKENS[0]), auth(TOKENS[1])]:
            for method, path, kwargs, _ in CALLS:
                r = await client.request(method, path, headers=headers, **kwargs)
                seen.append(r.text + repr(r.headers.multi_items()))
    logged = caplog.text + repr([(rec.msg, rec.args) for rec in caplog.records])
    for secret in (*TOKENS, WRONG):
        assert all(secret not in text for text in seen), secret
        assert secret not in logged


async def test_every_token_is_compared_in_constant_time(
        make_client: MakeClient, token_settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """hmac.compare_digest runs once per configured token, also after a match."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    configured = [t.encode() for t in TOKENS]
    async with make_client(token_settings) as client:
        for presented in (WRONG, TOKENS[0], TOKENS[1]):
            calls.clear()
            r = await client.get("/tasks/none", headers=auth(presented))
            assert r.status_code == (401 if presented == WRONG else 404)
            assert calls == [(presented.encode(), token) for token in configured]


async def chunks(total: int, sent: list[int], data: bytes = b" ") -> AsyncIterator[bytes]:
    """A chunked body of ``total`` bytes (JSON whitespace); counts the chunks pulled."""
    for offset in range(0, total, CHUNK):
        sent.append(offset)
        yield data * min(CHUNK, total - offset)


async def test_content_length_over_limit_is_413(client: httpx.AsyncClient, redis: Redis) -> None:
    """A declared Content-Length over the limit: 413 at once; at the limit it is parsed."""
    body = b'{"key": "big", "callback_url": "http://127.0.0.1/"}'
    r = await client.post("/tasks", content=body + b" " * (MAX_REQUEST_BYTES - len(body) + 1),
                          headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["detail"][0]["type"] == "too_large"
    assert await task_keys(redis) == []
    r = await client.post("/tasks", content=body + b" " * (MAX_REQUEST_BYTES - len(body)),
                          headers={"content-type": "application/json"})
    assert r.status_code == 201
    assert await task_keys(redis) == [b"big"]


async def test_chunked_body_over_limit_is_413_unread(client: httpx.AsyncClient,
                                                     redis: Redis) -> None:
    """No Content-Length, 64 MiB streamed: 413 once the limit is passed; the rest is never
    pulled. A small chunked body is still accepted."""
    sent: list[int] = []
    total = 64 * 1024 * 1024
    r = await client.post("/tasks", content=chunks(total, sent),
                          headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "content-length" not in r.request.headers
    assert r.request.headers["transfer-encoding"] == "chunked"
    needed = MAX_REQUEST_BYTES // CHUNK + 1  # the first chunk that passes the limit
    assert needed <= len(sent) <= needed + 1 < total // CHUNK
    assert await task_keys(redis) == []

    async def small() -> AsyncIterator[bytes]:
        yield b'{"key": "chunked", '
        yield b'"callback_url": "http://127.0.0.1/"}'

    r = await client.post("/tasks", content=small(), headers={"content-type": "application/json"})
    assert r.status_code == 201
    assert await task_keys(redis) == [b"chunked"]


def bad_request(i: int) -> tuple[str, str, dict[str, Any]]:
    """The i-th of a mix of refused requests (auth, syntax, fields, sizes, unknown routes)."""
    ok = auth(TOKENS[i % 2])
    key = f"bad-{i}"
    kinds: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/tasks", {"json": {"key": key, "callback_url": URL}}),
        ("POST", "/tasks", {"json": {"key": key, "callback_url": URL}, "headers": auth(WRONG)}),
        ("POST", "/tasks", {"content": b'{"key": "%s",' % key.encode(), "headers": ok}),
        ("POST", "/tasks", {"json": {"key": key, "callback_url": "ftp://x/"}, "headers": ok}),
        ("PUT", f"/tasks/{key}", {"json": {"callback_url": URL, "max_attempts": 0},
                                  "headers": ok}),
        ("POST", "/tasks", {"content": b" " * (MAX_REQUEST_BYTES + 1), "headers": ok}),
        ("POST", "/tasks", {"content": chunks(2 * MAX_REQUEST_BYTES, []), "headers": ok}),
        ("POST", "/tasks", {"json": {"key": key, "callback_url": URL,
                                     "body": "x" * MAX_BODY_BYTES}, "headers": ok}),
        ("DELETE", "/tasks/no-such-task", {"headers": ok}),
        ("GET", "/tasks", {"params": {"status": "done"}, "headers": ok}),
    ]
    return kinds[i % len(kinds)]


async def test_burst_of_bad_requests_spares_good_ones(make_client: MakeClient,
                                                      token_settings: Settings,
                                                      redis: Redis) -> None:
    """200 bad requests interleaved with 50 good ones, all at once: every bad one 4xx, every
    good one 201 and stored, nothing else stored; the app still answers."""
    requests: list[tuple[bool, str, str, dict[str, Any]]] = []
    for i in range(200):
        requests.append((False, *bad_request(i)))
        if i % 4 == 3:
            n = i // 4
            requests.append((True, "POST", "/tasks", {
                "json": {"key": f"good-{n:02d}", "callback_url": URL, "delay": 60,
                         "body": {"n": n}}, "headers": auth(TOKENS[n % 2])}))
    assert sum(good for good, *_ in requests) == 50
    async with make_client(token_settings) as client:
        answers = await asyncio.gather(*(client.request(method, path, **kwargs)
                                         for _, method, path, kwargs in requests))
        for (good, method, path, _), r in zip(requests, answers, strict=True):
            if good:
                assert r.status_code == 201, (path, r.text)
            else:
                assert 400 <= r.status_code < 500, (method, path, r.status_code)
        statuses = sorted({r.status_code for (good, *_), r in zip(requests, answers,
                                                                   strict=True) if not good})
        assert statuses == [401, 404, 413, 422]
        assert await task_keys(redis) == [f"good-{n:02d}".encode() for n in range(50)]
        assert (await client.get("/healthz")).status_code == 200
        r = await client.get("/tasks/good-07", headers=auth(TOKENS[0]))
        assert (r.status_code, r.json()["status"]) == (200, "scheduled")
