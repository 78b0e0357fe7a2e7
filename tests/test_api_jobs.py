"""Bulk jobs through the API (docs/api.md v3, "Bulk jobs"): POST /tasks/cancel and
/tasks/replay record a job, a runner (timewheel/jobs/runner.py) works it in bounded steps,
GET /jobs/{id} shows its progress. The runner is driven here by hand on a fake clock; the
end-to-end tests (tests/e2e/test_jobs.py) run it inside real processes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tests.conftest import START_MS
from tests.test_api import URL, fail_due
from timewheel.clock import FakeClock
from timewheel.errors import StoreUnavailable
from timewheel.jobs.runner import JobRunner
from timewheel.store import Store
from timewheel.store.job_store import JobStore


async def add(client: httpx.AsyncClient, key: str, *, delay: float = 3600,
              **fields: Any) -> None:
    r = await client.post("/tasks", json={"key": key, "callback_url": URL, "delay": delay,
                                          **fields})
    assert r.status_code == 201, r.text


async def start(client: httpx.AsyncClient, kind: str, body: dict[str, Any]) -> str:
    r = await client.post(f"/tasks/{kind}", json=body)
    assert r.status_code == 202, r.text
    assert set(r.json()) == {"job"}
    return str(r.json()["job"])


async def job(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    r = await client.get(f"/jobs/{job_id}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def statuses(client: httpx.AsyncClient, keys: list[str]) -> dict[str, str]:
    return {k: (await client.get(f"/tasks/{k}")).json()["status"] for k in keys}


def runner(store: Store, clock: FakeClock, **kwargs: Any) -> JobRunner:
    kwargs.setdefault("pause_s", 0)
    kwargs.setdefault("busy_share", 1.0)
    return JobRunner(JobStore(store), clock, **kwargs)


async def test_cancel_by_prefix_cancels_the_matching_tasks_only(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    ours = [f"bulk.{i}" for i in range(30)]
    others = [f"keep.{i}" for i in range(5)] + ["bulk"]  # "bulk" lacks the dot
    for key in ours + others:
        await add(client, key)
    job_id = await start(client, "cancel", {"key_prefix": "bulk."})
    before = await job(client, job_id)
    assert before == {"id": job_id, "kind": "cancel", "filter": {"key_prefix": "bulk."},
                      "state": "running", "matched": 0, "done": 0, "skipped": 0,
                      "started_at": "2027-01-15T08:00:00.000Z", "finished_at": None}
    fake_clock.advance(5)
    r = runner(store, fake_clock, step_tasks=4)  # several steps per bucket
    assert await r.work_one()
    after = await job(client, job_id)
    assert (after["state"], after["matched"], after["done"], after["skipped"]) == (
        "done", 30, 30, 0)
    assert after["finished_at"] == "2027-01-15T08:00:00.005Z"
    assert r.steps > store.keys.buckets  # bounded: more than one step in some buckets
    assert set((await statuses(client, ours)).values()) == {"cancelled"}
    assert set((await statuses(client, others)).values()) == {"scheduled"}
    assert not await r.work_one()  # nothing left to take


async def test_a_task_cancelled_after_the_job_began_counts_as_skipped(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    """The contract: "A task that a job could not act on (finished meanwhile) counts as
    skipped". Tasks DELETEd after the job began and before it reached them were counted
    nowhere (matched 150 of 200, skipped 0: this session's outside audit); they are skipped
    now, and tasks cancelled before the job began, or that the filter does not take, are not
    counted at all."""
    keys = [f"bulk.{i}" for i in range(12)]
    for key in [*keys, "other.0"]:
        await add(client, key)
    assert (await client.delete("/tasks/bulk.0")).status_code == 204  # before: not counted
    fake_clock.advance(1)
    job_id = await start(client, "cancel", {"key_prefix": "bulk."})
    scheduled_only = await start(client, "cancel", {"key_prefix": "bulk.", "status": "retrying"})
    fake_clock.advance(1)
    for key in [*keys[1:5], "other.0"]:  # meanwhile
        assert (await client.delete(f"/tasks/{key}")).status_code == 204
    r = runner(store, fake_clock, step_tasks=3)
    assert await r.work_one() and await r.work_one()
    view = await job(client, job_id)
    assert (view["state"], view["matched"], view["done"], view["skipped"]) == ("done", 11, 7, 4)
    assert set((await statuses(client, keys)).values()) == {"cancelled"}
    view = await job(client, scheduled_only)  # they were never retrying: not its tasks
    assert (view["state"], view["matched"], view["done"], view["skipped"]) == ("done", 0, 0, 0)


async def test_a_task_the_job_cancelled_and_meets_again_counts_once(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing finds bulk.0; a PATCH moves it to a later minute before the step; the step
    cancels it (done). The walk then meets its entry in the later minute, cancelled since the
    job began, but by the job: not taken again (a review found it counted skipped as well)."""
    await add(client, "bulk.0", delay=60)
    await add(client, "bulk.1", delay=120)
    fake_clock.advance(1)
    job_id = await start(client, "cancel", {"key_prefix": "bulk."})
    real_find = JobStore.find
    moved: list[str] = []

    async def find(self: JobStore, *args: Any, **kwargs: Any) -> Any:
        found = await real_find(self, *args, **kwargs)
        if "bulk.0" in found.keys and not moved:
            moved.append("bulk.0")
            r = await client.patch("/tasks/bulk.0", json={"delay": 3600})
            assert r.status_code == 200, r.text
        return found

    monkeypatch.setattr(JobStore, "find", find)
    r = runner(store, fake_clock, step_tasks=1)
    assert await r.work_one()
    assert moved
    assert set((await statuses(client, ["bulk.0", "bulk.1"])).values()) == {"cancelled"}
    view = await job(client, job_id)
    assert (view["matched"], view["done"], view["skipped"]) == (2, 2, 0), view


async def test_only_tasks_created_before_the_job_are_cancelled(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    await add(client, "bulk.old")
    job_id = await start(client, "cancel", {"key_prefix": "bulk."})
    fake_clock.advance(1)
    await add(client, "bulk.new")
    assert await runner(store, fake_clock).work_one()
    assert await statuses(client, ["bulk.old", "bulk.new"]) == {
        "bulk.old": "cancelled", "bulk.new": "scheduled"}
    assert (await job(client, job_id))["matched"] == 1


@pytest.mark.parametrize(("body", "hit"), [
    ({"status": "scheduled"}, {"s.a", "s.b", "s.c"}),
    ({"status": "retrying"}, {"r.a"}),
    ({"flow_key": "partner"}, {"s.b", "r.a"}),
    ({"due_before": (START_MS + 1_800_000) / 1000}, {"s.a", "r.a"}),
    ({"due_before": "2027-01-15T08:30:00Z"}, {"s.a", "r.a"}),
    ({"created_before": (START_MS + 1000) / 1000}, {"s.a", "r.a"}),
    ({"key_prefix": "s.", "flow_key": "partner"}, {"s.b"}),
    ({"status": "scheduled", "due_before": (START_MS + 1_800_000) / 1000}, {"s.a"}),
])
async def test_each_filter_field(client: httpx.AsyncClient, store: Store,
                                 fake_clock: FakeClock, body: dict[str, Any],
                                 hit: set[str]) -> None:
    """s.a due in 10 min, r.a retrying (failed once, due in 20 min), both created first; s.b
    and s.c due in an hour, created a second later; s.b and r.a in flow "partner"."""
    await add(client, "s.a", delay=600)
    await add(client, "r.a", delay=0, flow_key="partner")
    # One failed attempt: retrying, due again in 20 minutes.
    await client.patch("/tasks/r.a", json={"delay": 0})
    bucket = store.keys.bucket_of("r.a")
    token = "tok-retry"
    _, claimed = await store.claim(bucket, now_ms=START_MS, horizon_ms=START_MS, limit=10,
                                   token=token)
    assert [t.key for t in claimed] == ["r.a"]
    await store.start(bucket, claims=[("r.a", token)])
    from timewheel.store import Outcome
    await store.complete(bucket, now_ms=START_MS, outcomes=[Outcome(
        "r.a", token, "retry", status_code=503, next_due_ms=START_MS + 1_200_000,
        started_ms=START_MS)])
    fake_clock.advance(1000)
    await add(client, "s.b", flow_key="partner")
    await add(client, "s.c")
    keys = ["s.a", "r.a", "s.b", "s.c"]
    assert await statuses(client, keys) == {"s.a": "scheduled", "r.a": "retrying",
                                            "s.b": "scheduled", "s.c": "scheduled"}
    job_id = await start(client, "cancel", body)
    assert await runner(store, fake_clock).work_one()
    after = await statuses(client, keys)
    assert {k for k, s in after.items() if s == "cancelled"} == hit
    view = await job(client, job_id)
    assert (view["matched"], view["done"], view["skipped"]) == (len(hit), len(hit), 0)


async def test_replay_by_status_failed(client: httpx.AsyncClient, store: Store,
                                       fake_clock: FakeClock) -> None:
    for i in range(6):
        await add(client, f"dead.{i}", delay=0, max_attempts=1)
    await add(client, "gone", delay=0)
    await add(client, "later")
    assert await fail_due(store, START_MS) == ["dead.0", "dead.1", "dead.2", "dead.3",
                                               "dead.4", "dead.5", "gone"]
    await add(client, "stopped")
    await client.delete("/tasks/stopped")  # cancelled: not failed, stays cancelled
    fake_clock.advance(10)
    job_id = await start(client, "replay", {"status": "failed", "key_prefix": "dead."})
    assert await runner(store, fake_clock, step_tasks=2).work_one()
    view = await job(client, job_id)
    assert (view["kind"], view["state"], view["matched"], view["done"]) == (
        "replay", "done", 6, 6)
    for i in range(6):
        task = (await client.get(f"/tasks/dead.{i}")).json()
        assert (task["status"], task["attempts"]) == ("scheduled", 0)
    assert await statuses(client, ["gone", "stopped", "later"]) == {
        "gone": "failed", "stopped": "cancelled", "later": "scheduled"}


async def test_replay_without_status_takes_failed_and_cancelled(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    await add(client, "x.dead", delay=0, max_attempts=1)
    await fail_due(store, START_MS)
    await add(client, "x.stopped")
    await client.delete("/tasks/x.stopped")
    await add(client, "x.pending")
    fake_clock.advance(10)
    job_id = await start(client, "replay", {"key_prefix": "x."})
    assert await runner(store, fake_clock).work_one()
    assert await statuses(client, ["x.dead", "x.stopped", "x.pending"]) == {
        "x.dead": "scheduled", "x.stopped": "scheduled", "x.pending": "scheduled"}
    assert (await job(client, job_id))["done"] == 2


@pytest.mark.parametrize(("kind", "body", "loc"), [
    ("cancel", {}, ["body"]),
    ("cancel", {"status": None}, ["body", "status"]),
    ("cancel", {"key_prefix": "a.", "flow_key": None}, ["body", "flow_key"]),
    ("cancel", {"bogus": 1}, ["body", "bogus"]),
    ("cancel", {"status": "failed"}, ["body", "status"]),
    ("cancel", {"status": "waiting"}, ["body", "status"]),
    ("replay", {"status": "scheduled"}, ["body", "status"]),
    ("replay", {"status": "succeeded"}, ["body", "status"]),
    ("cancel", {"key_prefix": ""}, ["body", "key_prefix"]),
    ("cancel", {"key_prefix": "a b"}, ["body", "key_prefix"]),
    ("cancel", {"flow_key": 3}, ["body", "flow_key"]),
    ("cancel", {"due_before": "yesterday"}, ["body", "due_before"]),
    ("cancel", {"created_before": -1}, ["body", "created_before"]),
    ("replay", [], ["body"]),
])
async def test_bad_input_is_422_naming_the_field_and_stores_nothing(
        client: httpx.AsyncClient, redis: Redis, kind: str, body: Any, loc: list[str]) -> None:
    await add(client, "a.1")
    keys_before = sorted(await redis.keys("*"))
    r = await client.post(f"/tasks/{kind}", json=body)
    assert r.status_code == 422, r.text
    assert any(error["loc"][:len(loc)] == loc and (len(loc) > 1 or len(error["loc"]) <= 2)
               for error in r.json()["detail"]), r.json()
    assert sorted(await redis.keys("*")) == keys_before
    # Control: a good filter stores a job.
    assert (await client.post(f"/tasks/{kind}", json={"key_prefix": "a."})).status_code == 202
    assert sorted(await redis.keys("*")) != keys_before


@pytest.mark.parametrize(("kind", "status", "expected"), [
    ("cancel", "bogus", "'scheduled', 'retrying' or 'delivering'"),
    ("cancel", "failed", "'scheduled', 'retrying' or 'delivering'"),
    ("replay", "scheduled", "'failed' or 'cancelled'"),
    ("replay", 3, "'failed' or 'cancelled'"),
])
async def test_a_status_the_job_cannot_take_is_refused_naming_the_values_as_sent(
        client: httpx.AsyncClient, kind: str, status: Any, expected: str) -> None:
    """The 422 lists the statuses as a client writes them, not as Python shows the enum
    (``<TaskStatus.SCHEDULED: 'scheduled'>``)."""
    r = await client.post(f"/tasks/{kind}", json={"status": status})
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert (error["loc"], error["type"], error["msg"]) == (
        ["body", "status"], "literal_error", f"Input should be {expected}")
    assert "TaskStatus" not in r.text


@pytest.mark.parametrize(("given", "shown"), [
    ("2026-11-28T10:55:30+02:00", "2026-11-28T08:55:30.000Z"),
    ("2026-11-28t08:55:30.1234z", "2026-11-28T08:55:30.124Z"),  # the millisecond compared
    (1795000000, "2026-11-18T11:06:40.000Z"),
    (1795000000.25, "2026-11-18T11:06:40.250Z"),
])
async def test_the_filter_times_are_shown_in_rfc3339_utc_with_milliseconds(
        client: httpx.AsyncClient, store: Store, given: str | float, shown: str) -> None:
    """docs/api.md: "Timestamps in responses are RFC 3339 UTC with milliseconds", the filter's
    ``due_before`` and ``created_before`` too, however they were sent. The job keeps them as
    sent (a job recorded before they were shown so renders the same), the other fields as
    they are."""
    body = {"due_before": given, "created_before": given, "key_prefix": "a."}
    job_id = await start(client, "cancel", body)
    assert (await job(client, job_id))["filter"] == {
        "due_before": shown, "created_before": shown, "key_prefix": "a."}
    stored = await JobStore(store).get(job_id)
    assert stored is not None and stored.filter == body


async def test_a_filter_time_past_year_9999_in_utc_is_shown_as_given(
        client: httpx.AsyncClient) -> None:
    """Accepted (a job with it does what it says), but not a time a view can write: the view
    must not fail (it answered 500), it shows the time as sent."""
    far = "9999-12-31T23:59:59-01:00"
    job_id = await start(client, "cancel", {"due_before": far, "key_prefix": "zz."})
    assert (await job(client, job_id))["filter"]["due_before"] == far


async def test_unknown_job_is_404(client: httpx.AsyncClient) -> None:
    assert (await client.get("/jobs/0123456789abcdef")).status_code == 404
    assert (await client.get("/jobs/not-an-id")).status_code == 422


async def test_a_step_is_taken_once_and_a_task_finished_meanwhile_is_skipped(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    """The listing and the step are two calls: a task cancelled between them is counted as
    skipped; bringing the same step again (a second runner, a retry) writes nothing."""
    keys = [f"k.{i}" for i in range(40)]
    for key in keys:
        await add(client, key)
    job_id = await start(client, "cancel", {"key_prefix": "k."})
    jobs = JobStore(store)
    bucket = store.keys.bucket_of("k.0")
    from timewheel.jobs.sources import sources, task_filter
    from timewheel.store.job_store import Position
    src = sources("cancel", None)[0]
    filt = task_filter({"key_prefix": "k."}, START_MS)
    at = await jobs.position(bucket, job_id)
    found = await jobs.find(bucket, src, ("", ""), filt, limit=100)
    assert "k.0" in found.keys and found.done
    assert (await client.delete("/tasks/k.0")).status_code == 204  # finished meanwhile
    reached = Position(1)
    code, counts = await jobs.step(bucket, job_id, "cancel", now_ms=START_MS, start=at,
                                   reached=reached, keys=found.keys, src=src, task_filter=filt)
    n = len(found.keys)
    assert (code.name, counts.matched, counts.done, counts.skipped) == ("STEPPED", n, n - 1, 1)
    again, counts = await jobs.step(bucket, job_id, "cancel", now_ms=START_MS, start=at,
                                    reached=reached, keys=found.keys, src=src,
                                    task_filter=filt)
    assert (again.name, counts.matched, counts.done, counts.skipped) == ("STALE", n, n - 1, 1)
    assert await jobs.position(bucket, job_id) == reached


async def test_a_second_runner_carries_on_after_the_first_dies(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    """Runner A is killed mid-job (cancelled between two Redis calls); B takes the job once
    A's lease has run out and finishes it: every task cancelled once, counts exact."""
    keys = [f"m.{i}" for i in range(300)]
    r = await client.post("/tasks/batch", json={"tasks": [
        {"key": k, "callback_url": URL, "delay": 3600} for k in keys]})
    assert r.status_code == 200
    job_id = await start(client, "cancel", {"key_prefix": "m."})
    a = runner(store, fake_clock, step_tasks=3, lease_ms=10_000)
    work = asyncio.create_task(a.work_one())
    while a.steps < 40:
        await asyncio.sleep(0)
    work.cancel()
    with pytest.raises(asyncio.CancelledError):
        await work
    half = await job(client, job_id)
    assert half["state"] == "running" and 0 < half["done"] < 300
    b = runner(store, fake_clock, step_tasks=50, lease_ms=10_000)
    assert not await b.work_one()  # A's lease still holds
    fake_clock.advance(10_001)
    assert await b.work_one()
    view = await job(client, job_id)
    assert (view["state"], view["matched"], view["done"], view["skipped"]) == (
        "done", 300, 300, 0)
    assert set((await statuses(client, keys)).values()) == {"cancelled"}


async def test_a_runner_that_stops_hands_the_job_back_at_once(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    """SIGTERM's path: the runner stops between two steps and ends its lease, so another one
    takes the job without waiting for the lease (the clock does not move here)."""
    r = await client.post("/tasks/batch", json={"tasks": [
        {"key": f"s.{i}", "callback_url": URL, "delay": 3600} for i in range(200)]})
    assert r.status_code == 200
    job_id = await start(client, "cancel", {"key_prefix": "s."})
    a = runner(store, fake_clock, step_tasks=3, poll_s=0.01)
    a.start()
    while a.steps < 10:
        await asyncio.sleep(0)
    await a.stop()
    assert (await job(client, job_id))["state"] == "running"
    b = runner(store, fake_clock, step_tasks=50)
    assert await b.work_one()
    view = await job(client, job_id)
    assert (view["state"], view["matched"], view["done"]) == ("done", 200, 200)


async def test_a_task_changed_between_the_listing_and_the_step_is_skipped(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock) -> None:
    """The step checks each key against the filter again: a task moved past ``due_before``
    after the listing found it is left alone and counted as skipped."""
    await add(client, "d.0", delay=60)
    await add(client, "d.1", delay=60)
    job_id = await start(client, "cancel", {"due_before": (START_MS + 120_000) / 1000})
    jobs = JobStore(store)
    from timewheel.jobs.sources import sources, task_filter
    from timewheel.store.job_store import Position
    src = sources("cancel", None)[0]
    filt = task_filter({"due_before": (START_MS + 120_000) / 1000}, START_MS)
    bucket = store.keys.bucket_of("d.0")
    found = await jobs.find(bucket, src, ("", ""), filt, limit=100)
    assert "d.0" in found.keys
    assert (await client.patch("/tasks/d.0", json={"delay": 600})).status_code == 200
    code, counts = await jobs.step(bucket, job_id, "cancel", now_ms=START_MS,
                                   start=await jobs.position(bucket, job_id),
                                   reached=Position(1), keys=found.keys, src=src,
                                   task_filter=filt)
    assert code.name == "STEPPED" and counts.skipped == 1
    assert (await client.get("/tasks/d.0")).json()["status"] == "scheduled"


def refuse_the_first_step(monkeypatch: pytest.MonkeyPatch, message: str) -> None:
    """The job's first step is refused by Redis with ``message`` (as redis-py raises it)."""
    real_step = JobStore.step
    refused: list[str] = []

    async def step(self: JobStore, *args: Any, **kwargs: Any) -> Any:
        if not refused:
            refused.append(message)
            try:
                raise ResponseError(message)
            except ResponseError as exc:
                raise StoreUnavailable(f"job_step: ResponseError: {exc}") from exc
        return await real_step(self, *args, **kwargs)

    monkeypatch.setattr(JobStore, "step", step)


async def test_a_busy_redis_is_waited_for_not_a_failed_job(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """BUSY (another script over lua-time-limit) passes: the step is taken again and the job
    ends done; before, the job was marked failed for good."""
    await add(client, "b.0")
    job_id = await start(client, "cancel", {"key_prefix": "b."})
    refuse_the_first_step(monkeypatch, "BUSY Redis is busy running a script. You can only "
                                       "call SCRIPT KILL or SHUTDOWN NOSAVE.")
    assert await runner(store, fake_clock, poll_s=0).work_one()
    view = await job(client, job_id)
    assert (view["state"], view["matched"], view["done"]) == ("done", 1, 1)


async def test_a_script_that_refuses_fails_the_job(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal no retry mends (a record of the v1 layout): the job fails, saying why."""
    await add(client, "o.0")
    job_id = await start(client, "cancel", {"key_prefix": "o."})
    refuse_the_first_step(monkeypatch, "OLDLAYOUT task o.0 has a record of the v1 layout")
    assert await runner(store, fake_clock).work_one()
    view = await job(client, job_id)
    assert view["state"] == "failed"
    assert (await statuses(client, ["o.0"])) == {"o.0": "scheduled"}


def claim_after_the_slices_listing(monkeypatch: pytest.MonkeyPatch, store: Store, key: str,
                                   park: bool = False) -> list[str]:
    """Between the job's listing of the slices that found ``key`` and its step, the ticker
    claims the task (and, with ``park``, the flow gate parks it: 'w', in pa). The keys moved."""
    bucket = store.keys.bucket_of(key)
    real_find = JobStore.find
    moved: list[str] = []

    async def find(self: JobStore, b: int, src: Any, *args: Any, **kwargs: Any) -> Any:
        found = await real_find(self, b, src, *args, **kwargs)
        if b == bucket and src.index == "slices" and key in found.keys and not moved:
            _, tasks = await store.claim(bucket, now_ms=START_MS, horizon_ms=START_MS,
                                         limit=10, token="tok")
            if park:
                await store.park(bucket, [(t.key, "tok") for t in tasks])
            moved.extend(t.key for t in tasks)
        return found

    monkeypatch.setattr(JobStore, "find", find)
    return moved


async def test_a_task_claimed_between_the_listing_and_the_step_counts_once(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A purge's listing finds a task in the slices; the ticker claims it before the step.
    The step cancels it where it is now (the lease index), and the job counts it once; before,
    it was skipped there and cancelled again in the lease index: matched 2 for one task."""
    await add(client, "c.0", delay=0)
    job_id = await start(client, "cancel", {"key_prefix": "c."})
    moved = claim_after_the_slices_listing(monkeypatch, store, "c.0")
    assert await runner(store, fake_clock).work_one()
    assert moved == ["c.0"]
    view = await job(client, job_id)
    assert (view["state"], view["matched"], view["done"], view["skipped"]) == ("done", 1, 1, 0)
    assert (await statuses(client, ["c.0"])) == {"c.0": "cancelled"}


async def test_a_task_parked_between_the_listing_and_the_step_counts_once(
        client: httpx.AsyncClient, store: Store, fake_clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel of scheduled tasks walks the slices, then the parked tasks: a task moved from
    one to the other between the slices' listing and their step is not counted there (it is
    not finished), and the parked walk cancels and counts it."""
    await add(client, "p.0", delay=0)
    job_id = await start(client, "cancel", {"key_prefix": "p.", "status": "scheduled"})
    moved = claim_after_the_slices_listing(monkeypatch, store, "p.0", park=True)
    assert await runner(store, fake_clock).work_one()
    assert moved == ["p.0"]
    view = await job(client, job_id)
    assert (view["state"], view["matched"], view["done"], view["skipped"]) == ("done", 1, 1, 0)
    assert (await statuses(client, ["p.0"])) == {"p.0": "cancelled"}
