"""The flow-control scripts on their own (permits, park, unpark), and what flows change in the
task scripts (replace and cancel of a parked task, a re-sent replace). Seed raw state, run
once, assert the whole resulting state, as tests/test_scripts.py does."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from tests.support.bucket_state import (
    FLOW,
    M0,
    MIN,
    NOW,
    RET,
    cancelled,
    claim,
    delivering,
    dump,
    minutes,
    rec,
    run,
    schedule,
    seed,
)
from tests.support.lost_reply import first_reply_lost
from timewheel.store import Store
from timewheel.store.flow_store import RATE_SLACK_MS, FlowStore
from timewheel.store.keys import INDEX_KEEPER, INDEX_KEEPER_SCORE

F = "{tw:f:" + FLOW + "}:"
SLACK = RATE_SLACK_MS
KEPT = 20  # attempts kept per task (park takes it, as release does)


async def permits(store: Store, now: int, release: list[str], want: list[str],
                  lease: int = 15_000, default_p: int = 100, unused: tuple[str, ...] = ()
                  ) -> list[int]:
    pairs = [part for permit in want for part in (permit, now)]
    reply = await store.scripts.permits(keys=[F], args=[now, default_p, lease, SLACK,
                                                        len(release), *release, len(unused),
                                                        *unused, *pairs])
    return [int(x) for x in reply][:4]


async def flow_state(redis: Redis) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("held", "starts"):
        rows = await redis.zrange(F + name, 0, -1, withscores=True)
        entries = {m.decode(): int(s) for m, s in rows if m != INDEX_KEEPER.encode()}
        if entries:
            out[name] = entries  # the keeper left out (tested on its own below)
    cfg = await redis.hgetall(F + "cfg")
    if cfg:
        out["cfg"] = {k.decode(): v.decode() for k, v in cfg.items()}
    return out


# -- permits -----------------------------------------------------------------------------------

async def test_permits_grant_up_to_parallelism_in_order(store: Store, redis: Redis) -> None:
    """The first ids get permits until the parallelism is reached; the rest must wait."""
    await redis.hset(F + "cfg", "p", 2)
    assert await permits(store, NOW, [], ["a", "b", "c"]) == [2, -1, 2, 0]
    assert await flow_state(redis) == {"held": {"a": NOW + 15_000, "b": NOW + 15_000},
                                       "cfg": {"p": "2"}}


async def test_permits_default_parallelism(store: Store, redis: Redis) -> None:
    """A flow with no limits set gets the default parallelism (the caller's setting)."""
    assert await permits(store, NOW, [], ["a", "b", "c"], default_p=1) == [1, -1, 1, 0]


async def test_permits_release_then_take_atomically(store: Store, redis: Redis) -> None:
    """Given back in the same call, a permit is free for the ids asked for."""
    await redis.hset(F + "cfg", "p", 1)
    await redis.zadd(F + "held", {"a": NOW + 9000})
    assert await permits(store, NOW + 5, ["a"], ["b"]) == [1, -1, 1, 0]
    assert (await flow_state(redis))["held"] == {"b": NOW + 5 + 15_000}


async def test_permits_expired_holder_gives_its_permit_back(store: Store, redis: Redis) -> None:
    """A permit whose lease ran out (its process died) is free again."""
    await redis.hset(F + "cfg", "p", 1)
    await redis.zadd(F + "held", {"dead": NOW - 1})
    assert await permits(store, NOW, [], ["b"]) == [1, -1, 1, 0]
    assert (await flow_state(redis))["held"] == {"b": NOW + 15_000}


async def test_permits_resent_call_answers_the_same(store: Store, redis: Redis) -> None:
    """An id already holding a permit counts as granted: a re-sent call neither takes a
    second permit nor reports fewer."""
    await redis.hset(F + "cfg", "p", 2)
    assert await permits(store, NOW, [], ["a", "b", "c"]) == [2, -1, 2, 0]
    assert await permits(store, NOW + 1, [], ["a", "b", "c"]) == [2, -1, 2, 0]
    assert set((await flow_state(redis))["held"]) == {"a", "b"}


async def test_permits_many_at_once_and_an_id_wanted_twice(store: Store, redis: Redis) -> None:
    """A burst's call: 2,500 permits given back and 2,600 wanted (more than one piece of the
    script's ZREM and ZADD, 1,000 values each), one id wanted twice and held once."""
    await redis.hset(F + "cfg", "p", 3000)
    old = [f"old-{i}" for i in range(2500)]
    await redis.zadd(F + "held", {**dict.fromkeys(old, NOW + 9000), "kept": NOW + 9000})
    want = [f"new-{i}" for i in range(2600)]
    assert await permits(store, NOW, old, [*want[:1300], want[0], *want[1300:]]) == [
        2601, 0, 2601, 399]
    held = (await flow_state(redis))["held"]
    assert held == {"kept": NOW + 9000, **dict.fromkeys(want, NOW + 15_000)}


async def test_the_held_permits_are_a_skiplist_and_counts_leave_its_keeper_out(
        store: Store, redis: Redis) -> None:
    """The permits held go into a skiplist (with the keeper, lua/lib/record.lua INDEX_KEEPER:
    a flow's few dozen permits would otherwise be a listpack, scanned on every permit); the
    script's count and GET /flows' in-flight count leave the keeper out, and the key still
    expires with the last lease."""
    await redis.hset(F + "cfg", "p", 2)
    assert await permits(store, NOW, [], ["a"], lease=3000) == [1, 0, 1, 1]
    assert await redis.zscore(F + "held", INDEX_KEEPER) == INDEX_KEEPER_SCORE
    assert (await redis.object("encoding", F + "held")).decode() == "skiplist"
    assert await permits(store, NOW + 1, ["a"], ["b", "c"], lease=3000) == [2, -1, 2, 0]
    assert await FlowStore(redis, store.keys, store.scripts, default_parallelism=100).in_flight(
        FLOW, now_ms=NOW + 1) == 2
    assert await permits(store, NOW + 2, ["b", "c"], []) == [0, 0, 0, 2]
    assert await FlowStore(redis, store.keys, store.scripts, default_parallelism=100).in_flight(
        FLOW, now_ms=NOW + 2) == 0
    assert 0 < await redis.pttl(F + "held") <= 3000


async def test_permits_rate_sliding_window(store: Store, redis: Redis) -> None:
    """rate 2: two logged starts in any window of 1000 ms and the slack; the wait says when
    the oldest leaves."""
    await redis.hset(F + "cfg", "r", "2")
    assert await permits(store, NOW, [], ["a", "b", "c"]) == [2, 1000 + SLACK, 2, 0]
    assert (await flow_state(redis))["starts"] == {"a": NOW, "b": NOW}
    # Giving permits back does not give back rate: the starts happened.
    assert await permits(store, NOW + 999 + SLACK, ["a", "b"], ["c"]) == [0, 1, 0, 0]
    assert await permits(store, NOW + 1000 + SLACK, [], ["c"]) == [1, 0, 1, 1]
    assert (await flow_state(redis))["starts"] == {"c": NOW + 1000 + SLACK}


async def test_permits_rate_holds_for_starts_that_drift_within_the_slack(
        store: Store, redis: Redis) -> None:
    """rate 10: an attempt starts up to the slack after its logged start. Logged starts one
    window apart let an early one that went out late and a later one that went out on time
    reach the receiver 11 within a second (an audit counted 11 in 999 ms); the log keeps them a
    window and the slack apart, so the real starts are a window apart at least."""
    await redis.hset(F + "cfg", "r", "10")
    ids = [f"p{i}" for i in range(11)]
    assert (await permits(store, NOW, [], ids))[:2] == [10, 1000 + SLACK]
    # The first ten went out SLACK late (NOW + SLACK); the eleventh, on time, would start
    # 1000 ms after them only if logged at NOW + 1000 + SLACK at the earliest.
    assert await permits(store, NOW + 1000, ids[:10], ids[10:]) == [0, SLACK, 0, 0]
    # The log expires when its newest start leaves the window: SLACK ms after that call by the
    # script's clock, but in Redis's own time, which this test's fixed clock does not follow (a
    # loaded CI run took longer than that between two calls, and the log was gone). So the log
    # that call left is written again, without a TTL, in one transaction.
    async with redis.pipeline(transaction=True) as pipe:
        pipe.zadd(F + "starts", dict.fromkeys(ids[:10], NOW))
        pipe.persist(F + "starts")
        await pipe.execute()
    assert await permits(store, NOW + 999 + SLACK, [], ids[10:]) == [0, 1, 0, 0]
    assert (await permits(store, NOW + 1000 + SLACK, [], ids[10:]))[0] == 1


async def test_permits_given_back_unused_give_their_starts_back(
        store: Store, redis: Redis) -> None:
    """rate 2: two permits logged for NOW + 50 (parked tasks to take back) and given back
    unused at NOW + 10 never started anything: their starts leave the log, and two more may
    start at once. Control: the same two given back as sent keep their starts."""
    await redis.hset(F + "cfg", "r", "2")
    for name, sent in (("unused", False), ("control", True)):
        await redis.delete(F + "held", F + "starts")
        reply = await store.scripts.permits(keys=[F], args=[NOW, 100, 15_000, SLACK, 0, 0,
                                                            "a", NOW + 50, "b", NOW + 50])
        assert [int(x) for x in reply][:4] == [2, 1050 + SLACK, 2, 0], name
        if sent:
            got = await permits(store, NOW + 10, ["a", "b"], ["c", "d"])
            assert got == [0, 1040 + SLACK, 0, 0], name
            assert (await flow_state(redis))["starts"] == {"a": NOW + 50, "b": NOW + 50}
        else:
            got = await permits(store, NOW + 10, [], ["c", "d"], unused=("a", "b"))
            assert got == [2, 1000 + SLACK, 2, 0], name
            assert (await flow_state(redis))["starts"] == {"c": NOW + 10, "d": NOW + 10}


async def test_permits_rate_below_one(store: Store, redis: Redis) -> None:
    """rate 0.5: one start every two seconds (and the slack)."""
    await redis.hset(F + "cfg", "r", "0.5")
    assert await permits(store, NOW, [], ["a", "b"]) == [1, 2000 + SLACK, 1, 0]
    assert await permits(store, NOW + 1999 + SLACK, ["a"], ["b"]) == [0, 1, 0, 0]
    assert await permits(store, NOW + 2000 + SLACK, [], ["b"]) == [1, 2000 + SLACK, 1, 0]


async def test_permits_keys_expire_with_the_last_lease(store: Store, redis: Redis) -> None:
    """held lives as long as its longest lease; a shorter lease later does not shorten it."""
    await redis.hset(F + "cfg", "r", "5")
    await permits(store, NOW, [], ["a"], lease=20_000)
    await permits(store, NOW, [], ["b"], lease=3_000)
    assert 19_000 < await redis.pttl(F + "held") <= 20_000
    assert 0 < await redis.pttl(F + "starts") <= 1000 + SLACK
    assert await redis.pttl(F + "cfg") == -1


async def test_permits_room(store: Store, redis: Redis) -> None:
    """room: what a further call could take now, the smaller of parallelism and rate room;
    a call that asks for nothing still says how long a full flow waits."""
    await redis.hset(F + "cfg", mapping={"p": 5, "r": 3})
    assert await permits(store, NOW, [], ["a"]) == [1, 0, 1, 2]
    assert await permits(store, NOW + 10, [], ["b", "c"]) == [2, 990 + SLACK, 3, 0]
    assert await permits(store, NOW + 20, [], []) == [0, 980 + SLACK, 3, 0]


# -- park and unpark ---------------------------------------------------------------------------

async def test_park_sets_a_claimed_task_aside(store: Store, redis: Redis) -> None:
    """No lease, no claim, status waiting, in the flow's parked zset, the flows index and the
    bucket's parked index."""
    await seed(redis, {"t:a": delivering(due=NOW - 5), "t:b": delivering(due=NOW - 9),
                       "ls": {"a": NOW + 15_000, "b": NOW + 15_000}, "cur": str(M0)})
    assert await run(store, "park", KEPT, "a", "tok", "b", "other") == [1, 0]
    assert await dump(redis) == {
        "t:a": rec("waiting", due=NOW - 5), "t:b": delivering(due=NOW - 9),
        "ls": {"b": NOW + 15_000}, f"pw:{FLOW}": {"a": NOW - 5}, "pf": {FLOW: NOW - 5},
        "pa": {"a": NOW - 5}, "cur": str(M0)}


async def test_park_uncounts_a_started_attempt_it_did_not_send(store: Store,
                                                               redis: Redis) -> None:
    """A rated flow's attempt that asked again after its start (too late for its logged
    start) and was then parked was never sent: its count goes back."""
    await seed(redis, {"t:a": delivering(started=True, attempts=2, due=NOW),
                       "ls": {"a": NOW + 9}, "cur": str(M0)})
    assert await run(store, "park", KEPT, "a", "tok") == [1]
    assert await dump(redis) == {
        "t:a": rec("waiting", attempts=1), f"pw:{FLOW}": {"a": NOW}, "pf": {FLOW: NOW},
        "pa": {"a": NOW}, "cur": str(M0)}


async def test_unpark_claims_the_earliest(store: Store, redis: Redis) -> None:
    """The earliest parked tasks, claimed under the token with a lease; the index follows."""
    parked = {"a": NOW - 5, "b": NOW - 9, "c": NOW - 1}
    await seed(redis, {"t:a": rec("waiting", due=NOW - 5), "t:b": rec("waiting", due=NOW - 9),
                       "t:c": rec("waiting", due=NOW - 1), f"pw:{FLOW}": parked,
                       "pa": {**parked, "other": NOW}, "pf": {FLOW: NOW - 9},
                       "cur": str(M0)})
    more, tasks = await store.unpark(3, FLOW, limit=2, token="u1", now_ms=NOW)
    assert more and [t.key for t in tasks] == ["b", "a"]
    assert all(t.flow == FLOW and t.token == "u1" for t in tasks)
    lease = NOW + 10_000 + 5000
    assert await dump(redis) == {
        "t:a": delivering("u1", due=NOW - 5), "t:b": delivering("u1", due=NOW - 9),
        "t:c": rec("waiting", due=NOW - 1), f"pw:{FLOW}": {"c": NOW - 1},
        "pf": {FLOW: NOW - 1}, "pa": {"c": NOW - 1, "other": NOW},
        "ls": {"a": lease, "b": lease}, "cl:u1": ["b", "a"], "cur": str(M0)}
    # A re-sent call (its reply lost) returns the same tasks and takes no others.
    again = await store.unpark(3, FLOW, limit=2, token="u1", now_ms=NOW)
    assert [t.key for t in again[1]] == ["b", "a"]
    # The last one empties the flow's entry in the index.
    more, tasks = await store.unpark(3, FLOW, limit=5, token="u2", now_ms=NOW)
    assert not more and [t.key for t in tasks] == ["c"]
    state = await dump(redis)
    assert "pf" not in state and f"pw:{FLOW}" not in state and state["pa"] == {"other": NOW}



async def test_an_unpark_whose_reply_was_lost_is_sent_again_as_it_was(
        store: Store, redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unpark ran in Redis but its reply timed out: the same call (token, now) is sent
    again and its tasks come back to the caller, not left leased to nobody until their lease
    runs out (the single-Redis client re-sends no other timed-out command)."""
    await seed(redis, {"t:a": rec("waiting", due=NOW - 5), f"pw:{FLOW}": {"a": NOW - 5},
                       "pa": {"a": NOW - 5}, "pf": {FLOW: NOW - 5}, "cur": str(M0)})
    lost, sent = first_reply_lost(store.scripts.unpark)
    monkeypatch.setattr(store.scripts, "unpark", lost)
    more, tasks = await store.unpark(3, FLOW, limit=2, token="u1", now_ms=NOW)
    assert (more, [t.key for t in tasks]) == (False, ["a"])
    assert len(sent) == 2 and sent[1] == sent[0]


async def test_unpark_drops_entries_of_tasks_no_longer_waiting(store: Store,
                                                               redis: Redis) -> None:
    await seed(redis, {"t:a": rec("cancelled", due=NOW - 5), f"pw:{FLOW}": {"a": NOW - 5},
                       "pf": {FLOW: NOW - 5}})
    assert await store.unpark(3, FLOW, limit=2, token="u1", now_ms=NOW) == (False, [])
    assert await dump(redis) == {"t:a": rec("cancelled", due=NOW - 5)}


# -- the task scripts and parked tasks --------------------------------------------------------

async def test_cancel_parked(store: Store, redis: Redis) -> None:
    await seed(redis, {"t:a": rec("waiting", due=NOW - 5), f"pw:{FLOW}": {"a": NOW - 5, "b": 1},
                       "pa": {"a": NOW - 5, "b": 1}, "pf": {FLOW: 1}})
    assert await run(store, "cancel", "a", NOW, RET, "r1") == 1
    assert await dump(redis) == {
        "t:a": rec("cancelled", due=NOW - 5, finished=NOW, op="r1"), f"pw:{FLOW}": {"b": 1},
        "pa": {"b": 1}, "pf": {FLOW: 1}, **cancelled({"a": NOW})}


async def test_cancel_parked_keeps_the_flows_index_exact(store: Store, redis: Redis) -> None:
    """pf follows the flow's earliest parked task, and loses the flow with its last one: a
    stale entry would have every process ask for permits for nothing, every tick."""
    parked = {"a": NOW - 9, "b": NOW - 5}
    await seed(redis, {"t:a": rec("waiting", due=NOW - 9), "t:b": rec("waiting", due=NOW - 5),
                       f"pw:{FLOW}": parked, "pa": parked, "pf": {FLOW: NOW - 9}})
    assert await run(store, "cancel", "a", NOW, RET, "r1") == 1
    state = await dump(redis)
    assert state["pf"] == {FLOW: NOW - 5} and state[f"pw:{FLOW}"] == {"b": NOW - 5}
    assert await run(store, "cancel", "b", NOW, RET, "r2") == 1
    state = await dump(redis)
    assert "pf" not in state and f"pw:{FLOW}" not in state and "pa" not in state


async def test_replace_parked(store: Store, redis: Redis) -> None:
    await seed(redis, {"t:a": rec("waiting", due=NOW - 5), f"pw:{FLOW}": {"a": NOW - 5},
                       "pa": {"a": NOW - 5}, "pf": {FLOW: NOW - 5}, "cur": str(M0)})
    assert await schedule(store, "a", NOW + MIN, mode="replace") == 1
    assert await dump(redis) == {
        "t:a": rec(due=NOW + MIN, op="r1", opr=1), f"ms:{M0 + 1}": {"a": NOW + MIN},
        **minutes(M0 + 1), "cur": str(M0)}


@pytest.mark.parametrize("between", ["claimed", "finished"])
async def test_resent_replace_does_not_rearm(store: Store, redis: Redis, between: str) -> None:
    """A PUT re-sent by redis-py after a lost reply (same request id) answers as the first
    did and writes nothing: the task claimed (or finished) in between is not re-armed."""
    assert await schedule(store, "a", NOW, mode="replace", req="put-1") == 0
    assert await claim(store, NOW) == (False, ["a"])
    if between == "finished":
        await store.complete(3, now_ms=NOW, outcomes=[_ok("a")])
    before = await dump(redis)
    assert await schedule(store, "a", NOW, mode="replace", req="put-1") == 0
    assert await dump(redis) == before
    # A new request with the same content does replace it.
    assert await schedule(store, "a", NOW, mode="replace", req="put-2") == (
        1 if between == "claimed" else 0)


def _ok(key: str) -> Any:
    from timewheel.store import Outcome
    return Outcome(key, "tok", "ok", 200, started_ms=NOW)


async def test_permits_rate_counts_starts_when_they_happen(store: Store, redis: Redis) -> None:
    """Each permit carries its start time: a start logged ahead of the call (a task let
    through before its due time) still counts in every window it falls in."""
    await redis.hset(F + "cfg", "r", "2")
    reply = await store.scripts.permits(keys=[F], args=[NOW, 100, 15_000, SLACK, 0, 0,
                                                        "a", NOW + 500, "b", NOW + 500])
    assert [int(x) for x in reply][:5] == [2, 500 + 1000 + SLACK, 2, 0, 1]
    reply = await store.scripts.permits(keys=[F], args=[NOW + 1000, 100, 15_000, SLACK, 2, "a",
                                                        "b", 0, "c", NOW + 1000])
    assert [int(x) for x in reply][:5] == [0, 500 + SLACK, 0, 0, 1]
    assert (await flow_state(redis))["starts"] == {"a": NOW + 500, "b": NOW + 500}



@pytest.mark.parametrize("few_flows", [64, 0], ids=["looked-up", "whole-index"])
@pytest.mark.parametrize("per_round", [2000, 7])
async def test_the_loads_of_many_flows_are_read_in_bounded_rounds(
        store: Store, redis: Redis, monkeypatch: pytest.MonkeyPatch, per_round: int,
        few_flows: int) -> None:
    """GET /flows and the scrape read every flow's configuration, permits held (not the
    keeper) and parked tasks over every bucket where the bucket's index of parked flows lists
    it, pipelined in rounds of CELLS_PER_ROUND commands: the same answer whatever the round,
    whether the flows are looked up in each index by name (a few) or the index read whole."""
    from timewheel.store import flow_store, rounds
    from timewheel.store.flow_store import StoredLimits

    monkeypatch.setattr(rounds, "CELLS_PER_ROUND", per_round)
    monkeypatch.setattr(flow_store, "FEW_FLOWS", few_flows)
    flows = FlowStore(redis, store.keys, store.scripts, default_parallelism=100)
    names = ["f0", "f1", "f2"]
    for n, name in enumerate(names):
        await flows.set_limits(name, StoredLimits(n + 1, None, n == 2, None, None, None))
        for bucket in range(n * 3):  # parked in 0, 3 and 6 buckets, as lua/park.lua parks
            await redis.zadd(store.keys.waiting(bucket % store.keys.buckets, name),
                             {f"t{bucket}": NOW})
            await redis.zadd(store.keys.waiting_flows(bucket % store.keys.buckets),
                             {name: NOW})
    # A flow not asked for, parked in every bucket, counts for none of them.
    for bucket in range(store.keys.buckets):
        await redis.zadd(store.keys.waiting(bucket, "other"), {"t": NOW})
        await redis.zadd(store.keys.waiting_flows(bucket), {"other": NOW})
    reply = await flows.permits("f1", now_ms=NOW, lease_ms=3000, want=[("p1", NOW)])
    assert reply.granted == 1
    loads = await flows.loads(names, now_ms=NOW + 1)
    assert [(limits.parallelism, limits.paused, held, parked)
            for limits, held, parked in loads] == [(1, False, 0, 0), (2, False, 1, 3),
                                                   (3, True, 0, 6)]
    assert await flows.loads([], now_ms=NOW) == []
