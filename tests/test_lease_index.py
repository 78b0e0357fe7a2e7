"""The lease index ``ls`` and the finished indexes ``fs``, ``ff`` stay skiplists
whatever their size (lua/lib/record.lua ``INDEX_KEEPER``): a member longer than Redis's
compact limit, scored past any time, is added in the same ZADD as every entry (claim's
leases, a finished task) and never removed, so an index is never emptied (deleted) and never
a listpack again. No lease range, retention trim, listing, bulk job or count returns it."""

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
from timewheel.store.keys import INDEX_KEEPER, INDEX_KEEPER_SCORE
from timewheel.store.stats import dead_letter_count


async def _seed_due(redis: Redis, *keys: str) -> None:
    await seed(redis, {**{f"t:{k}": rec() for k in keys}, f"ms:{M0}": dict.fromkeys(keys, NOW),
                       "mn": {str(M0): M0}, "cur": str(M0)})


async def test_a_claim_makes_the_lease_index_a_skiplist_with_its_keeper(
        store: Store, redis: Redis) -> None:
    await _seed_due(redis, "a")
    assert await claim(store, NOW) == (False, ["a"])
    assert await redis.zscore(P + "ls", INDEX_KEEPER) == INDEX_KEEPER_SCORE
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
    assert await redis.zrange(P + "ls", 0, -1) == [INDEX_KEEPER.encode()]
    assert (await redis.object("encoding", P + "ls")).decode() == "skiplist"


async def test_no_lease_range_returns_the_keeper(store: Store, redis: Redis) -> None:
    """Claim's expired-lease pass reads leases up to now: the keeper, scored past any time,
    is never one of them, however late now is."""
    await _seed_due(redis, "a")
    await claim(store, NOW)
    late = 10**15  # year 33658
    more, tasks = await store.claim(B, now_ms=late, horizon_ms=late, limit=10, token="t2")
    assert (more, [t.key for t in tasks]) == (False, ["a"])  # a's lease ran out: claimed again
    assert await redis.zscore(P + "ls", INDEX_KEEPER) == INDEX_KEEPER_SCORE


async def test_the_delivering_listing_passes_over_the_keeper(store: Store, redis: Redis) -> None:
    await _seed_due(redis, "a", "b")
    await claim(store, NOW)
    # lua/list.lua: index, order, statuses, attempts, key prefix, position, limit, budget
    reply = await run(store, "list", "ls", "asc", "d", "", "", "", "", 10, 100)
    done, reached_key, rows = reply[0], reply[2], reply[3:]
    assert (done, rows[1::2]) == (1, [b"a", b"b"])
    assert reached_key == INDEX_KEEPER.encode()  # looked at, and passed over


ENTRY = '{"n":1,"o":"x"}'


async def _finish(store: Store, redis: Redis, outcome: str, *keys: str) -> None:
    """Claim ``keys`` and record ``outcome`` (ok: succeeded, fail: failed) for each."""
    await _seed_due(redis, *keys)
    await claim(store, NOW, token=outcome)
    args = [part for k in keys for part in (k, outcome, outcome, 500, "", "", NOW, ENTRY, "")]
    assert await run(store, "complete", NOW, 60_000, 20, *args) == [1] * len(keys)


async def test_finished_indexes_are_skiplists_with_the_keeper(store: Store, redis: Redis) -> None:
    """Succeeded and failed (complete): each index gets its keeper with its first entry. The
    cancelled index's pages (cancel) are kept compact instead, with no keeper
    (tests/test_cancelled_pages.py)."""
    await _finish(store, redis, "ok", "a")
    await _finish(store, redis, "fail", "b")
    await seed(redis, {"t:c": rec(due=NOW + 60_000), f"ms:{M0 + 1}": {"c": NOW + 60_000}})
    assert await run(store, "cancel", "c", NOW, 60_000, "r1", 20) == 1
    for name, key in (("fs", "a"), ("ff", "b")):
        assert await redis.zrange(P + name, 0, -1) == [key.encode(), INDEX_KEEPER.encode()]
        assert (await redis.object("encoding", P + name)).decode() == "skiplist"
    assert await redis.zrange(f"{P}fc:{NOW}", 0, -1) == [b"c"]
    assert (await redis.object("encoding", f"{P}fc:{NOW}")).decode() == "listpack"


async def test_the_retention_trim_leaves_the_keeper(store: Store, redis: Redis) -> None:
    """Claim trims finished entries older than the retention: all of them, not the keeper,
    so the index stays (a skiplist) for the next."""
    await _finish(store, redis, "ok", "a")
    later = NOW + 10 * 86_400_000  # past the store's retention
    await store.claim(B, now_ms=later, horizon_ms=later, limit=10, token="t2")
    assert await redis.zrange(P + "fs", 0, -1) == [INDEX_KEEPER.encode()]


async def test_the_dead_letter_count_leaves_the_keeper_out(store: Store, redis: Redis) -> None:
    assert await dead_letter_count(store) == 0
    await _finish(store, redis, "fail", "a", "b")
    assert await redis.zcard(P + "ff") == 3  # the two, and the keeper
    assert await dead_letter_count(store) == 2


async def test_the_newest_first_listing_passes_over_the_keeper(store: Store,
                                                               redis: Redis) -> None:
    """A listing of succeeded tasks, newest first, meets the keeper first (its score is past
    any time) and passes over it."""
    await _finish(store, redis, "ok", "a", "b")
    reply = await run(store, "list", "fs", "desc", "o", "", "", "", "", 10, 100)
    done, rows = reply[0], reply[3:]
    assert (done, sorted(rows[1::2])) == (1, [b"a", b"b"])
