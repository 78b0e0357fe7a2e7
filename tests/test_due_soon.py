"""``Store.due_soon``: every write that makes a task due tells the listener (the process's
ticker, tests/test_ticker.py) its bucket and due time, and a write that makes nothing due
tells it nothing. Real Redis, the Store's own methods."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import START_MS
from timewheel.errors import StoreUnavailable
from timewheel.jobs.sources import sources, start_of, task_filter
from timewheel.models import TaskFields, TaskStatus
from timewheel.operations.prepare import prepare
from timewheel.store import CompleteReply, Outcome, ScheduleReply, Store, batch
from timewheel.store.batch import schedule_many
from timewheel.store.job_store import JobStore, Position
from timewheel.store.record import NewTask
from timewheel.store.replies import JobStepReply
from timewheel.store.results import ResultCallback

URL = "http://127.0.0.1:9/hook"
NOW = START_MS


def task(key: str, due_ms: int, url: str = URL, **fields: object) -> NewTask:
    return prepare(TaskFields(callback_url=url, execute_at=due_ms / 1000, **fields), key, NOW,
                   default_timeout=10.0)


@pytest.fixture
def told(store: Store) -> Iterator[list[tuple[int, int]]]:
    heard: list[tuple[int, int]] = []
    store.due_soon = lambda bucket, due_ms: heard.append((bucket, due_ms))
    yield heard


async def test_creates_replaces_reschedules_and_replays_tell(store: Store,
                                                             told: list[tuple[int, int]]) -> None:
    bucket = store.keys.bucket_of("a")
    assert await store.schedule(task("a", NOW + 500), replace=False, now_ms=NOW) \
        is ScheduleReply.CREATED
    assert await store.schedule(task("a", NOW + 500), replace=False, now_ms=NOW) \
        is ScheduleReply.EXISTS  # nothing new is due
    assert await store.schedule(task("a", NOW + 900, url=f"{URL}/2"), replace=False,
                                now_ms=NOW) is ScheduleReply.CONFLICT
    assert await store.schedule(task("a", NOW + 700), replace=True, now_ms=NOW) \
        is ScheduleReply.REPLACED
    assert told == [(bucket, NOW + 500), (bucket, NOW + 700)]
    del told[:]
    await store.reschedule("a", due_ms=NOW + 300, max_attempts=None, now_ms=NOW)
    await store.reschedule("missing", due_ms=NOW + 300, max_attempts=None, now_ms=NOW)
    await store.cancel("a", now_ms=NOW)
    await store.replay("a", now_ms=NOW + 50)
    assert told == [(bucket, NOW + 300), (bucket, NOW + 50)]


async def test_a_batch_tells_what_it_created(store: Store, told: list[tuple[int, int]]) -> None:
    await store.schedule(task("old", NOW + 100), replace=False, now_ms=NOW)
    del told[:]
    codes = await schedule_many(store, [task("old", NOW + 100), task("new", NOW + 200)], NOW)
    assert codes == [ScheduleReply.EXISTS, ScheduleReply.CREATED]
    assert told == [(store.keys.bucket_of("new"), NOW + 200)]


async def test_a_batch_tells_each_bucket_its_earliest_created_task_once(
        store: Store, told: list[tuple[int, int]]) -> None:
    """The ticker keeps the earliest task a bucket is told of, so one word a call is enough."""
    bucket = store.keys.bucket_of("k0")
    same = [k for k in (f"k{i}" for i in range(1, 200)) if store.keys.bucket_of(k) == bucket][:2]
    other = next(k for k in (f"o{i}" for i in range(200)) if store.keys.bucket_of(k) != bucket)
    await schedule_many(store, [task(same[0], NOW + 900), task("k0", NOW + 400),
                                task(other, NOW + 300), task(same[1], NOW + 600)], NOW)
    assert sorted(told) == sorted([(bucket, NOW + 400),
                                   (store.keys.bucket_of(other), NOW + 300)])


async def test_a_batch_refused_part_way_tells_every_bucket_it_may_have_written(
        store: Store, told: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose calls Redis refuses part-way (it filled up: 503, some buckets stored)
    tells each bucket of the batch its earliest task: which calls went through is not known,
    and a stored task due before the next tick would wait for that tick. Before, the refusal
    skipped every word (an outside audit of a full Redis)."""
    run_calls = batch._run_calls

    async def half_then_refused(store: Store, calls: Any) -> Any:
        await run_calls(store, calls[:len(calls) // 2])
        raise StoreUnavailable("schedule_many: OOM command not allowed when used memory > "
                               "'maxmemory'")

    monkeypatch.setattr(batch, "_run_calls", half_then_refused)
    tasks = [task(f"k{i}", NOW + 100 + i) for i in range(40)]
    with pytest.raises(StoreUnavailable):
        await schedule_many(store, tasks, NOW)
    earliest: dict[int, int] = {}
    for t in tasks:
        bucket = store.keys.bucket_of(t.key)
        earliest[bucket] = min(earliest.get(bucket, t.due_ms), t.due_ms)
    assert sorted(told) == sorted(earliest.items())
    assert await store.get("k0") is not None or await store.get("k39") is not None


async def test_a_recorded_retry_or_result_tells_a_stale_outcome_does_not(
        store: Store, told: list[tuple[int, int]]) -> None:
    """A retry is due at its backoff (which may be under a tick); a finished task's result
    task is due now, in its parent's bucket. An outcome whose claim is gone writes nothing."""
    for key in ("r", "ok"):
        await store.schedule(task(key, NOW, on_success=f"{URL}/done"), replace=False,
                             now_ms=NOW)
    del told[:]
    claimed = {}
    for key in ("r", "ok"):
        bucket = store.keys.bucket_of(key)
        _, tasks = await store.claim(bucket, now_ms=NOW, horizon_ms=NOW + 1000, limit=10,
                                     token=f"tok-{key}")
        claimed.update({t.key: (bucket, t.token) for t in tasks})
    r_bucket, r_token = claimed["r"]
    ok_bucket, ok_token = claimed["ok"]
    result = ResultCallback(url=f"{URL}/done", verdict="ok", attempt=1, status_code=200,
                            scheduled_at_ms=NOW, timeout_ms=10_000)
    replies = await store.complete_many([
        (r_bucket, Outcome("r", r_token, "retry", status_code=500, next_due_ms=NOW + 400,
                           started_ms=NOW)),
        (ok_bucket, Outcome("ok", ok_token, "ok", status_code=200, started_ms=NOW,
                            result=result)),
        (r_bucket, Outcome("r", "not-the-claim", "retry", next_due_ms=NOW + 900)),
    ], now_ms=NOW + 100)
    assert replies == [CompleteReply.RECORDED, CompleteReply.RECORDED, CompleteReply.STALE]
    assert told == [(r_bucket, NOW + 400), (ok_bucket, NOW + 100)]


async def test_a_delivery_after_a_delete_tells_of_its_result_task(
        store: Store, told: list[tuple[int, int]]) -> None:
    """Cancelled while its attempt was out and delivered after all: its on_success task is
    due now, like a finished task's."""
    await store.schedule(task("c", NOW, on_success=f"{URL}/done"), replace=False, now_ms=NOW)
    bucket = store.keys.bucket_of("c")
    _, [claimed] = await store.claim(bucket, now_ms=NOW, horizon_ms=NOW + 1000, limit=10,
                                     token="tok-c")
    assert (await store.start(bucket, claims=[("c", claimed.token)]))[0].attempt == 1
    await store.cancel("c", now_ms=NOW + 10)
    del told[:]
    result = ResultCallback(url=f"{URL}/done", verdict="ok", attempt=1, status_code=200,
                            scheduled_at_ms=NOW, timeout_ms=10_000)
    replies = await store.complete_many([(bucket, Outcome(
        "c", claimed.token, "ok", status_code=200, started_ms=NOW, result=result))],
        now_ms=NOW + 100)
    assert replies == [CompleteReply.CANCELLED_IN_FLIGHT]
    assert told == [(bucket, NOW + 100)]


@pytest.mark.parametrize("kind", ["replay", "cancel"])
async def test_a_bulk_replay_step_tells_a_cancel_step_does_not(
        store: Store, told: list[tuple[int, int]], kind: str) -> None:
    """A bulk replay (POST /tasks/replay) makes what it replays due now, as a single replay
    does; a bulk cancel makes nothing due."""
    await store.schedule(task("j.1", NOW + 60_000), replace=False, now_ms=NOW)
    if kind == "replay":
        await store.cancel("j.1", now_ms=NOW)  # a cancelled task is replayable
    del told[:]
    jobs = JobStore(store)
    await jobs.create("job-1", kind, json.dumps({"key_prefix": "j."}), now_ms=NOW + 10)
    bucket = store.keys.bucket_of("j.1")
    status = TaskStatus.CANCELLED if kind == "replay" else TaskStatus.SCHEDULED
    # the slices, or the cancelled index's pages (its zset from before pages is empty)
    src = next(s for s in sources(kind, status) if s.index in ("slices", "pages:fc"))
    filt = task_filter({"key_prefix": "j."}, NOW + 10)
    found = await jobs.find(bucket, src, start_of(src, kind, NOW + 10), filt, limit=10)
    assert found.keys == ["j.1"]
    start = await jobs.position(bucket, "job-1")

    async def step() -> JobStepReply:
        code, counts = await jobs.step(bucket, "job-1", kind, now_ms=NOW + 20, start=start,
                                       reached=Position(0, ended=True), keys=found.keys,
                                       src=src, task_filter=filt)
        assert counts.done == 1
        return code

    assert await step() is JobStepReply.STEPPED
    assert told == ([(bucket, NOW + 20)] if kind == "replay" else [])
    if kind == "replay":  # due when it was told
        record = await store.get("j.1")
        assert record is not None and record.due_ms == NOW + 20
    del told[:]
    assert await step() is JobStepReply.STALE  # taken already (another runner): nothing new
    assert told == []
