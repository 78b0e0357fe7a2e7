"""Client and AsyncClient against respx: the exact request of each method (method, path, query,
JSON, token), each error status as its exception, pagination, timeouts, configuration."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import respx

from tests.client.conftest import BASE, TOKEN, Both
from timewheel.client import (
    APIError,
    AsyncClient,
    Client,
    ClientError,
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    UnauthorizedError,
    UnavailableError,
    UnexpectedAnswerError,
    UnreachableError,
)
from timewheel.errors import TimeWheelError
from timewheel.models import (
    BatchResult,
    FlowLimits,
    FlowList,
    FlowView,
    ScheduleCreate,
    ScheduleList,
    ScheduleTask,
    ScheduleView,
    TaskCreate,
    TaskFields,
    TaskList,
    TaskView,
)

URL = "https://example.com/hook"
AT = "2027-01-15T08:00:00.000Z"


def view(key: str = "k1", **changes: Any) -> dict[str, Any]:
    body = {"key": key, "status": "scheduled", "execute_at": AT, "callback_url": URL,
            "method": "POST", "attempts": 0, "max_attempts": 5, "next_attempt_at": AT,
            "last_attempt_at": None, "last_status_code": None, "last_error": None,
            "created_at": AT, "finished_at": None, "headers": {}, "body": None, "timeout": 10.0,
            "retry_backoff": 1.0, "flow_key": "example.com:443",
            "attempts_url": f"/tasks/{key}/attempts", "on_success": None, "on_failure": None}
    return body | changes


FLOW = {"key": "example.com:443", "parallelism": 3, "rate": None, "in_flight": 1, "waiting": 0,
        "paused": False, "max_attempts": None, "retry_backoff": None, "max_backoff": None}
SCHEDULE = {"id": "s1", "cron": "*/5 * * * *", "every": None, "timezone": "UTC",
            "task": {"callback_url": URL, "method": "POST", "headers": {}, "body": None,
                     "timeout": None, "max_attempts": 5, "retry_backoff": 1.0, "flow_key": None,
                     "on_success": None, "on_failure": None},
            "paused": False, "next_run_at": AT, "last_run_at": None, "created_at": AT}
BATCH = {"results": [{"key": "b1", "status": 201, "task": view("b1"), "detail": None},
                     {"key": None, "status": 422, "task": None,
                      "detail": [{"loc": ["body", "tasks", 1, "callback_url"], "msg": "bad"}]}]}
NO_BODY = object()

# (method name, args, kwargs) -> (HTTP method, raw path, query, JSON body), answer, result
CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], str, str, dict[str, str], Any,
                  httpx.Response, Any]] = [
    ("create_task", (TaskCreate(callback_url=URL, key="k1", delay=5, headers={"X-A": "1"}),), {},
     "POST", "/tasks", {}, {"callback_url": URL, "key": "k1", "delay": 5,
                            "headers": {"X-A": "1"}},
     httpx.Response(201, json=view()), TaskView(**view())),
    # A mapping is sent as given: the service judges it.
    ("create_task", ({"callback_url": URL, "method": "put", "extra": 1},), {},
     "POST", "/tasks", {}, {"callback_url": URL, "method": "put", "extra": 1},
     httpx.Response(200, json=view()), TaskView(**view())),
    ("put_task", ("k1", TaskFields(callback_url=URL, execute_at=AT, body={"a": [1]})), {},
     "PUT", "/tasks/k1", {}, {"callback_url": URL, "execute_at": AT, "body": {"a": [1]}},
     httpx.Response(200, json=view()), TaskView(**view())),
    ("put_task", ("k1", TaskCreate(callback_url=URL, key="k1")), {},
     "PUT", "/tasks/k1", {}, {"callback_url": URL},
     httpx.Response(201, json=view()), TaskView(**view())),
    ("reschedule", ("k1",), {"delay": 90}, "PATCH", "/tasks/k1", {}, {"delay": 90},
     httpx.Response(200, json=view()), TaskView(**view())),
    ("reschedule", ("k1",), {"execute_at": datetime(2027, 1, 15, 9, 30, tzinfo=UTC),
                             "max_attempts": 7},
     "PATCH", "/tasks/k1", {}, {"execute_at": "2027-01-15T09:30:00+00:00", "max_attempts": 7},
     httpx.Response(200, json=view()), TaskView(**view())),
    ("get_task", ("a:b.c-d_e",), {}, "GET", "/tasks/a:b.c-d_e", {}, NO_BODY,
     httpx.Response(200, json=view("a:b.c-d_e")), TaskView(**view("a:b.c-d_e"))),
    # ".." is a valid key; unencoded, URL normalisation would turn /tasks/.. into /.
    ("get_task", ("..",), {}, "GET", "/tasks/%2E%2E", {}, NO_BODY,
     httpx.Response(200, json=view("..")), TaskView(**view(".."))),
    ("cancel_task", ("k1",), {}, "DELETE", "/tasks/k1", {}, NO_BODY, httpx.Response(204), None),
    ("replay_task", ("k1",), {}, "POST", "/tasks/k1/replay", {}, NO_BODY,
     httpx.Response(200, json=view()), TaskView(**view())),
    ("list_tasks", ("failed",), {"key_prefix": "inv-", "limit": 5, "cursor": "17:x"},
     "GET", "/tasks", {"status": "failed", "key_prefix": "inv-", "limit": "5", "cursor": "17:x"},
     NO_BODY, httpx.Response(200, json={"tasks": [view()], "next_cursor": "c2"}),
     TaskList(tasks=[TaskView(**view())], next_cursor="c2")),
    ("list_tasks", ("scheduled",), {}, "GET", "/tasks", {"status": "scheduled"}, NO_BODY,
     httpx.Response(200, json={"tasks": [], "next_cursor": None}),
     TaskList(tasks=[], next_cursor=None)),
    ("create_tasks", ([TaskCreate(callback_url=URL, key="b1"), {"callback_url": "nope"}],), {},
     "POST", "/tasks/batch", {}, {"tasks": [{"callback_url": URL, "key": "b1"},
                                            {"callback_url": "nope"}]},
     httpx.Response(200, json=BATCH), BatchResult(**BATCH)),
    # PUT replaces the whole configuration: a model sends what is not given as null/false.
    ("set_flow", ("example.com:443", FlowLimits(parallelism=3)), {},
     "PUT", "/flows/example.com:443", {}, {"parallelism": 3, "rate": None, "paused": False,
                                           "max_attempts": None, "retry_backoff": None,
                                           "max_backoff": None},
     httpx.Response(200, json=FLOW), FlowView(**FLOW)),
    ("pause_flow", ("example.com:443",), {}, "POST", "/flows/example.com:443/pause", {},
     NO_BODY, httpx.Response(200, json={**FLOW, "paused": True}),
     FlowView(**{**FLOW, "paused": True})),
    ("resume_flow", ("f",), {}, "POST", "/flows/f/resume", {}, NO_BODY,
     httpx.Response(200, json=FLOW), FlowView(**FLOW)),
    ("set_flow", ("f", {"rate": 0.5}), {}, "PUT", "/flows/f", {}, {"rate": 0.5},
     httpx.Response(200, json=FLOW), FlowView(**FLOW)),
    ("get_flow", ("example.com:443",), {}, "GET", "/flows/example.com:443", {}, NO_BODY,
     httpx.Response(200, json=FLOW), FlowView(**FLOW)),
    ("delete_flow", ("f",), {}, "DELETE", "/flows/f", {}, NO_BODY, httpx.Response(204), None),
    ("list_flows", (), {}, "GET", "/flows", {}, NO_BODY,
     httpx.Response(200, json={"flows": [FLOW]}), FlowList(flows=[FlowView(**FLOW)])),
    ("set_schedule", ("s1", ScheduleCreate(cron="*/5 * * * *", timezone="Europe/Berlin",
                                           task=ScheduleTask(callback_url=URL))), {},
     "PUT", "/schedules/s1", {}, {"cron": "*/5 * * * *", "timezone": "Europe/Berlin",
                                  "task": {"callback_url": URL}},
     httpx.Response(201, json=SCHEDULE), ScheduleView(**SCHEDULE)),
    ("get_schedule", ("s1",), {}, "GET", "/schedules/s1", {}, NO_BODY,
     httpx.Response(200, json=SCHEDULE), ScheduleView(**SCHEDULE)),
    ("list_schedules", (), {"limit": 2, "cursor": "s0"}, "GET", "/schedules",
     {"limit": "2", "cursor": "s0"}, NO_BODY,
     httpx.Response(200, json={"schedules": [SCHEDULE], "next_cursor": None}),
     ScheduleList(schedules=[ScheduleView(**SCHEDULE)], next_cursor=None)),
    ("list_schedules", (), {}, "GET", "/schedules", {}, NO_BODY,
     httpx.Response(200, json={"schedules": [], "next_cursor": None}),
     ScheduleList(schedules=[], next_cursor=None)),
    ("delete_schedule", ("s1",), {}, "DELETE", "/schedules/s1", {}, NO_BODY,
     httpx.Response(204), None),
    ("pause_schedule", ("s1",), {}, "POST", "/schedules/s1/pause", {}, NO_BODY,
     httpx.Response(200, json=SCHEDULE | {"paused": True}),
     ScheduleView(**SCHEDULE | {"paused": True})),
    ("resume_schedule", ("s1",), {}, "POST", "/schedules/s1/resume", {}, NO_BODY,
     httpx.Response(200, json=SCHEDULE), ScheduleView(**SCHEDULE)),
    ("health", (), {}, "GET", "/healthz", {}, NO_BODY, httpx.Response(200, json={"status": "ok"}),
     {"status": "ok"}),
]


@pytest.mark.parametrize(("name", "args", "kwargs", "method", "path", "query", "body", "answer",
                          "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
async def test_each_method_sends_its_request_and_parses_the_answer(
        both: Both, router: respx.MockRouter, name: str, args: tuple[Any, ...],
        kwargs: dict[str, Any], method: str, path: str, query: dict[str, str], body: Any,
        answer: httpx.Response, expected: Any) -> None:
    route = router.route().mock(return_value=answer)
    assert await both.call(name, *args, **kwargs) == expected
    assert route.call_count == 1
    request = route.calls.last.request
    assert request.method == method
    assert request.url.raw_path.split(b"?")[0].decode() == path
    assert dict(request.url.params) == query
    if body is NO_BODY:
        assert request.content == b""
    else:
        assert request.headers["content-type"] == "application/json"
        assert json.loads(request.content) == body
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["user-agent"].startswith("timewheel-client/")


ERRORS = [
    (401, {"detail": "missing or invalid bearer token"}, UnauthorizedError),
    (403, {"detail": "this token has scope read; POST /tasks needs write"}, ForbiddenError),
    (404, {"detail": "no task with key 'k1'"}, NotFoundError),
    (409, {"detail": "task 'k1' exists with other content"}, ConflictError),
    (413, {"detail": [{"type": "too_large", "loc": ["body", "body"], "msg": "too large"}]},
     PayloadTooLargeError),
    (422, {"detail": [{"type": "value_error", "loc": ["body", "callback_url"],
                       "msg": "must be an absolute URL"}]}, InvalidRequestError),
    (503, {"detail": "Redis is unavailable; try again later"}, UnavailableError),
    (500, {"detail": "boom"}, APIError),
    (429, {"detail": "slow down"}, APIError),
]


@pytest.mark.parametrize(("status", "answer", "cls"), ERRORS, ids=[str(e[0]) for e in ERRORS])
async def test_error_status_raises_its_exception_with_status_and_detail(
        both: Both, router: respx.MockRouter, status: int, answer: dict[str, Any],
        cls: type[APIError]) -> None:
    router.route().mock(return_value=httpx.Response(status, json=answer))
    with pytest.raises(cls) as raised:
        await both.call("get_task", "k1")
    error = raised.value
    assert type(error) is cls
    assert isinstance(error, TimeWheelError) and isinstance(error, ClientError)
    assert (error.status_code, error.detail) == (status, answer["detail"])
    assert str(error).startswith(f"{status} ")


async def test_422_message_names_each_field(both: Both, router: respx.MockRouter) -> None:
    """FastAPI's error list reads as ``loc: msg`` in the message (the CLI prints it)."""
    detail = [{"loc": ["body", "callback_url"], "msg": "bad URL", "type": "value_error"},
              {"loc": ["body", "delay"], "msg": "must be >= 0", "type": "value_error"}]
    router.route().mock(return_value=httpx.Response(422, json={"detail": detail}))
    with pytest.raises(InvalidRequestError) as raised:
        await both.call("create_task", {"callback_url": "x", "delay": -1})
    assert str(raised.value) == ("422 Unprocessable Entity: body.callback_url: bad URL; "
                                 "body.delay: must be >= 0")


