"""Result callbacks in the scripts (docs/api.md v3, "Result callbacks"): schedule keeps the
URLs beside the record (``r:<key>``), start and view hand them over, and complete creates the
result task ``<key>.on_success`` / ``<key>.on_failure`` in the call that finishes the task,
once, whatever is re-sent. Each test seeds a bucket, runs scripts, and compares the whole
bucket (tests/support/bucket_state.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tests.support.bucket_state import (
    M0,
    NOW,
    RET,
    assert_ttls,
    claim,
    delivering,
    dump,
    rec,
    run,
    seed,
    template,
)
from timewheel.store import Store, layout
from timewheel.store.keys import Keyspace
from timewheel.store.results import ResultCallback

KEPT = 20
OK_URL = "http://127.0.0.1:9/ok"
FAIL_URL = "http://127.0.0.1:9/failed"
RESULTS = f"{OK_URL}\n{FAIL_URL}"
DONE = NOW + 300  # when complete runs


def result(verdict: str = "ok", url: str = OK_URL, body: bytes = b"thanks") -> ResultCallback:
    return ResultCallback(url=url, verdict=verdict,  # type: ignore[arg-type]
                          attempt=1, status_code=200 if verdict == "ok" else 404,
                          scheduled_at_ms=NOW, timeout_ms=10_000,
                          response_headers={"content-type": "text/plain"}, response_body=body)


def outcome(key: str, kind: str, rec_: bytes | str = "", token: str = "tok",
            code: Any = 200) -> list[Any]:
    return [key, token, kind, code, "", "", NOW + 100, json.dumps({"n": 1, "o": kind}), rec_]


def result_record(key: str, verdict: str = "ok", **kw: Any) -> bytes:
    return result(verdict, **kw).task(key, DONE).record()


def stored_result(key: str, verdict: str = "ok", **kw: Any) -> dict[str, Any]:
    """The result task as complete.lua leaves it: scheduled, due now, created now."""
    row = layout.decode(result_record(key, verdict, **kw))
    for length in ("fl", "ul", "hl", "bl", "el"):
        del row[length]
    row["created"] = DONE
    return row


HELD = {"t:a": delivering(attempts=1, started=True), "ls": {"a": NOW + 15_000},
        "cl:tok": ["a"], "cur": str(M0), "r:a": RESULTS}
MINUTE = DONE // 60_000


# -- schedule, start, view -----------------------------------------------------------------------

async def test_schedule_keeps_the_urls_beside_the_record(store: Store, redis: Redis) -> None:
    """ARGV[6] is stored as r:<key> without a TTL; a replace without it drops it; a task
    created without it has none (a task without result callbacks costs nothing more)."""
    assert await run(store, "schedule", "a", "create", NOW, "r1", template(NOW), RESULTS) == 0
    assert await run(store, "schedule", "b", "create", NOW, "r2", template(NOW)) == 0
    state = await dump(redis)
    assert state["r:a"] == RESULTS and "r:b" not in state
    await assert_ttls(redis, {})
    assert await run(store, "schedule", "a", "replace", NOW, "r3", template(NOW)) == 1
    assert "r:a" not in await dump(redis)


async def test_start_and_view_hand_over_the_urls(store: Store, redis: Redis) -> None:
    await seed(redis, {**HELD, "t:b": delivering()})
    assert await run(store, "start", "a", "tok", "b", "tok") == [
        1, b"", b"", RESULTS.encode(), 1, b"", b"", b""]
    reply = await run(store, "view", "", "a", "b")
    assert reply[3::4] == [RESULTS.encode(), b""]
    record = await store.get("a")
    assert record is not None
    assert (record.on_success, record.on_failure) == (OK_URL, FAIL_URL)


# -- complete ------------------------------------------------------------------------------------

async def test_delivered_creates_the_success_task_once(store: Store, redis: Redis) -> None:
    """The success finishes the task and creates a.on_success (scheduled, due now, in now's
    slice, in the parent's bucket); the same call re-sent (redis-py after a lost reply)
    answers STALE and creates nothing more."""
    await seed(redis, HELD)
    args = outcome("a", "ok", result_record("a"))
    assert await run(store, "complete", DONE, RET, KEPT, *args) == [1]
    after = await dump(redis)
    assert after == {
        "t:a": rec("succeeded", finished=DONE, last_code=200, attempts=1, last_at=NOW + 100),
        "fs": {"a": DONE}, "cl:tok": ["a"], "cur": str(M0), "r:a": RESULTS,
        "a:a": [json.dumps({"n": 1, "o": "ok"})],
        "t:a.on_success": stored_result("a"), f"ms:{MINUTE}": {"a.on_success": DONE},
        "mn": {str(MINUTE): MINUTE}}
    await assert_ttls(redis, {"t:a": RET, "a:a": RET, "r:a": RET})
    assert await run(store, "complete", DONE + 1, RET, KEPT, *args) == [0]
    assert await dump(redis) == after
    payload = json.loads(after["t:a.on_success"]["body"])
    assert payload == {
        "key": "a", "outcome": "delivered", "attempt": 1, "status_code": 200,
        "response_headers": {"content-type": "text/plain"}, "response_body": "thanks",
        "response_body_truncated": False, "scheduled_at": "2027-01-15T08:00:00.000Z",
        "finished_at": "2027-01-15T08:00:00.300Z"}
    assert Keyspace("tw").bucket_of("a.on_success") == Keyspace("tw").bucket_of("a")


async def test_failed_creates_the_failure_task(store: Store, redis: Redis) -> None:
    await seed(redis, HELD)
    args = outcome("a", "fail", result_record("a", "fail", url=FAIL_URL), code=404)
    assert await run(store, "complete", DONE, RET, KEPT, *args) == [1]
    after = await dump(redis)
    assert after["t:a"]["st"] == "f" and after["ff"] == {"a": DONE}
    assert after["t:a.on_failure"] == stored_result("a", "fail", url=FAIL_URL)
    assert "t:a.on_success" not in after
    assert json.loads(after["t:a.on_failure"]["body"])["outcome"] == "failed"


async def test_a_delivery_after_a_delete_still_calls_on_success_and_a_failure_nothing(
        store: Store, redis: Redis) -> None:
    """DELETE while the attempt is out, and the receiver answers 2xx: the receiver has the
    callback, so on_success is created (the task stays cancelled); the same call re-sent
    creates nothing more. A failure after a DELETE calls no on_failure: the task was
    cancelled, not failed. (Before, a delivered, cancelled task called nothing: an audit.)"""
    for verdict, code, url, created in (("ok", 200, OK_URL, True),
                                        ("fail", 404, FAIL_URL, False)):
        await redis.flushall()
        await seed(redis, HELD)
        assert await run(store, "cancel", "a", NOW + 50, RET, "del", KEPT) == 1
        args = outcome("a", verdict, result_record("a", verdict, url=url), code=code)
        assert await run(store, "complete", DONE, RET, KEPT, *args) == [2]
        after = await dump(redis)
        assert after["t:a"]["st"] == "c" and after["t:a"]["last_code"] == code
        results = {name for name in after if name.startswith("t:a.on_")}
        assert results == ({"t:a.on_success"} if created else set())
        if created:
            assert after["t:a.on_success"] == stored_result("a")
        assert await run(store, "complete", DONE + 1, RET, KEPT, *args) == [0]
        assert await dump(redis) == after


async def test_a_retry_creates_nothing_and_a_bad_record_is_refused(store: Store,
                                                                   redis: Redis) -> None:
    """A result record goes only with a finishing outcome, and must be whole: the script
    refuses before its first write."""
    await seed(redis, HELD)
    before = await dump(redis)
    for args in (outcome("a", "retry", result_record("a")),
                 outcome("a", "ok", result_record("a")[:-1]),
                 [*outcome("a", "ok"), *outcome("a", "ok", result_record("a")[:90])]):
        with pytest.raises(ResponseError, match="malformed result record"):
            await run(store, "complete", DONE, RET, KEPT, *args)
        assert await dump(redis) == before


async def test_lease_expiry_then_success_creates_one_result(store: Store, redis: Redis) -> None:
    """The process that sent the attempt dies between the answer and complete: nothing is
    recorded, the lease runs out, another claim re-sends it and its complete creates the
    result. The dead process's complete, should it come after all, is STALE."""
    await run(store, "schedule", "a", "create", NOW, "r1", template(NOW), RESULTS)
    assert await claim(store, NOW, token="first") == (False, ["a"])
    assert (await run(store, "start", "a", "first"))[0] == 1
    # ... the receiver answered, and the process died before its complete.
    later = NOW + 10_000 + 5000 + 1  # past the lease (due + timeout + margin)
    assert await claim(store, later, token="second") == (False, ["a"])
    assert (await run(store, "start", "a", "second"))[0] == 2
    assert await run(store, "complete", later + 50, RET, KEPT,
                     *outcome("a", "ok", result_record("a"), token="second")) == [1]
    assert await run(store, "complete", later + 60, RET, KEPT,
                     *outcome("a", "ok", result_record("a"), token="first")) == [0]
    state = await dump(redis)
    assert sorted(k for k in state if k.startswith("t:")) == ["t:a", "t:a.on_success"]
    assert [m for k in state if k.startswith("ms:") for m in state[k]] == ["a.on_success"]


async def test_an_existing_result_task_is_not_created_again(store: Store, redis: Redis) -> None:
    """A replayed task that succeeds again: its first result task stays as it was."""
    first = stored_result("a") | {"st": "o", "finished": NOW}
    await seed(redis, {**HELD, "t:a.on_success": first})
    assert await run(store, "complete", DONE, RET, KEPT,
                     *outcome("a", "ok", result_record("a"))) == [1]
    after = await dump(redis)
    assert after["t:a.on_success"] == first
    assert not any(k.startswith("ms:") for k in after)


async def test_a_result_task_finishing_creates_nothing(store: Store, redis: Redis) -> None:
    """A result task has no result callbacks of its own (r: is never written for it), so its
    failure sends no record and creates no further task."""
    await seed(redis, {"t:a.on_failure": delivering(attempts=5, started=True),
                       "ls": {"a.on_failure": NOW + 15_000}, "cur": str(M0)})
    assert await run(store, "start", "a.on_failure", "tok") == [5, b"", b"", b""]
    assert await run(store, "complete", DONE, RET, KEPT,
                     *outcome("a.on_failure", "fail", code=500)) == [1]
    assert [k for k in await dump(redis) if k.startswith("t:")] == ["t:a.on_failure"]


# -- cancel, replay ------------------------------------------------------------------------------

async def test_cancel_and_replay_carry_the_urls_with_the_record(store: Store,
                                                                redis: Redis) -> None:
    """The URLs expire with a cancelled record and come back to life with a replay."""
    await run(store, "schedule", "a", "create", NOW, "r1", template(NOW), RESULTS)
    assert await run(store, "cancel", "a", NOW + 1, RET, "r2", KEPT) == 1
    await assert_ttls(redis, {"t:a": RET, "r:a": RET})
    assert await run(store, "replay", "a", NOW + 2, "r3") == 1
    await assert_ttls(redis, {})
    assert (await dump(redis))["r:a"] == RESULTS


def test_the_result_task_is_an_ordinary_post() -> None:
    """POST with a JSON body to the URL, the parent's timeout, the defaults of POST /tasks for
    retries, its destination's flow; a body that is not text goes as base64."""
    task = result(body=b"\xff\xfe").task("a", DONE)
    assert (task.key, task.url, task.method, task.due_ms) == ("a.on_success", OK_URL, "POST",
                                                              DONE)
    assert (task.timeout_ms, task.max_attempts, task.backoff_ms) == (10_000, 5, 1000)
    assert task.headers == [("Content-Type", "application/json")]
    assert task.flow == "127.0.0.1:9" and task.on_success is None
    payload = json.loads(task.body or b"")
    assert payload["response_body"] == "//4=" and payload["response_body_base64"] is True
    # Text cut inside a code point stays text, without the unfinished code point.
    cut = ResultCallback(url=OK_URL, verdict="ok", attempt=1, status_code=200,
                         scheduled_at_ms=NOW, timeout_ms=1000,
                         response_body="héllo".encode()[:2], response_body_truncated=True)
    payload = json.loads(cut.payload("a", DONE))
    assert payload["response_body"] == "h" and "response_body_base64" not in payload
