"""The read-only scripts on their own: lua/list.lua (one bucket's share of a listing page,
bounded) and lua/view.lua."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from tests.support.bucket_state import M0, MIN, NOW, P, dump, minutes, rec, run, seed
from timewheel.store import Store


async def page(store: Store, index: str, status: str, *, desc: bool = False,
               attempts: str = "", prefix: str = "", after: tuple[int, str] | None = None,
               limit: int = 10, budget: int = 100) -> tuple[bool, Any, list[tuple[int, str]]]:
    """(done, reached position or None, [(score, key) found])."""
    reply = await run(store, "list", index, "desc" if desc else "asc", status, attempts,
                      prefix, *(after or ("", "")), limit, budget)
    rows = reply[3:]
    reached = (int(reply[1]), reply[2].decode()) if reply[1] != b"" else None
    found = [(int(rows[i]), rows[i + 1].decode()) for i in range(0, len(rows), 2)]
    return bool(reply[0]), reached, found


async def test_slices_in_due_order_skipping_stale_entries(store: Store, redis: Redis) -> None:
    """Minute by minute through mn; a late task in the cursor's slice comes first; entries of
    cancelled or moved tasks, other statuses and other prefixes are passed over."""
    late = NOW - 10 * MIN
    state = {"t:late": rec(due=late), "t:a": rec(due=NOW + 5), "t:b": rec(due=NOW + MIN),
             "t:moved": rec(due=NOW + 2 * MIN), "t:gone": rec("cancelled", finished=NOW),
             "t:r": rec("retrying", due=NOW + 6, attempts=1), "t:x-a": rec(due=NOW + 7),
             f"ms:{M0}": {"late": late, "a": NOW + 5, "gone": NOW + 5, "r": NOW + 6,
                          "x-a": NOW + 7, "moved": NOW + 8},
             f"ms:{M0 + 1}": {"b": NOW + MIN}, f"ms:{M0 + 2}": {"moved": NOW + 2 * MIN},
             **minutes(M0, M0 + 1, M0 + 2), "cur": str(M0)}
    await seed(redis, state)
    done, reached, found = await page(store, "slices", "s", prefix="")
    assert found == [(late, "late"), (NOW + 5, "a"), (NOW + 7, "x-a"), (NOW + MIN, "b"),
                     (NOW + 2 * MIN, "moved")]
    assert (done, reached) == (True, (NOW + 2 * MIN, "moved"))
    assert (await page(store, "slices", "r"))[2] == [(NOW + 6, "r")]
    assert (await page(store, "slices", "s", prefix="x-"))[2] == [(NOW + 7, "x-a")]
    # From a position: strictly after it, in every later slice.
    _, _, found = await page(store, "slices", "s", after=(NOW + 5, "a"))
    assert found == [(NOW + 7, "x-a"), (NOW + MIN, "b"), (NOW + 2 * MIN, "moved")]
    # A position before the late task (minutes before the cursor's): the cursor's slice is
    # read from the position, so the late task is not lost.
    _, _, found = await page(store, "slices", "s", after=(late - 1, "z"))
    assert found[:2] == [(late, "late"), (NOW + 5, "a")]
    _, _, found = await page(store, "slices", "s", after=(late, "late"))
    assert found[:1] == [(NOW + 5, "a")]
    assert await dump(redis) == state  # read-only


async def test_limit_and_budget_say_how_far_they_got(store: Store, redis: Redis) -> None:
    """At the limit the position is the last task found; out of budget it is the last entry
    looked at, found or not; either way done is 0."""
    entries = {f"k{i}": NOW + i for i in range(10)}
    await seed(redis, {**{f"t:{k}": rec(due=d) for k, d in entries.items()},
                       "t:k3": rec("cancelled"), f"ms:{M0}": entries, **minutes(M0)})
    assert await page(store, "slices", "s", limit=2) == (
        False, (NOW + 1, "k1"), [(NOW, "k0"), (NOW + 1, "k1")])
    # Budget 5: the minute counts one, then four entries.
    assert await page(store, "slices", "s", budget=5) == (
        False, (NOW + 3, "k3"), [(NOW, "k0"), (NOW + 1, "k1"), (NOW + 2, "k2")])
    assert await page(store, "slices", "s", after=(NOW + 3, "k3"), budget=5) == (
        False, (NOW + 7, "k7"), [(NOW + 4, "k4"), (NOW + 5, "k5"), (NOW + 6, "k6"),
                                 (NOW + 7, "k7")])


async def test_resume_between_ties_when_the_position_is_gone(store: Store,
                                                             redis: Redis) -> None:
    """Many entries on one score: a position whose entry has left the index resumes at the
    first key after it (in byte order), ascending and descending."""
    keys = ["a", "b", "c", "d", "e", "f"]
    await seed(redis, {**{f"t:{k}": rec("succeeded") for k in keys},
                       "fs": {**dict.fromkeys(keys, NOW), "z": NOW + 1, "0": NOW - 1}})
    done, _, found = await page(store, "fs", "o", desc=True, after=(NOW, "cc"))
    assert done and [k for _, k in found] == ["c", "b", "a"]
    _, _, found = await page(store, "fs", "o", after=(NOW, "cc"))
    assert [k for _, k in found] == ["d", "e", "f"]
    _, _, found = await page(store, "fs", "o", desc=True, after=(NOW, "d"))
    assert [k for _, k in found] == ["c", "b", "a"]


async def test_parked_tasks_by_attempts(store: Store, redis: Redis) -> None:
    """The parked index holds both: scheduled lists those with no attempt, retrying the rest."""
    await seed(redis, {"t:p0": rec("waiting", due=NOW + 1),
                       "t:p1": rec("waiting", due=NOW + 2, attempts=1),
                       "pa": {"p0": NOW + 1, "p1": NOW + 2}})
    assert (await page(store, "pa", "w", attempts="0"))[2] == [(NOW + 1, "p0")]
    assert (await page(store, "pa", "w", attempts="+"))[2] == [(NOW + 2, "p1")]

# -- view ----------------------------------------------------------------------------------------

async def test_view_reads_headers_and_bodies_within_its_budget(store: Store,
                                                              redis: Redis) -> None:
    """A view is the record's head, flow and url, its last_err, and its headers and body while
    the byte budget lasts: the first task's always, none after the first that would pass it."""
    await seed(redis, {"t:a": rec("failed", headers="X-A:1", body="b" * 5000, last_err="boom"),
                       "t:b": rec(headers="X-B:2", body="small"),
                       "t:c": rec(body="c" * 100), "t:d": rec(body="tiny")})
    await redis.hset(P + "t:old", "status", "scheduled")
    reply = await run(store, "view", "", "a", "none", "old", "b")
    assert reply[1:] == [b"boom", b"X-A:1" + b"b" * 5000, b"", b"", b"", b"", b"", b"v1", b"",
                         b"", b"", reply[12], b"", b"X-B:2small", b""]
    assert reply[0] == (await redis.get(P + "t:a"))[:85 + 11 + 21]
    # A budget of 5100 bytes: a (5005) fits alone; b (10) would fit, c (100) would pass it.
    # Nothing after the first task left unread is read, even what would fit (d).
    reply = await run(store, "view", 5100, "a", "b", "c", "d")
    assert reply[2::4] == [b"X-A:1" + b"b" * 5000, b"X-B:2small", None, None]
    # The first task is read whatever the budget.
    assert (await run(store, "view", 1, "c", "d"))[2::4] == [b"c" * 100, None]