async def test_conflict_carries_the_task_view(both: Both, router: respx.MockRouter) -> None:
    """A cancel of a finished task: 409 with the view next to the detail (docs/api.md)."""
    finished = view(status="succeeded", attempts=1, finished_at=AT)
    router.route().mock(return_value=httpx.Response(
        409, json=finished | {"detail": "task 'k1' has already finished"}))
    with pytest.raises(ConflictError) as raised:
        await both.call("cancel_task", "k1")
    assert raised.value.view == TaskView(**finished)
    assert raised.value.detail == "task 'k1' has already finished"


async def test_conflict_without_a_view(both: Both, router: respx.MockRouter) -> None:
    router.route().mock(return_value=httpx.Response(409, json={"detail": "other content"}))
    with pytest.raises(ConflictError) as raised:
        await both.call("create_task", {"callback_url": URL, "key": "k1"})
    assert raised.value.view is None


@pytest.mark.parametrize(("header", "expected"), [("2", 2.0), ("0.5", 0.5), (None, None),
                                                   ("Wed, 21 Oct 2015 07:28:00 GMT", None),
                                                   ("-1", None), ("inf", None)])
async def test_unavailable_carries_retry_after(both: Both, router: respx.MockRouter,
                                               header: str | None, expected: float | None
                                               ) -> None:
    headers = {"Retry-After": header} if header is not None else {}
    router.route().mock(return_value=httpx.Response(503, json={"detail": "down"},
                                                    headers=headers))
    with pytest.raises(UnavailableError) as raised:
        await both.call("health")
    assert raised.value.retry_after == expected


