"""The cancelled index's pages (lua/lib/record.lua): how cancels fill them, how a task leaves
them, how the claim trims them, how a listing reads them, and the index from before pages.

tests/support/bucket_state.py's ``dump`` checks every page's range and shows the entries
together; these tests read the pages themselves."""

from __future__ import annotations

from typing import Any

import httpx
from redis.asyncio import Redis

from tests.support.bucket_state import (
    M0,
    MIN,
    NOW,
    RET,
    P,
    cancelled,
    claim,
    dump,
    minutes,
    rec,
    run,
    schedule,
    seed,
)
from tests.test_api_jobs import runner
from tests.test_api_list import keys, pages
from tests.test_list_scripts import page
from timewheel.clock import FakeClock
from timewheel.domain import TaskStatus
from timewheel.jobs.sources import sources
from timewheel.store import Store
from timewheel.store.keys import INDEX_KEEPER, INDEX_KEEPER_SCORE

CAP = 128  # lua/lib/record.lua PAGE_CAP
KEPT = 20  # attempts kept per task
DUE = NOW + 10 * MIN


async def directory(redis: Redis) -> list[int]:
    return [int(s) for s in await redis.zrange(P + "fcp", 0, -1)]


async def page_keys(redis: Redis, start: int) -> list[str]:
    return [k.decode() for k in await redis.zrange(f"{P}fc:{start}", 0, -1)]


async def pending(redis: Redis, names: list[str]) -> None:
    """Scheduled tasks due at DUE, ready to cancel."""
    await seed(redis, {**{f"t:{k}": rec(due=DUE) for k in names},
                       f"ms:{M0 + 10}": dict.fromkeys(names, DUE), **minutes(M0 + 10),
                       "cur": str(M0)})


async def cancel(store: Store, key: str, at: int) -> None:
    assert await run(store, "cancel", key, at, RET, f"r-{key}", KEPT) == 1


async def test_a_page_fills_then_a_later_cancel_starts_the_next(store: Store,
                                                                redis: Redis) -> None:
    names = [f"k{i:03}" for i in range(CAP + 2)]
    await pending(redis, names)
    for i, key in enumerate(names):
        await cancel(store, key, NOW + i)
    assert await directory(redis) == [NOW, NOW + CAP]
    assert await page_keys(redis, NOW) == names[:CAP]
    assert await page_keys(redis, NOW + CAP) == names[CAP:]
    # A page stays compact: a listpack, with no keeper in it (as the index before pages had).
    assert (await redis.object("encoding", f"{P}fc:{NOW}")).decode() == "listpack"
    assert (await dump(redis))["fc pages"] == {k: NOW + i for i, k in enumerate(names)}


async def test_a_full_page_takes_a_cancel_at_its_last_time(store: Store, redis: Redis) -> None:
    """Ties stay on one page (a page's range ends where the next begins); the next later
    time starts a page."""
    names = [f"k{i:03}" for i in range(CAP + 2)]
    await pending(redis, names)
    for key in names[:CAP + 1]:
        await cancel(store, key, NOW)
    assert await directory(redis) == [NOW]
    assert len(await page_keys(redis, NOW)) == CAP + 1
    await cancel(store, names[-1], NOW + 1)
    assert await directory(redis) == [NOW, NOW + 1]


async def test_an_earlier_time_goes_to_the_page_that_holds_it(store: Store,
                                                              redis: Redis) -> None:
    """A writer whose clock is behind (or a migration) cancels at an earlier time: the page
    whose range holds that time takes it; when that page is full, a new page starts at the
    time and takes the old page's entries from there on, so no page grows past the cap. A
    time before every page starts a page of its own."""
    names = [f"k{i:03}" for i in range(CAP)] + ["late", "past", "inside", "first"]
    await pending(redis, names)
    for i, key in enumerate(names[:CAP]):
        await cancel(store, key, NOW + i)
    await cancel(store, "late", NOW + 500)  # full page: a new page at NOW + 500
    await cancel(store, "past", NOW + 300)  # the first page's range, past its entries
    await cancel(store, "inside", NOW + 100)  # among the first page's entries
    await cancel(store, "first", NOW - 5)
    assert await directory(redis) == [NOW - 5, NOW, NOW + 100, NOW + 300, NOW + 500]
    assert await page_keys(redis, NOW - 5) == ["first"]
    assert await page_keys(redis, NOW) == names[:100]
    assert await page_keys(redis, NOW + 100) == ["inside", *names[100:CAP]]  # by time, then key
    assert await page_keys(redis, NOW + 300) == ["past"]
    assert await page_keys(redis, NOW + 500) == ["late"]
    await dump(redis)  # every entry within its page's range


