"""The client CLI end to end: `python -m timewheel tasks ...` processes against a real
`timewheel serve` (tokens on) and a real receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.waiting import settle

pytestmark = pytest.mark.e2e

TOKEN = "e2e-cli-token"


def cli(service: Service, *argv: str, token: str | None = TOKEN
        ) -> subprocess.CompletedProcess[str]:
    """Run ``python -m timewheel argv...`` the way a user would: URL and token from the
    environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEWHEEL_")}
    env["TIMEWHEEL_URL"] = service.base_url
    if token is not None:
        env["TIMEWHEEL_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "timewheel", *argv], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def ok(done: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a successful command printed."""
    assert (done.returncode, done.stderr) == (0, ""), done
    return json.loads(done.stdout)


def wait_status(service: Service, key: str, status: str, timeout: float = 20) -> None:
    """Poll GET /tasks/{key} (plain httpx: faster than a process per poll)."""
    with httpx.Client(base_url=service.base_url, timeout=5,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        settle(lambda: client.get(f"/tasks/{key}").json()["status"] == status, timeout,
               lambda: f"{key} {status}; the service's log:\n{service.log()}")


def test_cli_round_trip(start_service: Callable[..., Service],
                        receiver: ThreadedReceiver) -> None:
    """add with body and header → delivered as given; get; a failure lands in list --status
    failed and replays; cancel; an unknown key and a missing token exit 1 with the error on
    stderr."""
    service = start_service(api_tokens=TOKEN)
    receiver.respond("/bad", [400])

    added = ok(cli(service, "tasks", "add", receiver.url("/cli"), "--key", "cli-1",
                   "--method", "put", "--body", '{"invoice": 42, "note": "café"}',
                   "--header", "X-Tenant: acme"))
    assert (added["key"], added["status"], added["method"]) == ("cli-1", "scheduled", "PUT")
    receiver.wait_for_sync(1, timeout=20, path="/cli")
    arrival = receiver.arrivals_for("/cli")[0]
    assert arrival.method == "PUT"
    assert json.loads(arrival.body) == {"invoice": 42, "note": "café"}
    assert arrival.headers["x-tenant"] == "acme"
    assert arrival.headers["content-type"] == "application/json"
    assert arrival.headers["webhook-id"] == "cli-1"
    wait_status(service, "cli-1", "succeeded")
    got = ok(cli(service, "tasks", "get", "cli-1"))
    assert (got["status"], got["attempts"], got["last_status_code"]) == ("succeeded", 1, 200)

    ok(cli(service, "tasks", "add", receiver.url("/bad"), "--key", "bad-1"))
    wait_status(service, "bad-1", "failed")
    dead = ok(cli(service, "tasks", "list", "--status", "failed", "--limit", "10"))
    assert [t["key"] for t in dead["tasks"]] == ["bad-1"]
    assert dead["tasks"][0]["last_status_code"] == 400
    replayed = ok(cli(service, "tasks", "replay", "bad-1"))
    assert (replayed["key"], replayed["attempts"]) == ("bad-1", 0)

    later = ok(cli(service, "tasks", "add", receiver.url("/later"), "--key", "later-1",
                   "--delay", "3600"))
    assert later["status"] == "scheduled"
    assert ok(cli(service, "tasks", "cancel", "later-1")) == {"key": "later-1",
                                                               "cancelled": True}
    assert ok(cli(service, "tasks", "get", "later-1"))["status"] == "cancelled"
    again = cli(service, "tasks", "cancel", "later-1")
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr == "timewheel: 409 Conflict: task 'later-1' has already finished\n"

    unknown = cli(service, "tasks", "cancel", "nope")
    assert (unknown.returncode, unknown.stdout) == (1, "")
    assert unknown.stderr == "timewheel: 404 Not Found: no task with key 'nope'\n"

    anonymous = cli(service, "tasks", "get", "cli-1", token=None)
    assert (anonymous.returncode, anonymous.stdout) == (1, "")
    assert anonymous.stderr == ("timewheel: 401 Unauthorized: missing or invalid bearer "
                                "token\n")
    assert receiver.arrivals_for("/later") == []


def test_cli_lists_scheduled_tasks_by_prefix(start_service: Callable[..., Service],
                                             receiver: ThreadedReceiver) -> None:
    """`tasks list --status scheduled --prefix P`: the matching tasks, soonest first."""
    service = start_service(api_tokens=TOKEN)
    for key, delay in (("rem-b", "300"), ("rem-a", "600"), ("other", "100"), ("rem-c", "200")):
        ok(cli(service, "tasks", "add", receiver.url("/rem"), "--key", key, "--delay", delay))
    page = ok(cli(service, "tasks", "list", "--status", "scheduled", "--prefix", "rem-"))
    assert [t["key"] for t in page["tasks"]] == ["rem-c", "rem-b", "rem-a"]


def test_cli_schedules_and_flows(start_service: Callable[..., Service],
                                 receiver: ThreadedReceiver) -> None:
    """A schedule set from the CLI fires as tasks with its headers, in the flow it names;
    pause, list, delete; flows set/get/list/delete."""
    service = start_service(api_tokens=TOKEN)
    flow = ok(cli(service, "flows", "set", "cli-flow", "--parallelism", "2", "--rate", "50"))
    assert (flow["key"], flow["parallelism"], flow["rate"]) == ("cli-flow", 2, 50)
    assert ok(cli(service, "flows", "get", "cli-flow")) == flow
    assert ok(cli(service, "flows", "list")) == {"flows": [flow]}

    made = ok(cli(service, "schedules", "set", "tick", "--every", "1", receiver.url("/tick"),
                  "--header", "X-Job: tick", "--body", '{"kind": "tick"}',
                  "--flow-key", "cli-flow"))
    assert (made["id"], made["every"], made["paused"]) == ("tick", 1, False)
    assert made["task"]["headers"] == {"X-Job": "tick"}
    receiver.wait_for_sync(1, timeout=20, path="/tick")
    arrival = receiver.arrivals_for("/tick")[0]
    assert arrival.headers["webhook-id"].startswith("tick.")
    assert arrival.headers["x-job"] == "tick"
    assert json.loads(arrival.body) == {"kind": "tick"}

    paused = ok(cli(service, "schedules", "pause", "tick"))
    assert (paused["paused"], paused["next_run_at"]) == (True, None)
    assert [s["id"] for s in ok(cli(service, "schedules", "list"))["schedules"]] == ["tick"]
    assert ok(cli(service, "schedules", "delete", "tick")) == {"id": "tick", "deleted": True}
    gone = cli(service, "schedules", "get", "tick")
    assert (gone.returncode, gone.stdout) == (1, "")
    assert gone.stderr == "timewheel: 404 Not Found: no schedule with id 'tick'\n"

    assert ok(cli(service, "flows", "delete", "cli-flow")) == {"key": "cli-flow",
                                                               "deleted": True}
    assert ok(cli(service, "flows", "list")) == {"flows": []}


def test_cli_reschedule_fires_at_the_new_time_with_the_original_request(
        start_service: Callable[..., Service], receiver: ThreadedReceiver) -> None:
    """`tasks reschedule` (PATCH) moves a task due in an hour to a few seconds from now: the
    callback arrives then, not before, with the body, headers and method it was created
    with (PUT would have dropped them)."""
    service = start_service(api_tokens=TOKEN)
    ok(cli(service, "tasks", "add", receiver.url("/moved"), "--key", "moved-1", "--delay",
           "3600", "--method", "put", "--body", '{"order": 42}', "--header", "X-Tenant: acme"))
    moved = ok(cli(service, "tasks", "reschedule", "moved-1", "--delay", "2"))
    assert (moved["status"], moved["method"]) == ("scheduled", "PUT")
    new_time = datetime.fromisoformat(moved["execute_at"].replace("Z", "+00:00")).timestamp()
    receiver.wait_for_sync(1, timeout=30, path="/moved")
    arrival = receiver.arrivals_for("/moved")[0]
    assert arrival.received_at >= new_time
    assert (arrival.method, json.loads(arrival.body)) == ("PUT", {"order": 42})
    assert arrival.headers["x-tenant"] == "acme"
    assert arrival.headers["content-type"] == "application/json"
    assert arrival.headers["timewheel-scheduled-at"] == moved["execute_at"]
    wait_status(service, "moved-1", "succeeded")
    late = cli(service, "tasks", "reschedule", "moved-1", "--delay", "5")
    assert (late.returncode, late.stdout) == (1, "")
    assert late.stderr == "timewheel: 409 Conflict: task 'moved-1' has already finished\n"