async def test_non_json_error_keeps_the_text(both: Both, router: respx.MockRouter) -> None:
    """A proxy's error page: the detail is its text (cut short), the status is kept."""
    router.route().mock(return_value=httpx.Response(502, text="<html>bad gateway</html>" * 100))
    with pytest.raises(APIError) as raised:
        await both.call("get_task", "k1")
    assert raised.value.status_code == 502
    assert raised.value.detail == ("<html>bad gateway</html>" * 100)[:1000]


async def test_empty_error_body_uses_the_reason_phrase(both: Both, router: respx.MockRouter
                                                       ) -> None:
    router.route().mock(return_value=httpx.Response(404))
    with pytest.raises(NotFoundError) as raised:
        await both.call("delete_flow", "f")
    assert raised.value.detail == "Not Found"


async def test_redirects_are_not_followed(both: Both, router: respx.MockRouter) -> None:
    """A 3xx means TIMEWHEEL_URL is wrong; following it would turn a POST into a GET."""
    route = router.route().mock(return_value=httpx.Response(
        307, headers={"Location": f"{BASE}/elsewhere"}))
    with pytest.raises(APIError) as raised:
        await both.call("create_task", {"callback_url": URL})
    assert raised.value.status_code == 307
    assert route.call_count == 1


@pytest.mark.parametrize("answer", [httpx.Response(200, text="<html>welcome</html>"),
                                    httpx.Response(200, json={"something": "else"})])
