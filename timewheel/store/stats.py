"""Read-only figures over the whole wheel for the dashboard: due load per minute and the
dead-letter count. Nothing here writes, and every read is bounded by the caller's arguments.

Due load: a task waiting for its first attempt or a retry sits in its bucket's minute slice
``ms:<minute>`` (timewheel/store/keys.py), and the bucket's ``mn`` index names the minutes that
have a slice. Counting is, per bucket, one ZRANGEBYSCORE of ``mn`` over the window, then for each
minute found a ZCARD of the slice minus the SCARD of its delete-set ``md:<minute>``: cancel and
replace are lazy (lua/cancel.lua), their slice entry stays until the claimer drains that minute,
and the delete-set names exactly those stale entries. So for a minute the claimer has not
reached yet the figure is exact. For the minute being drained it may be low: the claimer
removes entries from the slice as it reads them but drops the delete-set only once the minute
is past and empty, so stale entries already removed are still subtracted (clamped at zero).
Tasks parked for their flow (``pw:<flow>``) and tasks in flight are in no slice and are not
counted.
"""

from __future__ import annotations

from typing import Any

from timewheel.store.keys import INDEX_KEEPER_SCORE
from timewheel.store.redis_errors import redis_errors
from timewheel.store.rounds import in_rounds
from timewheel.store.task_store import Store

MINUTE_MS = 60_000


async def due_per_minute(store: Store, first_minute: int, count: int) -> list[int]:
    """Tasks due in each of ``count`` minutes from ``first_minute`` (minutes since the epoch),
    summed over every bucket. Cost: one ZRANGEBYSCORE per bucket, then a ZCARD and an SCARD
    per bucket and minute that has a slice (at most ``count x buckets``), pipelined in rounds
    of ``CELLS_PER_ROUND`` commands (store/rounds.py)."""
    keys = store.keys
    last = first_minute + count - 1
    totals = dict.fromkeys(range(first_minute, first_minute + count), 0)
    redis = store.redis
    async with redis_errors("due_per_minute"):
        found = await in_rounds(redis, [("ZRANGEBYSCORE", keys.minutes(b), first_minute, last)
                                        for b in range(keys.buckets)])
        cells = [(int(minute), bucket) for bucket, minutes in enumerate(found)
                 for minute in minutes if first_minute <= int(minute) <= last]
        entries = await in_rounds(redis, [("ZCARD", keys.slice(b, m)) for m, b in cells])
        filled = [(cell, int(n)) for cell, n in zip(cells, entries, strict=True) if n]
        stale = await in_rounds(redis, [("SCARD", keys.delete_set(b, m)) for (m, b), _ in filled])
    for ((minute, _), n), gone in zip(filled, stale, strict=True):
        totals[minute] += max(0, n - int(gone))
    return [totals[minute] for minute in range(first_minute, first_minute + count)]


async def dead_letter_count(store: Store) -> int:
    """Tasks in the dead letters over every bucket (one ZCOUNT per bucket, pipelined: all but
    the index's keeper, store/keys.py INDEX_KEEPER). Entries past the retention period count
    until the claimer next prunes their bucket."""
    keys = store.keys
    pipe: Any = store.redis.pipeline(transaction=False)
    for bucket in range(keys.buckets):
        pipe.zcount(keys.dead(bucket), "-inf", f"({INDEX_KEEPER_SCORE}")
    async with redis_errors("dead_letter_count"):
        replies: list[Any] = await pipe.execute()
    return sum(int(n) for n in replies)
