"""lua/reschedule.lua on its own (PATCH /tasks/{key}): seed raw state, run it once, assert the
whole bucket afterwards. The request stays; only the time (and max_attempts) moves."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from tests.support.bucket_state import (
    FLOW,
    M0,
    MIN,
    NOW,
    RET,
    P,
    assert_ttls,
    claim,
    delivering,
    dump,
    minutes,
    rec,
    run,
    seed,
)
from timewheel.store import Store, layout

# The standard record with a request that must survive the move.
REQUEST = {"headers": "X-Order:42\nContent-Type:application/json", "body": '{"a":1}',
           "timeout": 3000, "backoff": 2000, "created": NOW - 7}


async def reschedule(store: Store, key: str, due: int, max_attempts: int | str = "",
                     now: int = NOW, req: str = "r1") -> int:
    return int(await run(store, "reschedule", key, now, req, due, max_attempts))


async def test_a_scheduled_task_moves_to_the_new_minute_keeping_its_request(
        store: Store, redis: Redis) -> None:
    old, new = NOW + 61_000, NOW + 3 * MIN + 7
    await seed(redis, {"t:a": rec(due=old, **REQUEST), f"ms:{M0 + 1}": {"a": old},
                       **minutes(M0 + 1), "cur": str(M0), f"md:{M0 + 3}": {"a", "z"}})
    assert await reschedule(store, "a", new, now=NOW + 1000) == 1
    assert await dump(redis) == {
        "t:a": rec(due=new, op="r1", **REQUEST), f"ms:{M0 + 1}": {"a": old},
        f"md:{M0 + 1}": {"a"}, f"ms:{M0 + 3}": {"a": new}, f"md:{M0 + 3}": {"z"},
        **minutes(M0 + 1, M0 + 3), "cur": str(M0)}
    await assert_ttls(redis, {})


async def test_within_its_own_minute_the_entry_is_only_rescored(store: Store,
                                                                redis: Redis) -> None:
    await seed(redis, {"t:a": rec(due=NOW + 50_000), f"ms:{M0}": {"a": NOW + 50_000},
                       **minutes(M0), "cur": str(M0)})
    assert await reschedule(store, "a", NOW + 10_000, max_attempts=9) == 1
    assert await dump(redis) == {"t:a": rec(due=NOW + 10_000, max=9, op="r1"),
                                 f"ms:{M0}": {"a": NOW + 10_000}, **minutes(M0),
                                 "cur": str(M0)}


async def test_a_past_time_lands_in_the_cursor_slice(store: Store, redis: Redis) -> None:
    """As with POST: a time before the cursor fires as soon as possible, never dropped."""
    due = NOW + 10 * MIN
    await seed(redis, {"t:a": rec(due=due), f"ms:{M0 + 10}": {"a": due}, **minutes(M0 + 10),
                       "cur": str(M0)})
    assert await reschedule(store, "a", NOW - 5 * MIN) == 1
    assert await dump(redis) == {
        "t:a": rec(due=NOW - 5 * MIN, op="r1"), f"ms:{M0 + 10}": {"a": due},
        f"md:{M0 + 10}": {"a"}, f"ms:{M0}": {"a": NOW - 5 * MIN}, **minutes(M0, M0 + 10),
        "cur": str(M0)}


async def test_a_retrying_task_keeps_its_attempts_and_last_outcome(store: Store,
                                                                   redis: Redis) -> None:
    due = NOW + 2 * MIN
    last = {"attempts": 2, "last_at": NOW - 900, "last_code": 503, "last_err": "HTTP 503"}
    await seed(redis, {"t:a": rec("retrying", due=due, exec=NOW - 9000, **last, **REQUEST),
                       f"ms:{M0 + 2}": {"a": due}, **minutes(M0 + 2), "cur": str(M0)})
    assert await reschedule(store, "a", NOW + 30 * MIN, max_attempts=3) == 1
    assert await dump(redis) == {
        "t:a": rec("retrying", due=NOW + 30 * MIN, max=3, op="r1", **last, **REQUEST),
        f"ms:{M0 + 2}": {"a": due}, f"md:{M0 + 2}": {"a"},
        f"ms:{M0 + 30}": {"a": NOW + 30 * MIN}, **minutes(M0 + 2, M0 + 30), "cur": str(M0)}


async def test_a_parked_task_leaves_its_flow_for_the_new_slice(store: Store,
                                                               redis: Redis) -> None:
    """Parked for its flow (lua/park.lua): out of pw, pa and pf (the flow's other parked task
    keeps the flow indexed at its own due time), into the slice, status from its attempts."""
    await seed(redis, {"t:a": rec("waiting", due=NOW - 5, attempts=1),
                       "t:b": rec("waiting", due=NOW - 2),
                       f"pw:{FLOW}": {"a": NOW - 5, "b": NOW - 2},
                       "pa": {"a": NOW - 5, "b": NOW - 2}, "pf": {FLOW: NOW - 5},
                       "cur": str(M0)})
    assert await reschedule(store, "a", NOW + MIN) == 1
    assert await dump(redis) == {
        "t:a": rec("retrying", due=NOW + MIN, attempts=1, op="r1"),
        "t:b": rec("waiting", due=NOW - 2), f"pw:{FLOW}": {"b": NOW - 2}, "pa": {"b": NOW - 2},
        "pf": {FLOW: NOW - 2}, f"ms:{M0 + 1}": {"a": NOW + MIN}, **minutes(M0 + 1),
        "cur": str(M0)}


async def test_a_claimed_task_not_started_loses_its_claim_as_with_put(
        store: Store, redis: Redis) -> None:
    """Lease and claim dropped: the holder's start finds no claim, so nothing is sent."""
    await seed(redis, {"t:a": delivering(**REQUEST), "ls": {"a": NOW + 15_000, "b": NOW + 9},
                       "cl:tok": ["a"], "cur": str(M0)})
    assert await reschedule(store, "a", NOW + 2 * MIN) == 1
    assert await dump(redis) == {
        "t:a": rec("scheduled", due=NOW + 2 * MIN, op="r1", **REQUEST),
        "ls": {"b": NOW + 9}, f"ms:{M0 + 2}": {"a": NOW + 2 * MIN}, **minutes(M0 + 2),
        "cl:tok": ["a"], "cur": str(M0)}
    assert await run(store, "start", "a", "tok") == [0, b"", b"", b""]