async def test_a_success_that_is_not_a_timewheel_answer(both: Both, router: respx.MockRouter,
                                                         answer: httpx.Response) -> None:
    router.route().mock(return_value=answer)
    with pytest.raises(UnexpectedAnswerError) as raised:
        await both.call("get_task", "k1")
    assert raised.value.status_code == 200
    assert "GET http://timewheel.test:8080/tasks/k1: not a timewheel answer" in str(raised.value)


@pytest.mark.parametrize(("name", "path"), [("cancel_task", "/tasks/k1"),
                                            ("delete_flow", "/flows/k1"),
                                            ("delete_schedule", "/schedules/k1"),
                                            ("delete_topic", "/topics/k1")])
@pytest.mark.parametrize("answer", [httpx.Response(200),  # `timewheel listen`'s answer
                                    httpx.Response(200, text="<html>welcome</html>")])
async def test_a_delete_not_answered_204_is_not_a_timewheel_answer(
        both: Both, router: respx.MockRouter, name: str, path: str,
        answer: httpx.Response) -> None:
    """The service answers every DELETE 204. With TIMEWHEEL_URL on the wrong port (the
    README's receiver, 9000, for the service's 8080), a cancel answered 200 was taken for
    done: `timewheel tasks cancel` printed "cancelled": true and exited 0, the task untouched."""
    router.route().mock(return_value=answer)
    with pytest.raises(UnexpectedAnswerError) as raised:
        await both.call(name, "k1")
    assert raised.value.status_code == 200
    assert f"DELETE {BASE}{path}: not a timewheel answer" in str(raised.value)


