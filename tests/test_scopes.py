"""Scoped tokens (docs/api.md v3): ``read`` / ``write`` / ``admin`` entries of TIMEWHEEL_API_TOKENS,
the scope each route needs (one table, walked over every route the app has), 401 and 403."""

from __future__ import annotations

import hmac
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter
from fastapi.routing import iter_route_contexts
from pydantic import ValidationError
from redis.asyncio import Redis

from tests.conftest import running_app
from tests.support.redis_server import RedisServer
from timewheel.api.app import create_app
from timewheel.api.routing import TaskRoute
from timewheel.clock import FakeClock
from timewheel.scopes import Scope
from timewheel.settings import Settings

URL = "http://127.0.0.1:9/hook"
TOKENS = {"read": "tok-reader-5e1a", "write": "tok-writer-90bc", "admin": "tok-admin-77f3"}
BARE = "tok-bare-c4d2"  # no prefix: admin
SCOPED = f"read:{TOKENS['read']},write:{TOKENS['write']},admin:{TOKENS['admin']},{BARE}"
PUBLIC = None

# The scope each route needs: docs/api.md v3 "Scoped tokens" (every GET read; tasks and schedules
# write; flows admin). A route the app has and this table lacks fails test_every_route_...
TABLE: dict[tuple[str, str], str | None] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/livez"): PUBLIC,
    ("GET", "/metrics"): "read",  # when TIMEWHEEL_METRICS_PUBLIC=false (else public)
    ("GET", "/auth"): "read",
    ("GET", "/tasks"): "read",
    ("POST", "/tasks"): "write",
    ("POST", "/tasks/batch"): "write",
    ("GET", "/tasks/{key}"): "read",
    ("PUT", "/tasks/{key}"): "write",
    ("PATCH", "/tasks/{key}"): "write",
    ("DELETE", "/tasks/{key}"): "write",
    ("POST", "/tasks/{key}/replay"): "write",
    ("GET", "/tasks/{key}/attempts"): "read",
    ("GET", "/flows"): "read",
    ("GET", "/flows/{flow_key}"): "read",
    ("PUT", "/flows/{flow_key}"): "admin",
    ("DELETE", "/flows/{flow_key}"): "admin",
    ("POST", "/flows/{flow_key}/pause"): "admin",
    ("POST", "/flows/{flow_key}/resume"): "admin",
    ("GET", "/schedules"): "read",
    ("GET", "/schedules/{schedule_id}"): "read",
    ("PUT", "/schedules/{schedule_id}"): "write",
    ("DELETE", "/schedules/{schedule_id}"): "write",
    ("POST", "/schedules/{schedule_id}/pause"): "write",
    ("POST", "/schedules/{schedule_id}/resume"): "write",
    ("GET", "/topics"): "read",
    ("GET", "/topics/{name}"): "read",
    ("PUT", "/topics/{name}"): "admin",
    ("DELETE", "/topics/{name}"): "admin",
    ("POST", "/topics/{name}/publish"): "write",
    ("GET", "/stats"): "read",
    ("GET", "/stats/due"): "read",
    ("POST", "/tasks/cancel"): "admin",
    ("POST", "/tasks/replay"): "admin",
    ("GET", "/jobs/{job_id}"): "read",
}
# Routes outside the OpenAPI schema.
HIDDEN: dict[tuple[str, str], str | None] = {
    ("GET", "/docs"): "read",  # when TIMEWHEEL_DOCS_PUBLIC=false (else public)
    ("GET", "/openapi.json"): "read",  # likewise
    ("GET", "/ui"): PUBLIC,  # the page holds no data; its calls carry the token
    ("GET", "/ui/assets/{name}"): PUBLIC,
}
ORDER = ["read", "write", "admin"]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def guarded(redis_server: RedisServer, tmp_path: Path) -> Settings:
    return Settings(redis_url=redis_server.url, allow_private_networks=True, data_dir=tmp_path,
                    api_tokens=SCOPED, metrics_public=False, docs_public=False)


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "k", path).replace("/ui/assets/k", "/ui/assets/app.js")


def operations(schema: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in schema["paths"].items() for method in item}