def entry(outcome: str, code: int, n: int = 1) -> str:
    return f'{{"n":{n},"s":{NOW + 1},"o":"{outcome}","c":{code}}}'


async def history(redis: Redis) -> list[dict[str, object]]:
    """Task a's history entries, parsed (an amended one is re-encoded: its key order goes)."""
    return [json.loads(raw) for raw in await redis.lrange(P + "a:a", 0, -1)]


async def in_flight(redis: Redis, attempts: int = 1, **extra: object) -> None:
    """Task a, its attempt started (counted) and out, leased to token "tok"."""
    await seed(redis, {"t:a": delivering(started=True, attempts=attempts, **REQUEST, **extra),
                       "ls": {"a": NOW + 15_000}, "cl:tok": ["a"], "cur": str(M0)})


async def complete(store: Store, outcome: str, code: int, due: int | str = "",
                   n: int = 1) -> list[int]:
    result: list[int] = await run(store, "complete", NOW + 5, RET, 5, "a", "tok", outcome, code,
                                  "" if outcome == "ok" else f"HTTP {code}", due, NOW + 1,
                                  entry({"ok": "delivered", "retry": "retry", "fail": "failed",
                                         "spent": "failed"}[outcome], code, n), "")
    return result


async def test_a_started_attempt_keeps_its_claim_and_a_retry_answer_leaves_the_new_time(
        store: Store, redis: Redis) -> None:
    """PATCH while the attempt is out: the lease goes, the claim stays for its answer. A retry
    answer (503) goes into the history and the last status, and the task stays at the
    PATCH's time, not the backoff's; before, the answer was dropped as stale and the history
    had no entry for an attempt the receiver got."""
    await in_flight(redis)
    assert await reschedule(store, "a", NOW + 2 * MIN) == 1
    moved = rec("retrying", due=NOW + 2 * MIN, attempts=1, op="r1", claim="tok", started=True,
                **REQUEST)
    assert await dump(redis) == {"t:a": moved, f"ms:{M0 + 2}": {"a": NOW + 2 * MIN},
                                 **minutes(M0 + 2), "cl:tok": ["a"], "cur": str(M0),
                                 "ls": {"a": NOW + 15_000}}  # the lease of the attempt out
    assert await complete(store, "retry", 503, due=NOW + 1000) == [3]
    state = await dump(redis)
    assert state["t:a"] == rec("retrying", due=NOW + 2 * MIN, attempts=1, op="r1",
                               last_at=NOW + 1, last_code=503, last_err="HTTP 503", **REQUEST)
    # Its next attempt is the PATCH's, not the backoff's (an outside audit found it there).
    assert await history(redis) == [{**json.loads(entry("retry", 503)), "na": NOW + 2 * MIN}]
    assert await redis.pttl(P + "a:a") == -1  # pending: the history does not expire
    assert state[f"ms:{M0 + 2}"] == {"a": NOW + 2 * MIN}
    assert "ls" not in state