@pytest.mark.parametrize("failure", [httpx.ConnectError("Connection refused"),
                                     httpx.ReadTimeout("timed out"), httpx.RemoteProtocolError("")])
async def test_no_answer_raises_unreachable(both: Both, router: respx.MockRouter,
                                            failure: httpx.TransportError) -> None:
    router.route().mock(side_effect=failure)
    with pytest.raises(UnreachableError) as raised:
        await both.call("get_task", "k1")
    error = raised.value
    assert error.status_code is None
    assert isinstance(error, TimeWheelError) and error.__cause__ is failure
    assert error.detail == (f"GET {BASE}/tasks/k1: "
                            f"{str(failure) or type(failure).__name__}")
    assert TOKEN not in str(error)


async def test_put_with_another_key_is_refused_before_sending(both: Both,
                                                              router: respx.MockRouter) -> None:
    route = router.route().mock(return_value=httpx.Response(200, json=view()))
    with pytest.raises(ValueError, match="'other' is not the key 'k1'"):
        await both.call("put_task", "k1", TaskCreate(callback_url=URL, key="other"))
    assert route.call_count == 0


async def test_reschedule_to_a_naive_datetime_is_refused_before_sending(
        both: Both, router: respx.MockRouter) -> None:
    route = router.route().mock(return_value=httpx.Response(200, json=view()))
    with pytest.raises(ValueError, match="needs a time zone"):
        await both.call("reschedule", "k1", execute_at=datetime(2027, 1, 15, 9, 30))  # noqa: DTZ001
    assert route.call_count == 0


async def test_iter_tasks_follows_next_cursor(both: Both, router: respx.MockRouter) -> None:
    """Every page is fetched once with the previous cursor; an empty page with a cursor (a
    bounded step that found nothing) does not end the listing."""
    pages = {None: (["a", "b"], "c1"), "c1": ([], "c2"), "c2": (["c"], None)}

    def answer(request: httpx.Request) -> httpx.Response:
        keys, cursor = pages[request.url.params.get("cursor")]
        return httpx.Response(200, json={"tasks": [view(k) for k in keys],
                                         "next_cursor": cursor})
    route = router.get("/tasks").mock(side_effect=answer)
    tasks = await both.collect("iter_tasks", "failed", key_prefix="p", page_size=2)
    assert [t.key for t in tasks] == ["a", "b", "c"]
    assert [dict(call.request.url.params) for call in route.calls] == [
        {"status": "failed", "key_prefix": "p", "limit": "2"},
        {"status": "failed", "key_prefix": "p", "limit": "2", "cursor": "c1"},
        {"status": "failed", "key_prefix": "p", "limit": "2", "cursor": "c2"}]