def app_routes(app: Any) -> set[tuple[str, str]]:
    """Every (method, path) the app routes, in the schema or not (HEAD is GET's), without
    the convertors of its parameters."""
    return {(method, re.sub(r":\w+\}", "}", route.path))
            for route in iter_route_contexts(app.routes)
            for method in route.methods or () if method != "HEAD"}


async def test_every_route_needs_exactly_its_scope(guarded: Settings, redis: Redis,
                                                   fake_clock: FakeClock) -> None:
    """Each route of the schema (and each hidden one) with each scope: 403 naming the scope
    needed below it, let through (whatever the route then says) at or above it; 401 with no
    token or a wrong one; a public route needs none. Nothing is stored by a refused call."""
    app = create_app(guarded, clock=fake_clock, run_ticker=False)
    async with running_app(app) as client:
        schema = (await client.get("/openapi.json", headers=auth(TOKENS["read"]))).json()
        assert operations(schema) == set(TABLE), "a route without a row in TABLE (or gone)"
        assert app_routes(app) == set(TABLE) | set(HIDDEN)
        refused = 0
        for (method, path), needed in {**TABLE, **HIDDEN}.items():
            url = concrete(path)
            body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
            for headers in ({}, auth("tok-wrong-0000"), {"Authorization": TOKENS["admin"]}):
                r = await client.request(method, url, headers=headers, **body)
                if needed is PUBLIC:
                    assert r.status_code == 200, (method, path, r.text)
                else:
                    assert r.status_code == 401, (method, path, headers)
                    assert r.headers["www-authenticate"] == "Bearer"
            for scope, token in [*TOKENS.items(), ("admin", BARE)]:
                r = await client.request(method, url, headers=auth(token), **body)
                if needed is PUBLIC or ORDER.index(scope) >= ORDER.index(needed):
                    assert r.status_code not in (401, 403), (scope, method, path, r.text)
                    assert r.status_code < 500, (scope, method, path, r.text)
                else:
                    refused += 1
                    assert r.status_code == 403, (scope, method, path, r.text)
                    assert r.json() == {"detail": f"this token has scope {scope}; "
                                                  f"{method} {url} needs {needed}"}
                    assert r.headers["www-authenticate"] == (
                        f'Bearer error="insufficient_scope", scope="{needed}"')
        # the control: the walk did refuse (write routes to read, admin routes to both)
        assert refused == sum(ORDER.index(n) for n in TABLE.values() if n)
        assert [key async for key in redis.scan_iter(match="*:t:*")] == []


async def test_without_tokens_every_route_is_open(settings: Settings, fake_clock: FakeClock
                                                  ) -> None:
    """No TIMEWHEEL_API_TOKENS: as in v2, nothing needs a token, and /auth says admin."""
    assert settings.api_tokens == []
    private = settings.model_copy(update={"metrics_public": False, "docs_public": False})
    app = create_app(private, clock=fake_clock, run_ticker=False)
    async with running_app(app) as client:
        for method, path in {**TABLE, **HIDDEN}:
            body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
            r = await client.request(method, concrete(path), **body)
            assert r.status_code not in (401, 403), (method, path)
        assert (await client.get("/auth")).json() == {"scope": "admin"}


async def test_refused_before_the_body_and_nothing_done(guarded: Settings, redis: Redis,
                                                        fake_clock: FakeClock) -> None:
    """A valid request with too small a scope changes nothing; a malformed body with too small
    a scope is 403 (not 422: the scope is checked before the body is read). The same requests
    with the scope needed do what they say (the control)."""
    task = {"key": "k1", "callback_url": URL, "delay": 60}
    async with running_app(create_app(guarded, clock=fake_clock, run_ticker=False)) as client:
        r = await client.post("/tasks", json=task, headers=auth(TOKENS["read"]))
        assert r.status_code == 403
        r = await client.post("/tasks", content=b'{"key": ', headers={
            **auth(TOKENS["read"]), "content-type": "application/json"})
        assert r.status_code == 403
        r = await client.put("/flows/api.example.com:443", json={"parallelism": 2},
                             headers=auth(TOKENS["write"]))
        assert r.status_code == 403
        assert [key async for key in redis.scan_iter()] == [b"tw:buckets"]
        assert (await client.post("/tasks", json=task,
                                  headers=auth(TOKENS["write"]))).status_code == 201
        r = await client.delete("/tasks/k1", headers=auth(TOKENS["read"]))
        assert r.status_code == 403
        r = await client.get("/tasks/k1", headers=auth(TOKENS["read"]))
        assert r.json()["status"] == "scheduled"
        r = await client.put("/flows/api.example.com:443", json={"parallelism": 2},
                             headers=auth(BARE))
        assert (r.status_code, r.json()["parallelism"]) == (200, 2)
        r = await client.get("/flows", headers=auth(TOKENS["read"]))
        assert [flow["key"] for flow in r.json()["flows"]] == ["api.example.com:443"]


