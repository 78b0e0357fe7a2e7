"""The lease index ``ls`` stays a skiplist whatever its size (lua/lib/claiming.lua
``keep_lease_index``): a member longer than Redis's compact limit, scored past any time, is
added by the first claim of a script call and never removed, so the index is never emptied
(deleted) and never a listpack again. No lease range, listing or bulk job returns it."""

from __future__ import annotations

from redis.asyncio import Redis

from tests.support.bucket_state import (
    M0,
    NOW,
    B,
    P,
    claim,
    rec,
    run,
    seed,
)
from timewheel.store import Store
from timewheel.store.keys import LEASE_KEEPER, LEASE_KEEPER_SCORE


async def _seed_due(redis: Redis, *keys: str) -> None:
    await seed(redis, {**{f"t:{k}": rec() for k in keys}, f"ms:{M0}": dict.fromkeys(keys, NOW),
                       "mn": {str(M0): M0}, "cur": str(M0)})


async def test_a_claim_makes_the_lease_index_a_skiplist_with_its_keeper(
        store: Store, redis: Redis) -> None:
    await _seed_due(redis, "a")
    assert await claim(store, NOW) == (False, ["a"])
    assert await redis.zscore(P + "ls", LEASE_KEEPER) == LEASE_KEEPER_SCORE
    assert (await redis.object("encoding", P + "ls")).decode() == "skiplist"


async def test_a_short_member_alone_would_make_a_compact_zset(redis: Redis) -> None:
    """The control of the test above: without the keeper, Redis keeps a lease index of a few
    entries as a listpack (ziplist before Redis 7)."""
    await redis.zadd(P + "ls", {"a": NOW})
    assert (await redis.object("encoding", P + "ls")).decode() in ("listpack", "ziplist")


async def test_the_index_outlives_its_last_lease(store: Store, redis: Redis) -> None:
    """Completing the only lease leaves the keeper: the key is not deleted, so the next lease
    goes into a skiplist again, not into a fresh listpack."""
    await _seed_due(redis, "a")
    await claim(store, NOW)
    entry = '{"n":1,"o":"ok"}'
    assert await run(store, "complete", NOW, 60_000, 20,
                     "a", "tok", "ok", 200, "", "", NOW, entry, "") == [1]
    assert await redis.zrange(P + "ls", 0, -1) == [LEASE_KEEPER.encode()]
    assert (await redis.object("encoding", P + "ls")).decode() == "skiplist"


async def test_no_lease_range_returns_the_keeper(store: Store, redis: Redis) -> None:
    """Claim's expired-lease pass reads leases up to now: the keeper, scored past any time,
    is never one of them, however late now is."""
    await _seed_due(redis, "a")
    await claim(store, NOW)
    late = 10**15  # year 33658
    more, tasks = await store.claim(B, now_ms=late, horizon_ms=late, limit=10, token="t2")
    assert (more, [t.key for t in tasks]) == (False, ["a"])  # a's lease ran out: claimed again
    assert await redis.zscore(P + "ls", LEASE_KEEPER) == LEASE_KEEPER_SCORE


async def test_the_delivering_listing_passes_over_the_keeper(store: Store, redis: Redis) -> None:
    await _seed_due(redis, "a", "b")
    await claim(store, NOW)
    # lua/list.lua: index, order, statuses, attempts, key prefix, position, limit, budget
    reply = await run(store, "list", "ls", "asc", "d", "", "", "", "", 10, 100)
    done, reached_key, rows = reply[0], reply[2], reply[3:]
    assert (done, rows[1::2]) == (1, [b"a", b"b"])
    assert reached_key == LEASE_KEEPER.encode()  # looked at, and passed over