async def test_iter_schedules_follows_next_cursor(both: Both, router: respx.MockRouter) -> None:
    pages = {None: (["s1"], "n1"), "n1": (["s2"], None)}

    def answer(request: httpx.Request) -> httpx.Response:
        ids, cursor = pages[request.url.params.get("cursor")]
        return httpx.Response(200, json={"schedules": [SCHEDULE | {"id": i} for i in ids],
                                         "next_cursor": cursor})
    route = router.get("/schedules").mock(side_effect=answer)
    assert [s.id for s in await both.collect("iter_schedules")] == ["s1", "s2"]
    assert [dict(call.request.url.params) for call in route.calls] == [{}, {"cursor": "n1"}]


async def test_iteration_stops_at_an_error(both: Both, router: respx.MockRouter) -> None:
    router.get("/tasks").mock(side_effect=[
        httpx.Response(200, json={"tasks": [view("a")], "next_cursor": "c1"}),
        httpx.Response(422, json={"detail": "cursor expired"})])
    with pytest.raises(InvalidRequestError, match="cursor expired"):
        await both.collect("iter_tasks", "failed")


def test_timeout_reaches_every_request(router: respx.MockRouter) -> None:
    route = router.route().mock(return_value=httpx.Response(200, json={"status": "ok"}))
    with Client(BASE, timeout=2.5) as client:
        client.health()
    with Client(BASE, timeout=httpx.Timeout(1.0, connect=0.25)) as client:
        client.health()
    assert [call.request.extensions["timeout"] for call in route.calls] == [
        {"connect": 2.5, "read": 2.5, "write": 2.5, "pool": 2.5},
        {"connect": 0.25, "read": 1.0, "write": 1.0, "pool": 1.0}]


async def test_async_timeout_reaches_every_request(router: respx.MockRouter) -> None:
    route = router.route().mock(return_value=httpx.Response(200, json={"status": "ok"}))
    async with AsyncClient(BASE, timeout=4) as client:
        await client.health()
    assert route.calls.last.request.extensions["timeout"] == {
        "connect": 4, "read": 4, "write": 4, "pool": 4}


def test_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """TIMEWHEEL_URL and TIMEWHEEL_TOKEN; arguments win; an empty token sends none."""
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "ok"})
    transport = httpx.MockTransport(record)
    monkeypatch.delenv("TIMEWHEEL_URL", raising=False)
    monkeypatch.delenv("TIMEWHEEL_TOKEN", raising=False)
    with Client(transport=transport) as client:
        client.health()
    monkeypatch.setenv("TIMEWHEEL_URL", "http://10.0.0.7:9000/prefix")
    monkeypatch.setenv("TIMEWHEEL_TOKEN", "env-token")
    with Client(transport=transport) as client:
        client.health()
    with Client("http://127.0.0.1:1234", token="arg-token", transport=transport) as client:
        client.health()
    with Client(token="", transport=transport) as client:
        client.health()
    assert [(str(r.url), r.headers.get("authorization")) for r in seen] == [
        ("http://127.0.0.1:8080/healthz", None),
        ("http://10.0.0.7:9000/prefix/healthz", "Bearer env-token"),
        ("http://127.0.0.1:1234/healthz", "Bearer arg-token"),
        ("http://10.0.0.7:9000/prefix/healthz", None)]


async def test_async_client_takes_a_transport_and_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEWHEEL_URL", "http://10.0.0.7:9000")
    monkeypatch.setenv("TIMEWHEEL_TOKEN", "env-token")
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=view())
    async with AsyncClient(transport=httpx.MockTransport(record)) as client:
        assert await client.get_task("k1") == TaskView(**view())
    assert [(str(r.url), r.headers["authorization"]) for r in seen] == [
        ("http://10.0.0.7:9000/tasks/k1", "Bearer env-token")]


async def test_closing_closes_the_connection_pool() -> None:
    with Client(BASE) as client:
        pass
    async with AsyncClient(BASE) as aclient:
        pass
    for http in (client._http, aclient._http):
        assert http.is_closed