async def test_a_split_that_empties_a_page_takes_it_off_the_directory(store: Store,
                                                                      redis: Redis) -> None:
    """A full page whose entries all lie past a new time (its first ones left) moves them
    all to the new page: the emptied page leaves the directory."""
    names = [f"k{i:03}" for i in range(CAP + 2)]
    await pending(redis, names)
    await cancel(store, names[0], NOW)
    for i, key in enumerate(names[1:CAP], start=1):
        await cancel(store, key, NOW + 10 + i)
    assert await run(store, "replay", names[0], NOW + 1000, "p1") == 1  # page NOW: from NOW + 11
    await cancel(store, names[CAP], NOW + 500)  # the page is not full: it takes it
    await cancel(store, names[CAP + 1], NOW + 7)  # full now: all of it moves to NOW + 7
    assert await directory(redis) == [NOW + 7]
    assert len(await page_keys(redis, NOW + 7)) == CAP + 1
    assert (await dump(redis))["fc pages"] == {
        names[CAP]: NOW + 500, names[CAP + 1]: NOW + 7,
        **{k: NOW + 10 + i for i, k in enumerate(names[1:CAP], start=1)}}


async def test_replay_and_create_take_a_task_off_its_page(store: Store, redis: Redis) -> None:
    """A task leaves its page (found by its record's finish time) when it is replayed or
    created again; a page that empties leaves the directory, its range going to the page
    before it. An entry in the index from before pages leaves it too."""
    names = [f"k{i:03}" for i in range(CAP + 1)]
    await pending(redis, names)
    for i, key in enumerate(names):
        await cancel(store, key, NOW + i)
    # Found on the first page by its finish time, while a later page is there.
    assert await run(store, "replay", "k005", NOW + 1000, "p2") == 1
    assert await schedule(store, "k006", NOW + MIN, mode="replace", now=NOW + 1000) == 0
    assert "k005" not in await page_keys(redis, NOW)
    assert "k006" not in await page_keys(redis, NOW)
    assert await run(store, "replay", names[-1], NOW + 1000, "p1") == 1
    assert await directory(redis) == [NOW]
    # The index from before pages: a task in it leaves it the same way.
    await seed(redis, {"t:old": rec("cancelled", due=DUE, finished=NOW - 9),
                       "fc": {"old": NOW - 9}})
    assert await run(store, "replay", "old", NOW + 1000, "p3") == 1
    assert await redis.zscore(P + "fc", "old") is None
    assert len(await page_keys(redis, NOW)) == CAP - 2


async def test_claim_trims_pages_past_the_retention(store: Store, redis: Redis) -> None:
    """Whole pages at most eight a call, oldest first, then the page the cut falls in, in
    part; a page that empties leaves the directory."""
    cut = NOW - RET  # entries at or before it go
    old = [cut - 1000 + 10 * i for i in range(10)]  # ten pages, all of them older
    straddling, fresh = cut - 5, cut + 5
    state: dict[str, Any] = {"fcp": {str(s): s for s in [*old, straddling, fresh]}}
    for s in old:
        state[f"fc:{s}"] = {f"a{s}": s, f"b{s}": s + 1}
    state[f"fc:{straddling}"] = {"before": cut - 5, "at-cut": cut, "after-cut": cut + 1}
    state[f"fc:{fresh}"] = {"fresh": fresh}
    await seed(redis, state)
    assert await claim(store, NOW) == (False, [])
    assert await directory(redis) == [*old[8:], straddling, fresh]  # eight pages a call
    assert await claim(store, NOW) == (False, [])
    assert await dump(redis) == cancelled({"after-cut": cut + 1, "fresh": fresh})
    assert await directory(redis) == [straddling, fresh]
    assert await claim(store, NOW + 1) == (False, [])
    assert await directory(redis) == [fresh]  # the straddling page emptied


