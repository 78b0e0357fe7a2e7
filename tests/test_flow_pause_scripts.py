"""The scripts of flow pause, retry defaults and waiting reports on their own: permits.lua on a
paused flow, flow_limits.lua and flow_pause.lua, waiting_report.lua and waiting_count.lua.
Seed raw state, run once, assert the whole resulting state."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from tests.support.bucket_state import NOW
from tests.test_flow_scripts import F, flow_state
from timewheel.store import Store
from timewheel.store.flow_store import RATE_SLACK_MS

W = "{tw:wl}:"


async def permits(store: Store, now: int, release: list[str], want: list[str]) -> list[int]:
    pairs = [part for permit in want for part in (permit, now)]
    reply = await store.scripts.permits(keys=[F], args=[now, 100, 15_000, RATE_SLACK_MS,
                                                        len(release), *release, 0, *pairs])
    return [int(x) for x in reply]


async def test_a_paused_flow_grants_nothing_but_takes_permits_back(store: Store,
                                                                   redis: Redis) -> None:
    """Paused: no new permit (room 0, wait -1), a finished permit is still given back, an id
    already held (a re-sent call) still counts as granted. Resumed: granted again."""
    await redis.hset(F + "cfg", mapping={"p": 3})
    assert (await permits(store, NOW, [], ["a", "b"]))[:6] == [2, 0, 2, 1, 0, 0]
    await redis.hset(F + "cfg", "x", "1")
    assert (await permits(store, NOW + 1, ["b"], ["c", "d"]))[:6] == [0, -1, 1, 0, 0, 1]
    assert (await permits(store, NOW + 2, [], ["a", "c"]))[:6] == [1, -1, 1, 0, 0, 1]
    assert await flow_state(redis) == {"held": {"a": NOW + 15_000},
                                       "cfg": {"p": "3", "x": "1"}}
    await redis.hdel(F + "cfg", "x")
    assert (await permits(store, NOW + 3, [], ["c", "d"]))[:6] == [2, -1, 3, 0, 0, 0]


async def test_a_paused_rated_flow_grants_nothing_and_logs_no_start(store: Store,
                                                                    redis: Redis) -> None:
    await redis.hset(F + "cfg", mapping={"r": "5", "x": "1"})
    assert (await permits(store, NOW, [], ["a"]))[:6] == [0, -1, 0, 0, 1, 1]
    assert await flow_state(redis) == {"cfg": {"r": "5", "x": "1"}}


async def test_permits_answer_the_retry_defaults(store: Store, redis: Redis) -> None:
    assert (await permits(store, NOW, [], []))[6:] == [0, 0, 0]
    await redis.hset(F + "cfg", mapping={"ma": "20", "rb": "30000", "mb": "86400000"})
    assert (await permits(store, NOW, [], []))[6:] == [20, 30_000, 86_400_000]


async def test_flow_limits_replaces_the_whole_configuration(store: Store, redis: Redis) -> None:
    await store.scripts.flow_limits(keys=[F], args=["3", "", "1", "20", "30000", ""])
    assert await flow_state(redis) == {"cfg": {"p": "3", "x": "1", "ma": "20", "rb": "30000"}}
    assert await store.scripts.flow_limits(keys=[F], args=["", "", "", "", "", "5000"]) == 1
    assert await flow_state(redis) == {"cfg": {"mb": "5000"}}
    assert await store.scripts.flow_limits(keys=[F], args=["", "", "", "", "", ""]) == 0
    assert await flow_state(redis) == {}


async def test_flow_pause_keeps_the_rest(store: Store, redis: Redis) -> None:
    assert await store.scripts.flow_pause(keys=[F], args=["1"]) == 1
    assert await flow_state(redis) == {"cfg": {"x": "1"}}
    await redis.hset(F + "cfg", "p", "2")
    assert await store.scripts.flow_pause(keys=[F], args=["0"]) == 1
    assert await flow_state(redis) == {"cfg": {"p": "2"}}
    await redis.hdel(F + "cfg", "p")
    assert await store.scripts.flow_pause(keys=[F], args=["0"]) == 0
    assert await flow_state(redis) == {}


async def reports(redis: Redis) -> dict[str, Any]:
    out: dict[str, Any] = {"live": {m.decode(): int(s) for m, s in
                                    await redis.zrange(W + "live", 0, -1, withscores=True)}}
    async for key in redis.scan_iter(match=W + "p:*"):
        out[key.decode()] = {k.decode(): int(v) for k, v in (await redis.hgetall(key)).items()}
    return out


async def test_waiting_reports_add_up_over_live_processes(store: Store, redis: Redis) -> None:
    """Each process's report replaces its last; one that ran out is not counted and is dropped
    by the next report; an empty report removes the process's."""
    report, count = store.scripts.waiting_report, store.scripts.waiting_count
    assert await report(keys=[W], args=[NOW, 3000, "a", "f1", 4, "f2", 1]) == 1
    assert await report(keys=[W], args=[NOW + 10, 3000, "b", "f1", 5]) == 2
    assert await count(keys=[W], args=[NOW + 20, "f1", "f2", "f3"]) == [9, 1, 0]
    assert await report(keys=[W], args=[NOW + 30, 3000, "a", "f2", 2]) == 2
    assert await count(keys=[W], args=[NOW + 40, "f1", "f2"]) == [5, 2]
    assert await reports(redis) == {"live": {"a": NOW + 3030, "b": NOW + 3010},
                                    W + "p:a": {"f2": 2}, W + "p:b": {"f1": 5}}
    assert 0 < await redis.pttl(W + "p:a") <= 3000
    # b stopped reporting: from its expiry on it is not counted, and the next report drops it.
    assert await count(keys=[W], args=[NOW + 3010, "f1", "f2"]) == [0, 2]
    assert await report(keys=[W], args=[NOW + 3020, 3000, "a"]) == 0
    assert (await reports(redis))["live"] == {}
    assert await count(keys=[W], args=[NOW + 3020]) == []
