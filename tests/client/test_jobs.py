"""Bulk jobs from the client and the CLI (docs/api.md v3, "Bulk jobs", "CLI additions"): both
clients against the real app, and ``timewheel jobs ...`` against respx."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from tests.client.conftest import BASE, Both
from tests.client.test_cli import run, sent
from tests.conftest import START_MS
from timewheel.client import InvalidRequestError, NotFoundError
from timewheel.clock import FakeClock
from timewheel.jobs.runner import JobRunner
from timewheel.models import JobCreated, JobFilter, JobView, TaskCreate, format_ms
from timewheel.store import Store
from timewheel.store.job_store import JobStore

URL = "http://127.0.0.1:9/hook"
JOB = {"id": "0123456789abcdef", "kind": "cancel", "filter": {"key_prefix": "a."},
       "state": "running", "matched": 0, "done": 0, "skipped": 0,
       "started_at": "2027-01-15T08:00:00.000Z", "finished_at": None}


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    """As tests/client/test_cli.py: the CLI reads the service's URL and token from these."""
    monkeypatch.setenv("TIMEWHEEL_URL", BASE)
    monkeypatch.setenv("TIMEWHEEL_TOKEN", "cli-token")


async def test_cancel_tasks_then_get_job(real: Both, store: Store, fake_clock: FakeClock
                                         ) -> None:
    for key in ("a.1", "a.2", "b.1"):
        await real.call("create_task", TaskCreate(key=key, callback_url=URL, delay=60))
    created = await real.call("cancel_tasks", JobFilter(key_prefix="a."))
    assert isinstance(created, JobCreated)
    assert await JobRunner(JobStore(store), fake_clock, pause_s=0, busy_share=1.0).work_one()
    view = await real.call("get_job", created.job)
    assert isinstance(view, JobView)
    assert (view.kind, view.state, view.matched, view.done, view.filter) == (
        "cancel", "done", 2, 2, {"key_prefix": "a."})
    assert (await real.call("get_task", "b.1")).status == "scheduled"
    replayed = await real.call("replay_tasks", {"status": "cancelled", "key_prefix": "a."})
    fake_clock.advance(1)
    assert await JobRunner(JobStore(store), fake_clock, pause_s=0, busy_share=1.0).work_one()
    assert (await real.call("get_job", replayed.job)).done == 2
    assert (await real.call("get_task", "a.1")).status == "scheduled"
    assert view.started_at == format_ms(START_MS)


async def test_errors_arrive_as_the_clients_exceptions(real: Both) -> None:
    with pytest.raises(InvalidRequestError):
        await real.call("cancel_tasks", {"status": "failed"})
    with pytest.raises(InvalidRequestError):
        await real.call("replay_tasks", {})
    with pytest.raises(NotFoundError):
        await real.call("get_job", "0123456789abcdef")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--filter", "key_prefix=order."], {"key_prefix": "order."}),
    (["--filter", "key_prefix=order.", "--filter", "status=scheduled"],
     {"key_prefix": "order.", "status": "scheduled"}),
    (["--filter", '{"flow_key": "api.example.com:443", "due_before": "2027-01-15T09:00:00Z"}'],
     {"flow_key": "api.example.com:443", "due_before": "2027-01-15T09:00:00Z"}),
    (["--filter", "created_before=1800000000.5"], {"created_before": 1800000000.5}),
])
@pytest.mark.parametrize("kind", ["cancel", "replay"])
def test_jobs_start_sends_the_filter_and_prints_the_job(
        router: respx.MockRouter, capsys: pytest.CaptureFixture[str], kind: str,
        argv: list[str], expected: dict[str, Any]) -> None:
    route = router.post(f"/tasks/{kind}").mock(
        return_value=httpx.Response(202, json={"job": JOB["id"]}))
    assert run("jobs", kind, *argv) == 0
    assert sent(route) == ("POST", f"/tasks/{kind}", {}, expected)
    assert json.loads(capsys.readouterr().out) == {"job": JOB["id"]}


def test_jobs_get_prints_the_job(router: respx.MockRouter,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    route = router.get(f"/jobs/{JOB['id']}").mock(return_value=httpx.Response(200, json=JOB))
    assert run("jobs", "get", str(JOB["id"])) == 0
    assert sent(route)[:2] == ("GET", f"/jobs/{JOB['id']}")
    assert json.loads(capsys.readouterr().out) == JOB


@pytest.mark.parametrize("argv", [
    ["jobs", "cancel"],  # --filter is required
    ["jobs", "cancel", "--filter", "bogus=1"],
    ["jobs", "cancel", "--filter", "key_prefix"],
    ["jobs", "replay", "--filter", "{not json"],
])
def test_jobs_usage_errors(router: respx.MockRouter, argv: list[str]) -> None:
    assert run(*argv) == 2
    assert not router.calls


def test_jobs_refused_filter_exits_1(router: respx.MockRouter,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    router.post("/tasks/cancel").mock(return_value=httpx.Response(422, json={"detail": [
        {"type": "value_error", "loc": ["body", "status"], "msg": "no", "input": "failed"}]}))
    assert run("jobs", "cancel", "--filter", "status=failed") == 1
    assert "status" in capsys.readouterr().err
