"""Topics through both clients against the real app, and the ``timewheel topics`` commands
against respx (what each command sends, what it prints, how it fails)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from tests.client.conftest import BASE, Both
from tests.client.test_client import view
from timewheel.cli import main
from timewheel.client.cli import EXIT_API, EXIT_USAGE
from timewheel.client.errors import ConflictError, NotFoundError
from timewheel.models import TopicPublish, TopicPut

URL = "http://127.0.0.1:9"
TOPIC = {"name": "orders", "endpoints": [{"name": "billing", "url": f"{URL}/b", "headers": {}}],
         "created_at": "2027-01-15T08:00:00.000Z", "updated_at": "2027-01-15T08:00:00.000Z"}


async def test_both_clients_manage_topics_and_publish(real: Both) -> None:
    topic = await real.call("set_topic", "orders", TopicPut.model_validate({"endpoints": [
        {"name": "billing", "url": f"{URL}/b", "headers": {"X-Team": "b"}},
        {"name": "email", "url": f"{URL}/e"}]}))
    assert [e.name for e in topic.endpoints] == ["billing", "email"]
    tasks = await real.call("publish", "orders", TopicPublish(key="o1", body={"id": 1}))
    assert [t.key for t in tasks] == ["o1.billing", "o1.email"]
    assert tasks[0].headers["X-Team"] == "b"
    again = await real.call("publish", "orders", {"key": "o1", "body": {"id": 1}})
    assert again == tasks
    with pytest.raises(ConflictError):
        await real.call("publish", "orders", {"key": "o1", "body": {"id": 2}})
    with pytest.raises(NotFoundError):
        await real.call("publish", "nope", {"key": "o1"})
    detail = await real.call("get_topic", "orders")
    assert [p.key for p in detail.recent_publishes] == ["o1"]
    page = await real.call("list_topics", limit=10)
    assert [t.name for t in page.topics] == ["orders"] and page.next_cursor is None
    await real.call("delete_topic", "orders")
    with pytest.raises(NotFoundError):
        await real.call("get_topic", "orders")


# -- the CLI ----------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEWHEEL_URL", BASE)
    monkeypatch.delenv("TIMEWHEEL_TOKEN", raising=False)


def run(*argv: str) -> int:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    code = exited.value.code
    return code if isinstance(code, int) else 1


def sent(route: respx.Route) -> tuple[str, str, Any]:
    assert route.call_count == 1
    request = route.calls.last.request
    return request.method, request.url.path, json.loads(request.content or b"null")


def test_topics_set_sends_endpoints_and_their_headers(
        router: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    route = router.put("/topics/orders").mock(return_value=httpx.Response(201, json=TOPIC))
    assert run("topics", "set", "orders", "--endpoint", f"billing={URL}/b",
               "--endpoint", f"email={URL}/e", "--endpoint-header", "billing", "X-Team: b") == 0
    assert sent(route) == ("PUT", "/topics/orders", {"endpoints": [
        {"name": "billing", "url": f"{URL}/b", "headers": {"X-Team": "b"}},
        {"name": "email", "url": f"{URL}/e", "headers": {}}]})
    assert json.loads(capsys.readouterr().out) == TOPIC


def test_topics_set_refuses_a_header_for_no_endpoint(router: respx.MockRouter) -> None:
    assert run("topics", "set", "orders", "--endpoint", f"billing={URL}/b",
               "--endpoint-header", "email", "X-Team: e") == EXIT_USAGE
    assert run("topics", "set", "orders", "--endpoint", "billing") == EXIT_USAGE


def test_topics_publish_sends_the_task_options(
        router: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    answer = {"tasks": [view("o1.billing")]}
    route = router.post("/topics/orders/publish").mock(return_value=httpx.Response(201,
                                                                                   json=answer))
    assert run("topics", "publish", "orders", "--key", "o1", "--delay", "5", "--body",
               '{"id": 1}', "--header", "X-Trace: t", "--max-attempts", "3") == 0
    assert sent(route) == ("POST", "/topics/orders/publish", {
        "key": "o1", "delay": 5, "body": {"id": 1}, "headers": {"X-Trace": "t"},
        "max_attempts": 3})
    assert json.loads(capsys.readouterr().out) == answer


@pytest.mark.parametrize(("argv", "method", "path", "answer"), [
    (("get", "orders"), "GET", "/topics/orders", {**TOPIC, "recent_publishes": []}),
    (("list", "--limit", "5"), "GET", "/topics", {"topics": [TOPIC], "next_cursor": None}),
    (("delete", "orders"), "DELETE", "/topics/orders", None),
])
def test_topics_get_list_delete(router: respx.MockRouter, capsys: pytest.CaptureFixture[str],
                                argv: tuple[str, ...], method: str, path: str,
                                answer: Any) -> None:
    route = router.route(method=method, path=path).mock(
        return_value=httpx.Response(204) if answer is None else httpx.Response(200, json=answer))
    assert run("topics", *argv) == 0
    assert route.call_count == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed == (answer if answer is not None else {"name": "orders", "deleted": True})


def test_topics_publish_to_an_unknown_topic_fails_with_the_detail(
        router: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    router.post("/topics/nope/publish").mock(return_value=httpx.Response(
        404, json={"detail": "no topic named 'nope'"}))
    assert run("topics", "publish", "nope") == EXIT_API
    assert "no topic named 'nope'" in capsys.readouterr().err