def test_the_client_imports_neither_engine_store_nor_api() -> None:
    """The client talks HTTP only: importing it (and its CLI) loads no server layer."""
    probe = ("import sys, timewheel.client, timewheel.client.cli; "
             "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
             "(['timewheel', 'engine'], ['timewheel', 'store'], ['timewheel', 'api'], "
             "['timewheel', 'service'])))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_token_whitespace_is_dropped(router: respx.MockRouter) -> None:
    """A token read from a file ends with a newline; the header must not."""
    route = router.route().mock(return_value=httpx.Response(200, json={"status": "ok"}))
    with Client(BASE, token="  tok-1\n") as client:
        client.health()
    assert route.calls.last.request.headers["authorization"] == "Bearer tok-1"


@pytest.mark.parametrize("token", ["sec ret", "séc", "a\nb", "x\x00"])
@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_a_malformed_token_is_refused_without_echoing_it(
        monkeypatch: pytest.MonkeyPatch, token: str, cls: type[Client] | type[AsyncClient]
        ) -> None:
    """httpx would refuse it later with the whole header in its message; refuse it first,
    naming TIMEWHEEL_TOKEN only when the token came from there."""
    makers = [(lambda: cls(BASE, token=token), False)]
    if "\x00" not in token:  # an environment variable cannot hold NUL
        monkeypatch.setenv("TIMEWHEEL_TOKEN", token)
        makers.append((lambda: cls(BASE), True))
    for make, from_env in makers:
        with pytest.raises(ValueError) as raised:
            make()
        assert token.strip() not in str(raised.value)
        assert "printable ASCII" in str(raised.value)
        assert ("TIMEWHEEL_TOKEN" in str(raised.value)) is from_env


def test_create_task_sends_and_reads_result_callbacks(router: respx.MockRouter) -> None:
    """on_success / on_failure go out as given and come back in the typed view."""
    answer = view("r1", on_success="https://example.com/ok", on_failure=None)
    route = router.post("/tasks").mock(return_value=httpx.Response(201, json=answer))
    with Client(BASE) as client:
        task = client.create_task(TaskCreate(key="r1", callback_url=URL,
                                             on_success="https://example.com/ok"))
    assert json.loads(route.calls.last.request.content)["on_success"] == "https://example.com/ok"
    assert (task.on_success, task.on_failure) == ("https://example.com/ok", None)


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://127.0.0.1:8080", "http://",
                                 "http://127.0.0.1:8080:5", "http://[::1"])
@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_a_malformed_base_url_is_refused_at_once(
        monkeypatch: pytest.MonkeyPatch, url: str, cls: type[Client] | type[AsyncClient]
        ) -> None:
    """A base URL that cannot name an http(s) service is a ValueError when the client is made
    (as a malformed token is), naming TIMEWHEEL_URL when it came from there: not httpx's
    InvalidURL (the CLI printed its traceback), nor an UnreachableError at the first call
    ("cannot reach the service") for what is a setting to correct."""
    with pytest.raises(ValueError, match="absolute http:// or https:// URL") as raised:
        cls(url)
    assert "TIMEWHEEL_URL" not in str(raised.value)
    monkeypatch.setenv("TIMEWHEEL_URL", url)
    with pytest.raises(ValueError, match="TIMEWHEEL_URL"):
        cls()


@pytest.mark.parametrize(("name", "args"), [
    ("get_task", ("",)), ("cancel_task", ("",)), ("replay_task", ("",)), ("attempts", ("",)),
    ("get_schedule", ("",)), ("delete_schedule", ("",)), ("get_topic", ("",)),
    ("delete_topic", ("",)), ("get_flow", ("",)), ("get_job", ("",))])
async def test_an_empty_key_is_refused_before_any_request(
        both: Both, router: respx.MockRouter, name: str, args: tuple[str, ...]) -> None:
    """``/tasks/`` is no task: the service redirected it to the listing, and the caller saw
    ``307 Temporary Redirect`` for a key it had left empty."""
    route = router.route().mock(return_value=httpx.Response(307))
    with pytest.raises(ValueError, match="must not be empty"):
        await both.call(name, *args)
    assert route.call_count == 0