async def test_a_patch_to_before_the_lease_ends_is_due_when_it_ends(
        store: Store, redis: Redis) -> None:
    """PATCH to now while an attempt is out: the task is due when that attempt's lease ends
    (its answer has come by then, or it is lost), so two attempts are never out at once; its
    execute_at is the time asked for."""
    await in_flight(redis)
    assert await reschedule(store, "a", NOW + 1) == 1
    state = await dump(redis)
    assert (state["t:a"]["due"], state["t:a"]["exec"]) == (NOW + 15_000, NOW + 1)
    assert state["ls"] == {"a": NOW + 15_000}
    assert (await claim(store, NOW + 14_999))[1] == []
    assert await complete(store, "retry", 503, due=NOW + 1000) == [3]
    assert (await claim(store, NOW + 15_000, token="tok2"))[1] == ["a"]


@pytest.mark.parametrize(("outcome", "code", "status"), [("ok", 200, "succeeded"),
                                                         ("fail", 404, "failed")])
async def test_a_final_answer_of_an_attempt_moved_in_flight_finishes_the_task(
        store: Store, redis: Redis, outcome: str, code: int, status: str) -> None:
    """The receiver answered the attempt that was out: delivered, or failed with the task's
    attempts used up, decides the task, which is not sent again at the PATCH's time; its slice
    entry is left for the claimer, as a cancel's is."""
    await in_flight(redis, max=1)
    assert await reschedule(store, "a", NOW + 2 * MIN) == 1
    assert await complete(store, outcome, code) == [1]
    state = await dump(redis)
    assert state["t:a"]["st"] == layout.STATUS_CODES[status]
    assert state["t:a"]["claim"] == layout.NONE and state["t:a"]["att"] == 1
    assert state[f"md:{M0 + 2}"] == {"a"}
    assert "ls" not in state
    assert (await claim(store, NOW + 2 * MIN))[1] == []


async def test_a_failure_judged_against_the_max_a_patch_raised_leaves_the_task_moved(
        store: Store, redis: Redis) -> None:
    """max_attempts 2, attempt 2 out; a PATCH raises it to 5: the executor, which read 2,
    answers failed for good, but the task has attempts left and stays at the PATCH's time."""
    await in_flight(redis, attempts=2, max=2)
    assert await reschedule(store, "a", NOW + 2 * MIN, max_attempts=5) == 1
    assert await complete(store, "spent", 503, n=2) == [3]
    state = await dump(redis)
    assert (state["t:a"]["st"], state["t:a"]["max"], state["t:a"]["due"]) == (
        "r", 5, NOW + 2 * MIN)
    # Tried again, at the PATCH's time: in the history a retry, not a failure.
    assert await history(redis) == [{**json.loads(entry("retry", 503, n=2)),
                                      "na": NOW + 2 * MIN}]
    assert (await claim(store, NOW + 2 * MIN, token="tok2"))[1] == ["a"]


async def test_the_last_attempt_moved_in_flight_is_not_followed_by_one_more(
        store: Store, redis: Redis) -> None:
    """max_attempts 2, attempt 2 out, PATCH without a new max: its answer, failed for good,
    fails the task; before, the task stayed pending and its next start was attempt 3."""
    await in_flight(redis, attempts=2, max=2)
    assert await reschedule(store, "a", NOW + 2 * MIN) == 1
    assert await complete(store, "spent", 503, n=2) == [1]
    assert (await dump(redis))["t:a"]["st"] == "f"
    assert (await claim(store, NOW + 2 * MIN))[1] == []


async def test_a_never_retried_answer_after_a_patch_fails_the_task(
        store: Store, redis: Redis) -> None:
    """(A second review's case.) Attempts left, and a PATCH while the attempt is out: its 404,
    an answer that is never retried, fails the task at once, as the contract says; the task
    stayed pending at the PATCH's time, since the script could not tell a 404 from a failure
    judged spent under an older max_attempts (now "spent")."""
    await in_flight(redis, attempts=1, max=5)
    assert await reschedule(store, "a", NOW + 2 * MIN) == 1
    assert await complete(store, "fail", 404) == [1]
    assert (await dump(redis))["t:a"]["st"] == "f"
    assert (await claim(store, NOW + 2 * MIN))[1] == []


async def test_an_answer_for_a_task_gone_meanwhile_is_stale(store: Store, redis: Redis) -> None:
    """Every kind of answer for a task that no longer exists (deleted, expired): nothing to
    write, and the rest of the call goes on (a script error would fail the whole batch)."""
    for outcome, code in [("ok", 200), ("fail", 404), ("retry", 503)]:
        assert await complete(store, outcome, code, due=NOW + 1000) == [0]


