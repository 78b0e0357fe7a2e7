"""``Client.attempts`` / ``AsyncClient.attempts`` and ``timewheel tasks attempts KEY``: the request
each sends and the typed answer (respx), then both clients against the real app with a history
seeded in Redis, so what the client parses is what the API sends."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx
from redis.asyncio import Redis

from tests.client.conftest import BASE, Both
from tests.client.test_cli import run, sent
from tests.conftest import START_MS
from timewheel.client import NotFoundError, UnexpectedAnswerError
from timewheel.models import AttemptOutcome, AttemptView
from timewheel.store import attempts
from timewheel.store.keys import Keyspace

URL = "http://127.0.0.1:9/hook"
RETRY = {"attempt": 1, "started_at": "2027-01-15T08:00:00.005Z", "duration_ms": 412,
         "outcome": "retry", "status_code": 503, "error": None,
         "response_headers": {"retry-after": "30"}, "response_body": "busy",
         "response_body_truncated": True, "next_attempt_at": "2027-01-15T08:00:30.417Z",
         "process": "host-a:4711"}
LOST = {"attempt": 2, "started_at": None, "duration_ms": None, "outcome": "lost",
        "status_code": None, "error": "no outcome within its lease", "response_headers": None,
        "response_body": None, "response_body_truncated": False, "next_attempt_at": None,
        "process": None}


async def test_attempts_sends_its_request_and_parses_the_answer(
        both: Both, router: respx.MockRouter) -> None:
    """GET /tasks/{key}/attempts with the token (the key as one path segment), the answer's
    list as AttemptView models, in order."""
    route = router.get("/tasks/a%20b/attempts").mock(
        return_value=httpx.Response(200, json={"attempts": [RETRY, LOST]}))
    shown = await both.call("attempts", "a b")
    assert route.call_count == 1
    assert route.calls.last.request.headers["authorization"] == "Bearer tok-123"
    assert shown == [AttemptView.model_validate(RETRY), AttemptView.model_validate(LOST)]
    assert [a.outcome for a in shown] == [AttemptOutcome.RETRY, AttemptOutcome.LOST]
    assert shown[0].response_headers == {"retry-after": "30"}


async def test_dot_keys_stay_one_segment(both: Both, router: respx.MockRouter) -> None:
    route = router.get("/tasks/%2E%2E/attempts").mock(
        return_value=httpx.Response(200, json={"attempts": []}))
    assert await both.call("attempts", "..") == []
    assert route.call_count == 1


async def test_an_answer_without_attempts_is_unexpected(both: Both,
                                                        router: respx.MockRouter) -> None:
    router.get("/tasks/k/attempts").mock(return_value=httpx.Response(200, json=[RETRY]))
    with pytest.raises(UnexpectedAnswerError):
        await both.call("attempts", "k")


async def test_real_app_history_and_not_found(real: Both, redis: Redis) -> None:
    """Against the real app: the seeded entries come back as models; an unknown key raises
    NotFoundError with the service's detail."""
    await real.call("create_task", {"key": "k", "callback_url": URL})
    assert await real.call("attempts", "k") == []
    keys = Keyspace("tw")
    await redis.rpush(keys.attempts(keys.bucket_of("k"), "k"), attempts.entry(
        attempt=1, started_ms=START_MS + 5, duration_ms=412, verdict="retry", status_code=503,
        error=None, headers={"retry-after": "30"}, body="busy", body_truncated=True,
        next_attempt_ms=START_MS + 30_417, process="host-a:4711"),
        json.dumps({"n": 2, "o": "lost", "e": "no outcome within its lease"}))
    shown = await real.call("attempts", "k")
    assert [a.model_dump(mode="json") for a in shown] == [RETRY, LOST]
    with pytest.raises(NotFoundError) as raised:
        await real.call("attempts", "nope")
    assert (raised.value.status_code, raised.value.detail) == (404, "no task with key 'nope'")


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What tests/client/test_cli.py sets: the service's URL and the token ``sent`` checks."""
    monkeypatch.setenv("TIMEWHEEL_URL", BASE)
    monkeypatch.setenv("TIMEWHEEL_TOKEN", "cli-token")


@pytest.mark.usefixtures("cli_env")
def test_cli_tasks_attempts_prints_the_answer(router: respx.MockRouter,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``timewheel tasks attempts KEY``: one GET, the API's answer printed as JSON."""
    route = router.route().mock(
        return_value=httpx.Response(200, json={"attempts": [RETRY, LOST]}))
    assert run("tasks", "attempts", "order:1") == 0
    assert sent(route) == ("GET", "/tasks/order:1/attempts", {}, None)
    printed: Any = json.loads(capsys.readouterr().out)
    assert printed == {"attempts": [RETRY, LOST]}


@pytest.mark.usefixtures("cli_env")
def test_cli_tasks_attempts_of_an_unknown_task(router: respx.MockRouter,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    router.route().mock(return_value=httpx.Response(404, json={
        "detail": "no task with key 'nope'"}))
    assert run("tasks", "attempts", "nope") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "404" in captured.err and "no task with key 'nope'" in captured.err


@pytest.mark.usefixtures("cli_env")
def test_cli_tasks_attempts_needs_a_key(router: respx.MockRouter,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    route = router.route().mock(return_value=httpx.Response(200, json={"attempts": []}))
    assert run("tasks", "attempts") == 2
    assert route.call_count == 0
    assert "KEY" in capsys.readouterr().err