async def test_the_index_before_pages_goes_once_only_its_keeper_is_left(
        store: Store, redis: Redis) -> None:
    """The claim trims the zset written before pages at the retention age like the others,
    and deletes it once nothing but its keeper is left: no key stays for good."""
    keeper = {INDEX_KEEPER: INDEX_KEEPER_SCORE}
    await redis.zadd(P + "fc", {"old": NOW - RET - 1, "young": NOW - RET + 5, **keeper})
    assert await claim(store, NOW) == (False, [])
    assert await redis.zrange(P + "fc", 0, -1) == [b"young", INDEX_KEEPER.encode()]
    assert await claim(store, NOW + 5) == (False, [])
    assert await redis.exists(P + "fc") == 0


async def test_the_list_script_reads_the_pages_in_order(store: Store, redis: Redis) -> None:
    """Newest first (and oldest first), resuming from any position, ties by key, entries of
    tasks no longer cancelled passed over; a page that holds the position's time but not the
    position itself (it left) is resumed in all the same."""
    entries = {f"k{i:02}": NOW + (i // 3) * 7 for i in range(40)}  # ties of three
    records = {f"t:{k}": rec("cancelled", due=DUE, finished=t) for k, t in entries.items()}
    records["t:k07"] = rec(due=DUE)  # replayed since: its entry is stale
    starts = [NOW, NOW + 21, NOW + 49, NOW + 84]
    state: dict[str, Any] = {**records, "fcp": {str(s): s for s in starts}}
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else None
        state[f"fc:{s}"] = {k: t for k, t in entries.items() if t >= s and (end is None or t < end)}
    await seed(redis, state)
    live = sorted(((t, k) for k, t in entries.items() if k != "k07"))
    for desc in (True, False):
        expected = live[::-1] if desc else live
        for limit, budget in ((4, 5), (1, 1), (100, 300)):
            got: list[tuple[int, str]] = []
            after: tuple[int, str] | None = None
            for _ in range(200):
                done, reached, found = await page(store, "pages:fc", "c", desc=desc,
                                                  after=after, limit=limit, budget=budget)
                got += found[:limit]
                if done and len(found) <= limit:
                    break
                after = found[limit - 1] if len(found) > limit else (
                    found[-1] if len(found) == limit else reached)
            assert got == expected, (desc, limit, budget)
    # Resuming after a position whose task has left its page.
    await redis.zrem(f"{P}fc:{NOW + 21}", "k12")
    _, _, found = await page(store, "pages:fc", "c", desc=True, after=(NOW + 28, "k12"),
                             limit=3, budget=50)
    assert found == [(NOW + 21, "k11"), (NOW + 21, "k10"), (NOW + 21, "k09")]


async def test_more_pages_than_one_directory_read(store: Store, redis: Redis) -> None:
    """The walk reads the directory 50 starts at a time: 60 pages are all read, in order."""
    starts = [NOW + 10 * i for i in range(60)]
    entries = {f"k{i:03}": s + j for i, (s, j) in enumerate((s, j) for s in starts for j in (0, 1))}
    state: dict[str, Any] = {f"t:{k}": rec("cancelled", due=DUE, finished=t)
                             for k, t in entries.items()}
    state["fcp"] = {str(s): s for s in starts}
    for s in starts:
        state[f"fc:{s}"] = {k: t for k, t in entries.items() if s <= t < s + 10}
    await seed(redis, state)
    done, _, found = await page(store, "pages:fc", "c", desc=True, after=None, limit=1000,
                                budget=300)
    assert done and found == sorted(((t, k) for k, t in entries.items()), reverse=True)
    done, _, found = await page(store, "pages:fc", "c", desc=False, after=None, limit=1000,
                                budget=300)
    assert done and found == sorted((t, k) for k, t in entries.items())


async def test_a_stale_entry_of_a_key_cancelled_again_is_not_listed(store: Store,
                                                                    redis: Redis) -> None:
    """A key created again after its record expired, and cancelled again before the trim
    took its old entry, is on two pages (or on a page and in the zset from before pages):
    only the entry at its record's finish time is listed."""
    names = [f"k{i:03}" for i in range(CAP)] + ["again"]
    await pending(redis, names)
    for i, key in enumerate(names[:CAP]):
        await cancel(store, key, NOW + i)
    await redis.delete(P + "t:k003")  # its retention TTL ran out; the trim has not come yet
    await redis.zadd(P + "fc", {"again": NOW - 50})  # and one from before pages, the same
    await seed(redis, {"t:k003": rec(due=DUE), f"ms:{M0 + 10}": {"k003": DUE}})
    await cancel(store, "k003", NOW + 1000)
    await cancel(store, "again", NOW + 1001)
    assert await directory(redis) == [NOW, NOW + 1000]
    for index in ("pages:fc", "fc"):
        _, _, found = await page(store, index, "c", desc=True, after=None, limit=1000,
                                 budget=300)
        assert [k for _, k in found].count("k003") == (index == "pages:fc")
        assert (NOW + 3, "k003") not in found and (NOW - 50, "again") not in found


def test_jobs_keep_their_source_numbers_across_the_upgrade() -> None:
    """A bulk job keeps its position per bucket as a number into its sources: the zset from
    before pages keeps its number, and the pages come after it."""
    assert [s.index for s in sources("replay", TaskStatus.CANCELLED)] == ["fc", "pages:fc"]
    assert [s.index for s in sources("replay", None)] == ["ff", "fc", "pages:fc"]


async def test_get_and_bulk_replay_read_the_pages_and_the_index_before_them(
        client: httpx.AsyncClient, store: Store, redis: Redis, fake_clock: FakeClock) -> None:
    """Through the API: the cancelled listing merges the pages of every bucket with the index
    written before pages, newest first, each task once; a bulk replay reaches them all."""
    # Most in one bucket, so that it has pages to go across; a few in others.
    same = [k for k in (f"c.{i:04}" for i in range(6000)) if store.keys.bucket_of(k) == 0]
    names = sorted(same[:290] + [k for k in (f"c.{i:04}" for i in range(40))
                                 if store.keys.bucket_of(k) != 0][:10])
    r = await client.post("/tasks/batch", json={"tasks": [
        {"key": k, "callback_url": "http://127.0.0.1:9/x", "execute_at": (NOW + 3600_000) / 1000}
        for k in names]})
    assert r.status_code == 200
    for key in names:
        fake_clock.advance(1)
        assert (await client.delete(f"/tasks/{key}")).status_code == 204
    # Ten of them as a wheel written before pages holds them: moved into the old index.
    old = names[:10]
    for key in old:
        bucket = store.keys.bucket_of(key)
        for start in await redis.zrange(store.keys.cancelled_pages(bucket), 0, -1):
            page = store.keys.cancelled_page(bucket, start.decode())
            score = await redis.zscore(page, key)
            if score is not None:
                await redis.zrem(page, key)
                await redis.zadd(store.keys.finished(bucket, "cancelled"), {key: score})
    assert len(await redis.zrange(store.keys.cancelled_pages(0), 0, -1)) == 3
    listing = await pages(client, "cancelled", limit=37)
    assert keys(listing) == names[::-1]
    fake_clock.advance(10)
    r = await client.post("/tasks/replay", json={"status": "cancelled", "key_prefix": "c."})
    assert r.status_code == 202, r.text
    while await runner(store, fake_clock).work_one():
        pass
    assert keys(await pages(client, "cancelled", limit=100)) == []
    assert len(keys(await pages(client, "scheduled", limit=1000))) == 300