async def test_a_second_patch_keeps_the_claim_of_the_attempt_still_out(
        store: Store, redis: Redis) -> None:
    await in_flight(redis)
    assert await reschedule(store, "a", NOW + 2 * MIN, req="r1") == 1
    assert await reschedule(store, "a", NOW + 3 * MIN, req="r2") == 1
    assert await complete(store, "retry", 503, due=NOW + 1000) == [3]
    assert await history(redis) == [{**json.loads(entry("retry", 503)), "na": NOW + 3 * MIN}]
    assert (await dump(redis))["t:a"]["due"] == NOW + 3 * MIN


async def test_a_delete_after_a_patch_keeps_the_claim_for_the_answer(
        store: Store, redis: Redis) -> None:
    await in_flight(redis)
    assert await reschedule(store, "a", NOW + 2 * MIN) == 1
    assert int(await run(store, "cancel", "a", NOW + 2, RET, "c1", 5)) == 1
    assert await complete(store, "ok", 200) == [2]
    assert await redis.lrange(P + "a:a", 0, -1) == [entry("delivered", 200).encode()]
    assert (await dump(redis))["t:a"]["st"] == "c"


@pytest.mark.parametrize("giving_up", ["release", "park"])
async def test_a_started_attempt_not_sent_after_all_leaves_the_count(
        store: Store, redis: Redis, giving_up: str) -> None:
    """PATCH after the start (twice here), then the holder does not send: it hands the claim
    back (its start deadline passed) or parks it (a rated flow's attempt that asked again).
    The attempt leaves the count, the claim and lease go, the task stays moved; once."""
    await in_flight(redis)
    assert await reschedule(store, "a", NOW + 2 * MIN, req="r1") == 1
    assert await reschedule(store, "a", NOW + 3 * MIN, req="r2") == 1
    reply = await run(store, giving_up, 5, "a", "tok")  # both take `kept` first
    assert reply[0] == (3 if giving_up == "release" else 0)
    state = await dump(redis)
    assert state["t:a"] == rec("scheduled", due=NOW + 3 * MIN, op="r2", **REQUEST)
    assert state[f"ms:{M0 + 3}"] == {"a": NOW + 3 * MIN}
    assert (await run(store, giving_up, 5, "a", "tok"))[0] == 0  # once
    assert (await dump(redis))["t:a"]["att"] == 0


async def test_a_repeat_by_a_client_retry_answers_the_same_and_writes_nothing(
        store: Store, redis: Redis) -> None:
    await seed(redis, {"t:a": rec(due=NOW + MIN), f"ms:{M0 + 1}": {"a": NOW + MIN},
                       **minutes(M0 + 1), "cur": str(M0)})
    assert await reschedule(store, "a", NOW + 5 * MIN) == 1
    state = await dump(redis)
    assert await reschedule(store, "a", NOW + 5 * MIN) == 1
    assert await dump(redis) == state


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
async def test_finished_missing_and_too_few_attempts_are_refused_without_writes(
        store: Store, redis: Redis, status: str) -> None:
    await seed(redis, {"t:f": rec(status, finished=NOW - 1),
                       "t:r": rec("retrying", due=NOW + MIN, attempts=2),
                       f"ms:{M0 + 1}": {"r": NOW + MIN}, **minutes(M0 + 1), "cur": str(M0)})
    await redis.pexpire(P + "t:f", RET)
    before = await dump(redis)
    assert await reschedule(store, "f", NOW + MIN) == -2
    assert await reschedule(store, "nope", NOW + MIN) == -1
    assert await reschedule(store, "r", NOW + 2 * MIN, max_attempts=2) == -3
    assert await dump(redis) == before
    await assert_ttls(redis, {"t:f": RET})
    # The control: the same task with one attempt more allowed moves.
    assert await reschedule(store, "r", NOW + 2 * MIN, max_attempts=3) == 1


async def test_a_patch_past_year_5138_keeps_its_next_attempt_to_the_millisecond(
        store: Store, redis: Redis) -> None:
    """A PATCH to 9999-12-31T23:59:59.999Z (253402300799999 ms: 15 digits, which execute_at
    accepts and the head holds) while the attempt is out, then a 503: the amended entry's
    next_attempt_at is the task's due time, an integer. Redis's cjson writes numbers with 14
    significant digits: it was 2.534023008e+14, a float a millisecond later, in year 10000,
    which GET /tasks/{key}/attempts cannot format. (Out of the API's reach while
    TIMEWHEEL_MAX_HORIZON_SECONDS is at most 100 years: 13 digits until 2286.)"""
    far = 253_402_300_799_999
    await in_flight(redis)
    assert await reschedule(store, "a", far) == 1
    assert await complete(store, "retry", 503, due=NOW + 1000) == [3]
    assert (await dump(redis))["t:a"]["due"] == far
    [stored] = await history(redis)
    assert stored["na"] == far and isinstance(stored["na"], int), stored
