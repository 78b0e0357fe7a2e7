"""The client commands of ``timewheel`` against respx: argument parsing, the request each
command sends, JSON on stdout, errors on stderr with their exit status."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import httpx
import pytest
import respx

from tests.client.conftest import BASE
from tests.client.test_client import FLOW, SCHEDULE, view
from timewheel.cli import main
from timewheel.client.cli import EXIT_API, EXIT_UNREACHABLE, EXIT_USAGE

URL = "https://example.com/hook"


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEWHEEL_URL", BASE)
    monkeypatch.setenv("TIMEWHEEL_TOKEN", "cli-token")


def run(*argv: str) -> int:
    """``timewheel argv...`` in this process; its exit status."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    code = exited.value.code
    return code if isinstance(code, int) else 1


def sent(route: respx.Route) -> tuple[str, str, dict[str, str], Any]:
    """Method, path, query and JSON body of the one request the route got."""
    assert route.call_count == 1
    request = route.calls.last.request
    body = json.loads(request.content) if request.content else None
    assert request.headers["authorization"] == "Bearer cli-token"
    return request.method, request.url.path, dict(request.url.params), body


def test_tasks_add_sends_every_option_and_prints_the_view(
        router: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    route = router.post("/tasks").mock(return_value=httpx.Response(201, json=view("inv-1")))
    assert run("tasks", "add", URL, "--key", "inv-1", "--delay", "90", "--method", "put",
               "--body", '{"invoice": 42, "lines": [1, 2]}', "--header", "X-Tenant: acme",
               "--header", "X-Trace:  a: b ", "--flow-key", "billing", "--timeout", "2.5",
               "--max-attempts", "3", "--retry-backoff", "0.5",
               "--on-success", "https://example.com/ok",
               "--on-failure", "https://example.com/no") == 0
    assert sent(route) == ("POST", "/tasks", {}, {
        "callback_url": URL, "key": "inv-1", "delay": 90, "method": "PUT",
        "body": {"invoice": 42, "lines": [1, 2]},
        "headers": {"X-Tenant": "acme", "X-Trace": "a: b"}, "flow_key": "billing",
        "timeout": 2.5, "max_attempts": 3, "retry_backoff": 0.5,
        "on_success": "https://example.com/ok", "on_failure": "https://example.com/no"})
    out, err = capsys.readouterr()
    assert json.loads(out) == view("inv-1")
    assert err == ""


def test_tasks_add_minimal_sends_only_the_url(router: respx.MockRouter,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Options not given are not sent: the service's defaults apply."""
    route = router.post("/tasks").mock(return_value=httpx.Response(201, json=view()))
    assert run("tasks", "add", URL) == 0
    assert sent(route)[3] == {"callback_url": URL}


@pytest.mark.parametrize(("at", "expected"), [
    ("2027-01-15T09:00:00+01:00", "2027-01-15T09:00:00+01:00"), ("1800000000", 1800000000),
    ("1800000000.25", 1800000000.25)])
def test_tasks_add_at(router: respx.MockRouter, at: str, expected: str | float) -> None:
    route = router.post("/tasks").mock(return_value=httpx.Response(201, json=view()))
    assert run("tasks", "add", URL, "--at", at) == 0
    assert sent(route)[3] == {"callback_url": URL, "execute_at": expected}


@pytest.mark.parametrize(("argv", "message"), [
    (["--delay", "5", "--at", "1800000000"], "argument --at: not allowed with argument --delay"),
    (["--header", "X-Tenant acme"], "expected 'Name: value', got 'X-Tenant acme'"),
    (["--header", ": acme"], "expected 'Name: value'"),
    (["--header", "Bad Name: x"], "expected 'Name: value'"),
    (["--header", "X-A: 1", "--header", "x-a: 2"], "header 'x-a' given twice"),
    (["--body", "{not json"], "argument --body: not valid JSON"),
    (["--body", "text"], "quote a string as"),
    (["--at", "tomorrow"], "argument --at: must be an RFC 3339 date-time"),
    (["--at", "2027-01-15T09:00:00"], "must be an RFC 3339 date-time with offset, e.g. "
                                      "2026-11-22T10:00:00Z, or Unix seconds as a number"),
    (["--delay", "soon"], "argument --delay: not a number: 'soon'"),
    (["--method", "TRACE"], "argument --method: invalid choice: 'TRACE'"),
    (["--max-attempts", "2.5"], "argument --max-attempts: invalid int value"),
])
def test_tasks_add_usage_errors_send_nothing(router: respx.MockRouter,
                                             capsys: pytest.CaptureFixture[str],
                                             argv: list[str], message: str) -> None:
    route = router.route().mock(return_value=httpx.Response(201, json=view()))
    assert run("tasks", "add", URL, *argv) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err and "usage: timewheel tasks add" in err
    assert route.call_count == 0


def test_tasks_add_without_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("tasks", "add") == EXIT_USAGE
    assert "the following arguments are required: URL" in capsys.readouterr().err


def test_service_422_is_an_api_error_with_each_field(router: respx.MockRouter,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    router.post("/tasks").mock(return_value=httpx.Response(422, json={"detail": [
        {"type": "value_error", "loc": ["body", "callback_url"], "msg": "must be absolute"}]}))
    assert run("tasks", "add", "nope") == EXIT_API
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("timewheel: 422 Unprocessable Entity: body.callback_url: must be absolute\n")


@pytest.mark.parametrize(("argv", "method", "path", "answer", "printed"), [
    (["tasks", "get", "k1"], "GET", "/tasks/k1", httpx.Response(200, json=view()), view()),
    (["tasks", "cancel", "k1"], "DELETE", "/tasks/k1", httpx.Response(204),
     {"key": "k1", "cancelled": True}),
    (["tasks", "replay", "k1"], "POST", "/tasks/k1/replay", httpx.Response(200, json=view()),
     view()),
    (["flows", "get", "api.example.com:443"], "GET", "/flows/api.example.com:443",
     httpx.Response(200, json=FLOW), FLOW),
    (["flows", "delete", "f1"], "DELETE", "/flows/f1", httpx.Response(204),
     {"key": "f1", "deleted": True}),
    (["flows", "list"], "GET", "/flows", httpx.Response(200, json={"flows": [FLOW]}),
     {"flows": [FLOW]}),
    (["flows", "pause", "f1"], "POST", "/flows/f1/pause", httpx.Response(200, json=FLOW),
     FLOW),
    (["flows", "resume", "f1"], "POST", "/flows/f1/resume", httpx.Response(200, json=FLOW),
     FLOW),
    (["schedules", "get", "s1"], "GET", "/schedules/s1", httpx.Response(200, json=SCHEDULE),
     SCHEDULE),
    (["schedules", "delete", "s1"], "DELETE", "/schedules/s1", httpx.Response(204),
     {"id": "s1", "deleted": True}),
    (["schedules", "pause", "s1"], "POST", "/schedules/s1/pause",
     httpx.Response(200, json=SCHEDULE), SCHEDULE),
    (["schedules", "resume", "s1"], "POST", "/schedules/s1/resume",
     httpx.Response(200, json=SCHEDULE), SCHEDULE),
])
def test_one_key_commands(router: respx.MockRouter, capsys: pytest.CaptureFixture[str],
                          argv: list[str], method: str, path: str, answer: httpx.Response,
                          printed: dict[str, Any]) -> None:
    route = router.route().mock(return_value=answer)
    assert run(*argv) == 0
    assert sent(route) == (method, path, {}, None)
    assert json.loads(capsys.readouterr().out) == printed


@pytest.mark.parametrize(("argv", "body"), [
    (["--delay", "600"], {"delay": 600}),
    (["--at", "2027-01-15T09:30:00Z", "--max-attempts", "8"],
     {"execute_at": "2027-01-15T09:30:00Z", "max_attempts": 8}),
])
def test_tasks_reschedule(router: respx.MockRouter, capsys: pytest.CaptureFixture[str],
                          argv: list[str], body: dict[str, Any]) -> None:
    route = router.patch("/tasks/k1").mock(return_value=httpx.Response(200, json=view("k1")))
    assert run("tasks", "reschedule", "k1", *argv) == 0
    assert sent(route) == ("PATCH", "/tasks/k1", {}, body)
    assert json.loads(capsys.readouterr().out) == view("k1")


@pytest.mark.parametrize("argv", [[], ["--delay", "5", "--at", "1800000000"], ["--at", "soon"]])
def test_tasks_reschedule_needs_exactly_one_time(router: respx.MockRouter,
                                                 capsys: pytest.CaptureFixture[str],
                                                 argv: list[str]) -> None:
    route = router.route().mock(return_value=httpx.Response(200, json=view("k1")))
    assert run("tasks", "reschedule", "k1", *argv) == EXIT_USAGE
    assert route.call_count == 0


def test_tasks_list(router: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    page = {"tasks": [view("inv-2"), view("inv-1")], "next_cursor": "c9"}
    route = router.get("/tasks").mock(return_value=httpx.Response(200, json=page))
    assert run("tasks", "list", "--status", "failed", "--prefix", "inv-", "--limit", "2",
               "--cursor", "c8") == 0
    assert sent(route)[:3] == ("GET", "/tasks", {"status": "failed", "key_prefix": "inv-",
                                                 "limit": "2", "cursor": "c8"})
    assert json.loads(capsys.readouterr().out) == page


@pytest.mark.parametrize(("argv", "message"), [
    ([], "the following arguments are required: --status"),
    (["--status", "done"], "argument --status: invalid choice: 'done'"),
])
def test_tasks_list_usage_errors(router: respx.MockRouter, capsys: pytest.CaptureFixture[str],
                                 argv: list[str], message: str) -> None:
    route = router.route().mock(return_value=httpx.Response(200))
    assert run("tasks", "list", *argv) == EXIT_USAGE
    assert message in capsys.readouterr().err
    assert route.call_count == 0


def test_schedules_set_with_cron(router: respx.MockRouter,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    route = router.put("/schedules/nightly").mock(return_value=httpx.Response(
        201, json=SCHEDULE))
    assert run("schedules", "set", "nightly", "--cron", "0 3 * * *", URL, "--timezone",
               "Europe/Berlin", "--method", "get", "--header", "X-Job: nightly", "--paused",
               "--max-attempts", "2") == 0
    assert sent(route) == ("PUT", "/schedules/nightly", {}, {
        "cron": "0 3 * * *", "timezone": "Europe/Berlin", "paused": True,
        "task": {"callback_url": URL, "method": "GET", "headers": {"X-Job": "nightly"},
                 "max_attempts": 2}})
    assert json.loads(capsys.readouterr().out) == SCHEDULE


def test_schedules_set_with_every(router: respx.MockRouter) -> None:
    route = router.put("/schedules/tick").mock(return_value=httpx.Response(200, json=SCHEDULE))
    assert run("schedules", "set", "tick", "--every", "30", URL, "--body", '"ping"') == 0
    assert sent(route)[3] == {"every": 30, "task": {"callback_url": URL, "body": "ping"}}


@pytest.mark.parametrize(("argv", "message"), [
    (["s", URL], "one of the arguments --cron --every is required"),
    (["s", "--cron", "* * * * *", "--every", "5", URL], "not allowed with argument"),
    (["s", "--every", "1.5", URL], "argument --every: invalid int value"),
    (["s", "--every", "5"], "the following arguments are required: URL"),
])
def test_schedules_set_usage_errors(router: respx.MockRouter,
                                    capsys: pytest.CaptureFixture[str], argv: list[str],
                                    message: str) -> None:
    route = router.route().mock(return_value=httpx.Response(200, json=SCHEDULE))
    assert run("schedules", "set", *argv) == EXIT_USAGE
    assert message in capsys.readouterr().err
    assert route.call_count == 0


def test_schedules_list(router: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    page = {"schedules": [SCHEDULE], "next_cursor": None}
    route = router.get("/schedules").mock(return_value=httpx.Response(200, json=page))
    assert run("schedules", "list", "--limit", "10") == 0
    assert sent(route)[:3] == ("GET", "/schedules", {"limit": "10"})
    assert json.loads(capsys.readouterr().out) == page


UNSET = {"paused": False, "max_attempts": None, "retry_backoff": None, "max_backoff": None}


@pytest.mark.parametrize(("argv", "body"), [
    (["--parallelism", "5", "--rate", "0.5"], {"parallelism": 5, "rate": 0.5, **UNSET}),
    (["--rate", "10"], {"parallelism": None, "rate": 10, **UNSET}),
    ([], {"parallelism": None, "rate": None, **UNSET}),
    (["--paused", "--max-attempts", "20", "--retry-backoff", "30", "--max-backoff", "86400"],
     {"parallelism": None, "rate": None, "paused": True, "max_attempts": 20,
      "retry_backoff": 30, "max_backoff": 86400}),
])
def test_flows_set(router: respx.MockRouter, capsys: pytest.CaptureFixture[str],
                   argv: list[str], body: dict[str, Any]) -> None:
    router.get("/flows/api.example.com:443").mock(return_value=httpx.Response(200, json=FLOW))
    route = router.put("/flows/api.example.com:443").mock(return_value=httpx.Response(
        200, json=FLOW))
    assert run("flows", "set", "api.example.com:443", *argv) == 0
    assert sent(route) == ("PUT", "/flows/api.example.com:443", {}, body)
    out = capsys.readouterr()
    assert json.loads(out.out) == FLOW
    assert out.err == ""  # nothing changed that was not given


def test_flows_set_names_what_it_changed_that_was_not_given(
        router: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    """An incident: the flow is paused with a limit, and the operator raises a retry default
    only. The set resumes the flow and drops its limit (PUT replaces the whole configuration):
    said on stderr, so that it is not learned from the receiver."""
    paused = {**FLOW, "paused": True, "parallelism": 5, "rate": 2.0}
    router.get("/flows/f").mock(return_value=httpx.Response(200, json=paused))
    router.put("/flows/f").mock(return_value=httpx.Response(
        200, json={**FLOW, "parallelism": 100, "max_attempts": 30}))
    assert run("flows", "set", "f", "--max-attempts", "30") == 0
    assert capsys.readouterr().err == (
        "timewheel: note: flows set replaces the whole configuration; not given, so changed: "
        "paused true -> false, parallelism 5 -> 100, rate 2.0 -> null\n")


@pytest.mark.parametrize(("argv", "status", "answer", "stderr"), [
    (["tasks", "get", "nope"], 404, {"detail": "no task with key 'nope'"},
     "timewheel: 404 Not Found: no task with key 'nope'\n"),
    (["tasks", "cancel", "done"], 409, view("done", status="succeeded") | {
        "detail": "task 'done' has already finished"},
     "timewheel: 409 Conflict: task 'done' has already finished\n"),
    (["flows", "get", "f"], 401, {"detail": "missing or invalid bearer token"},
     "timewheel: 401 Unauthorized: missing or invalid bearer token\n"),
    (["schedules", "list"], 503, {"detail": "Redis is unavailable; try again later"},
     "timewheel: 503 Service Unavailable: Redis is unavailable; try again later\n"),
])
def test_api_errors_go_to_stderr_with_exit_1(router: respx.MockRouter,
                                            capsys: pytest.CaptureFixture[str], argv: list[str],
                                            status: int, answer: dict[str, Any],
                                            stderr: str) -> None:
    router.route().mock(return_value=httpx.Response(status, json=answer))
    assert run(*argv) == EXIT_API
    assert capsys.readouterr() == ("", stderr)


def test_unreachable_service_exits_3(router: respx.MockRouter,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    router.route().mock(side_effect=httpx.ConnectError("Connection refused"))
    assert run("tasks", "get", "k1") == EXIT_UNREACHABLE
    assert capsys.readouterr() == ("", "timewheel: cannot reach the service: "
                                       f"GET {BASE}/tasks/k1: Connection refused\n")


def test_base_url_flag_wins_over_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    with respx.mock(base_url="http://other.test:1", assert_all_mocked=True) as mock:
        route = mock.get("/tasks/k1").mock(return_value=httpx.Response(200, json=view()))
        assert run("tasks", "get", "k1", "--base-url", "http://other.test:1") == 0
    assert route.call_count == 1


def test_the_token_is_never_printed(router: respx.MockRouter,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    router.route().mock(side_effect=httpx.ConnectError("refused"))
    run("tasks", "get", "k1")
    router.route().mock(return_value=httpx.Response(401, json={"detail": "bad token"}))
    run("tasks", "get", "k1")
    assert "cli-token" not in "".join(capsys.readouterr())


def test_unicode_stays_readable(router: respx.MockRouter,
                                capsys: pytest.CaptureFixture[str]) -> None:
    router.route().mock(return_value=httpx.Response(200, json=view(last_error="délai dépassé")))
    assert run("tasks", "get", "k1") == 0
    assert "délai dépassé" in capsys.readouterr().out


def test_python_m_timewheel_routes_client_commands() -> None:
    """``python -m timewheel`` is the same program: a client command, no service listening."""
    done = subprocess.run(
        [sys.executable, "-m", "timewheel", "tasks", "get", "k1", "--base-url",
         "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "TIMEWHEEL_TOKEN": "t"})
    assert done.returncode == EXIT_UNREACHABLE
    assert done.stdout == ""
    assert done.stderr.startswith("timewheel: cannot reach the service: "
                                  "GET http://127.0.0.1:9/tasks/k1: ")


def test_serve_help_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    """The client commands sit next to serve; serve keeps its flags."""
    assert run("serve", "--help") == 0
    out = capsys.readouterr().out
    assert "--host HOST" in out and "--port PORT" in out and "--redis-url VALUE" in out
    assert "--base-url" not in out


def test_a_malformed_token_is_a_usage_error(router: respx.MockRouter,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TIMEWHEEL_TOKEN", "TOP SECRET")
    route = router.route().mock(return_value=httpx.Response(200, json=view()))
    assert run("tasks", "get", "k1") == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("timewheel: the token (TIMEWHEEL_TOKEN) must be")
    assert "SECRET" not in err
    assert route.call_count == 0


@pytest.mark.parametrize("args", [["--delay", "nan"], ["--delay", "inf"], ["--body", "NaN"],
                                  ["--body", "[Infinity]"]])
def test_non_finite_numbers_are_usage_errors(args: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """JSON has no NaN or Infinity: refused as usage errors (exit 2), not a traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main(["tasks", "add", "http://127.0.0.1:9/x", *args])
    assert exit_info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "http://127.0.0.1:8080:5", "http://[::1"])
def test_a_malformed_url_is_a_usage_error(router: respx.MockRouter,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str], url: str) -> None:
    """One line naming TIMEWHEEL_URL, exit 2: not httpx's traceback, nor "cannot reach the
    service" (exit 3) for a URL that is a setting to correct."""
    monkeypatch.setenv("TIMEWHEEL_URL", url)
    assert run("tasks", "get", "k1") == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("timewheel: TIMEWHEEL_URL must be an absolute http:// or https:// URL")
    assert err.count("\n") == 1


def test_an_empty_key_is_a_usage_error(router: respx.MockRouter,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``timewheel tasks get ''`` printed ``307 Temporary Redirect`` (GET /tasks/)."""
    route = router.route().mock(return_value=httpx.Response(307))
    assert run("tasks", "get", "") == EXIT_USAGE
    out, err = capsys.readouterr()
    assert (out, err) == ("", "timewheel: the task key must not be empty\n")
    assert route.call_count == 0


def test_json_stays_json_on_a_stdout_that_cannot_encode_it(router: respx.MockRouter,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """On an ASCII stdout (PYTHONIOENCODING=ascii, a Latin-1 locale, a redirected Windows
    console) printing the answer raised UnicodeEncodeError: a traceback, and the task that was
    just created unseen. JSON's own escapes keep it JSON there."""
    router.route().mock(return_value=httpx.Response(200, json=view(last_error="caf\u00e9 \u2603")))
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    assert run("tasks", "get", "k1") == 0
    out.flush()
    assert json.loads(out.buffer.getvalue())["last_error"] == "caf\u00e9 \u2603"


@pytest.mark.parametrize("command", [["tasks", "add"], ["schedules", "set"],
                                     ["topics", "publish"]])
def test_help_gives_the_defaults_the_service_applies(capsys: pytest.CaptureFixture[str],
                                                     command: list[str]) -> None:
    """A task that sets no max_attempts / retry_backoff takes its flow's retry defaults (v3),
    so "default 5" was wrong for a flow with defaults; and topics publish has no URL: each
    task's flow is by default its own callback URL's (its endpoint's) host:port."""
    assert run(*command, "--help") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--max-attempts N attempts (default: the flow's, else 5)" in out
    assert ("--retry-backoff S seconds before the first retry (default: the flow's, else 1), "
            "doubling") in out
    assert "(default: each callback URL's host:port)" in out


def test_tasks_list_help_says_what_status_is(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("tasks", "list", "--help") == 0
    assert "the tasks with this status (failed: the dead letters" in " ".join(
        capsys.readouterr().out.split())
