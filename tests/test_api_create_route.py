"""``POST /tasks`` served by api/create_route.py answers byte for byte as the FastAPI route
(api/tasks.py) does, stores the same, and hands every malformed request to that route.

Two apps share one Redis under two key prefixes: the app as built, and the same app with
``CreateTaskRoute`` taken out (the FastAPI route alone). Each request goes to both."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import running_app
from tests.test_api import URL, snapshot
from timewheel.api import create_route
from timewheel.api.app import create_app
from timewheel.api.create_route import CreateTaskRoute
from timewheel.clock import FakeClock
from timewheel.settings import Settings

# Headers that differ between any two responses, whoever serves them.
VARYING = {"x-request-id", "date"}


class PassedOn:
    """Counts the requests CreateTaskRoute hands to the FastAPI route."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = create_route._pass_on

        async def counted(*args: Any) -> None:
            self.count += 1
            await original(*args)

        monkeypatch.setattr(create_route, "_pass_on", counted)


def fastapi_alone(app: Any) -> Any:
    app.router.routes[:] = [r for r in app.router.routes if not isinstance(r, CreateTaskRoute)]
    return app


def answer(r: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers in order, body; each app's own key made the same."""
    return (r.status_code, [(k, v.replace("fast-", "slow-")) for k, v in r.headers.multi_items()
                            if k not in VARYING], r.content.replace(b"fast-", b"slow-"))


@pytest.fixture
async def pair(settings: Settings, fake_clock: FakeClock
               ) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    async with AsyncExitStack() as stack:
        built = await stack.enter_async_context(running_app(create_app(
            settings.model_copy(update={"key_prefix": "fast"}), clock=fake_clock,
            run_ticker=False)))
        alone = await stack.enter_async_context(running_app(fastapi_alone(create_app(
            settings.model_copy(update={"key_prefix": "slow"}), clock=fake_clock,
            run_ticker=False))))
        yield built, alone


async def both(pair: tuple[httpx.AsyncClient, httpx.AsyncClient], name: str,
               **request: Any) -> httpx.Response:
    """Send the request to both apps (a JSON ``key`` of "" becomes each app's own key,
    ``fast-<name>`` and ``slow-<name>``); assert the same answer; return the built app's."""
    built, alone = pair
    answers = []
    for client, key in ((built, f"fast-{name}"), (alone, f"slow-{name}")):
        sent = dict(request)
        if isinstance(sent.get("json"), dict) and sent["json"].get("key") == "":
            sent["json"] = {**sent["json"], "key": key}
        answers.append(await client.post("/tasks", **sent))
    assert answer(answers[0]) == answer(answers[1]), request
    return answers[0]


VALID: dict[str, dict[str, Any]] = {
    "minimal": {"key": "", "callback_url": URL},
    "everything": {"key": "", "callback_url": URL, "method": "put", "delay": 90,
                   "headers": {"X-Trace": "é-1", "content-type": "application/json"},
                   "body": {"amount": 12.5, "note": "ünïcode ✓", "items": [1, None, True]},
                   "max_attempts": 3, "retry_backoff": 2.5, "timeout": 4,
                   "flow_key": "payments"},
    "text body at a time": {"key": "", "callback_url": URL, "body": "plain text",
                            "execute_at": "2027-01-15T08:05:00.25+01:00"},
    "results": {"key": "", "callback_url": URL, "on_success": f"{URL}/ok",
                "on_failure": f"{URL}/failed"},
}


@pytest.mark.parametrize("name", VALID)
async def test_a_well_formed_create_is_served_here_and_answered_alike(
        pair: tuple[httpx.AsyncClient, httpx.AsyncClient], redis: Redis, name: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """201 with Location, then the same request again (200, no Location), then other content
    under the key (409 with the view): each answer equal, byte for byte, to the FastAPI
    route's, and nothing passed on. The stored task reads back the same from both apps."""
    passed = PassedOn(monkeypatch)
    task = VALID[name]
    created = await both(pair, name.replace(" ", "-"), json=task)
    assert created.status_code == 201 and "location" in created.headers
    again = await both(pair, name.replace(" ", "-"), json=task)
    assert again.status_code == 200 and "location" not in again.headers
    other = await both(pair, name.replace(" ", "-"), json={**task, "callback_url": f"{URL}/2"})
    assert other.status_code == 409
    assert passed.count == 0
    key = name.replace(" ", "-")
    built, alone = pair
    assert answer(await built.get(f"/tasks/fast-{key}")) == answer(
        await alone.get(f"/tasks/slow-{key}"))


async def test_a_generated_key(pair: tuple[httpx.AsyncClient, httpx.AsyncClient],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    passed = PassedOn(monkeypatch)
    answers = [await client.post("/tasks", json={"callback_url": URL}) for client in pair]
    views = [r.json() for r in answers]
    for r, view in zip(answers, views, strict=True):
        assert (r.status_code, r.headers["location"]) == (201, f"/tasks/{view['key']}")
        del view["key"], view["attempts_url"]
    assert views[0] == views[1]
    assert passed.count == 0


MALFORMED: dict[str, dict[str, Any]] = {
    "not JSON": {"content": b'{"key": ', "headers": {"content-type": "application/json"}},
    "NaN": {"content": b'{"callback_url": "http://127.0.0.1:9/hook", "body": NaN}',
            "headers": {"content-type": "application/json"}},
    "not UTF-8": {"content": b'{"callback_url": "\xff"}',
                  "headers": {"content-type": "application/json"}},
    "empty": {"content": b"", "headers": {"content-type": "application/json"}},
    "a list": {"json": [{"callback_url": URL}]},
    "an unknown field": {"json": {"callback_url": URL, "colour": "red"}},
    "a bad key": {"json": {"callback_url": URL, "key": "no spaces"}},
    "no URL": {"json": {"key": "k"}},
    "text/plain": {"content": b'{"callback_url": "http://127.0.0.1:9/hook"}',
                   "headers": {"content-type": "text/plain"}},
    "no content type": {"content": b'{"callback_url": "http://127.0.0.1:9/hook"}'},
    "+json": {"content": b'{"callback_url": "http://127.0.0.1:9/hook", "key": "vnd"}',
              "headers": {"content-type": "application/vnd.api+json"}},
}


@pytest.mark.parametrize("name", MALFORMED)
async def test_a_malformed_request_goes_to_the_fastapi_route(
        pair: tuple[httpx.AsyncClient, httpx.AsyncClient], redis: Redis, name: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Passed on with its body, and answered as the FastAPI route answers it (422, 201 for
    an ``application/*+json`` that FastAPI reads as JSON). A refused one stores nothing."""
    passed = PassedOn(monkeypatch)
    before = await snapshot(redis)
    r = await both(pair, "x", **MALFORMED[name])
    assert passed.count == 1
    if r.status_code != 201:
        assert r.status_code == 422, r.text
        assert await snapshot(redis) == before


@pytest.mark.parametrize(("name", "task", "status"), [
    ("past the horizon", {"key": "", "callback_url": URL, "delay": 10 ** 9}, 422),
    ("a charset", {"key": "", "callback_url": URL}, 201),
])
async def test_settings_limits_and_a_charset(
        pair: tuple[httpx.AsyncClient, httpx.AsyncClient], name: str, task: dict[str, Any],
        status: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A limit of the settings, checked after validation, is the same domain error (422) from
    either route; ``application/json; charset=utf-8`` is served here."""
    passed = PassedOn(monkeypatch)
    r = await both(pair, "c", json=task,
                   headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == status, r.text
    assert passed.count == 0


async def test_tokens_are_checked_before_the_body(settings: Settings, fake_clock: FakeClock,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """401 without a token and 403 with a read token, even for a malformed body, from this
    route itself (nothing passed on); a write token creates."""
    guarded = settings.model_copy(update={"api_tokens": Settings(
        api_tokens="read:r-token,write:w-token").api_tokens})
    passed = PassedOn(monkeypatch)
    async with running_app(create_app(guarded, clock=fake_clock, run_ticker=False)) as client:
        bad, json_type = b'{"key": ', {"content-type": "application/json"}
        r = await client.post("/tasks", content=bad, headers=json_type)
        assert (r.status_code, r.headers["www-authenticate"]) == (401, "Bearer")
        r = await client.post("/tasks", content=bad,
                              headers={**json_type, "authorization": "Bearer r-token"})
        assert r.status_code == 403 and 'scope="write"' in r.headers["www-authenticate"]
        assert passed.count == 0
        r = await client.post("/tasks", json={"callback_url": URL},
                              headers={"authorization": "Bearer w-token"})
        assert r.status_code == 201
        assert passed.count == 0


async def test_a_body_nested_too_deep_to_parse_is_passed_on(
        pair: tuple[httpx.AsyncClient, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch,
        redis: Redis) -> None:
    """json.loads raises RecursionError, not a JSONDecodeError: the FastAPI route answers
    400, and so does the built app (not a 500 from this route)."""
    passed = PassedOn(monkeypatch)
    before = await snapshot(redis)
    deep = b'{"callback_url": "' + URL.encode() + b'", "body": ' + b"[" * 5000 + b"]" * 5000
    r = await both(pair, "deep", content=deep + b"}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and passed.count == 1
    assert await snapshot(redis) == before


async def leave_mid_body(app: Any) -> list[int]:
    """Send half a body to ``app``, then leave (as uvicorn reports it: every receive after
    is a disconnect); the statuses it answered."""
    statuses: list[int] = []
    messages = [{"type": "http.request", "body": b'{"callback_url": ', "more_body": True}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
               "method": "POST", "scheme": "http", "path": "/tasks", "raw_path": b"/tasks",
               "root_path": "", "query_string": b"",
               "headers": [(b"host", b"t"), (b"content-type", b"application/json"),
                           (b"transfer-encoding", b"chunked")],
               "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}, receive, send)
    return statuses


async def test_a_client_that_leaves_mid_body_is_answered_as_by_the_fastapi_route(
        pair: tuple[httpx.AsyncClient, httpx.AsyncClient]) -> None:
    """Each app answers the same (FastAPI's 400), neither raises."""
    built, alone = (client._transport.app for client in pair)  # type: ignore[attr-defined]
    assert await leave_mid_body(built) == await leave_mid_body(alone) == [400]


def test_url_for_still_finds_the_fastapi_routes(settings: Settings) -> None:
    """The route is nameless: placed first, it must not stop ``url_path_for`` looking."""
    app = create_app(settings, run_ticker=False)
    assert app.url_path_for("get_task", key="x") == "/tasks/x"