async def test_auth_tells_the_scope(guarded: Settings, fake_clock: FakeClock) -> None:
    async with running_app(create_app(guarded, clock=fake_clock, run_ticker=False)) as client:
        for scope, token in [*TOKENS.items(), ("admin", BARE)]:
            r = await client.get("/auth", headers=auth(token))
            assert (r.status_code, r.json()) == (200, {"scope": scope})
        assert (await client.get("/auth")).status_code == 401


async def test_every_token_compared_in_constant_time(guarded: Settings, fake_clock: FakeClock,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """hmac.compare_digest runs once per configured token (the part after its scope), also
    after a match, and once per request although the route class and the dependency both
    check."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    configured = [t.encode() for t in (*TOKENS.values(), BARE)]
    async with running_app(create_app(guarded, clock=fake_clock, run_ticker=False)) as client:
        for presented, status in [("nope", 401), (TOKENS["read"], 403), (BARE, 422)]:
            calls.clear()
            r = await client.post("/tasks", json={}, headers=auth(presented))
            assert r.status_code == status
            assert calls == [(presented.encode(), token) for token in configured]


def test_a_route_without_a_scope_is_refused_when_built() -> None:
    router = APIRouter(route_class=TaskRoute)

    async def handler() -> None:
        return None

    with pytest.raises(TypeError, match=r"\['POST'\] /x declares no scope"):
        router.add_api_route("/x", handler, methods=["POST"])


@pytest.mark.parametrize(("entries", "expected"), [
    ("read:a,write:b,admin:c,d", [("read", "a"), ("write", "b"), ("admin", "c"), ("admin", "d")]),
    ("admin:abc:def, read:x:y", [("admin", "abc:def"), ("read", "x:y")]),
    ("a,admin:a", [("admin", "a"), ("admin", "a")]),  # the same token, the same scope
])
def test_entries_parse(entries: str, expected: list[tuple[str, str]]) -> None:
    tokens = Settings(api_tokens=entries).api_tokens
    assert [(t.scope.value, t.bearer.decode()) for t in tokens] == expected
    assert [t.get_secret_value() for t in tokens] == [e.strip() for e in entries.split(",")]
    assert Scope.READ.covers(Scope.READ) and not Scope.READ.covers(Scope.WRITE)


@pytest.mark.parametrize(("entries", "message"), [
    ("root:s3cr3t-one", "entry 1 has an unknown scope before its ':'"),
    ("good-token,Read:s3cr3t-one", "entry 2 has an unknown scope"),  # scopes are lower case
    ("s3cr3t:one", "a token that contains ':' is written with its scope, e.g. admin:<token>"),
    ("read:", "entry 1 has no token after its scope 'read'"),
    ("read:s3cr3t-one,write:s3cr3t-one", "entries 1 and 2 are the same token with different "
                                         "scopes (read, write)"),
])
def test_bad_entries_stop_the_start(entries: str, message: str) -> None:
    """A clear start-up error that names the entry by position, never its text (the CLI prints
    errors without their input: timewheel/cli.py)."""
    with pytest.raises(ValidationError) as caught:
        Settings(api_tokens=entries)
    (error,) = caught.value.errors(include_input=False, include_url=False)
    assert error["loc"] == ("api_tokens",)
    assert message in error["msg"]
    assert "s3cr3t" not in str(error["msg"])


def test_bad_entry_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEWHEEL_API_TOKENS", "read:a,root:b")
    with pytest.raises(ValidationError, match="entry 2 has an unknown scope"):
        Settings()
