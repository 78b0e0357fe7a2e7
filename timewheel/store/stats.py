"""Read-only figures over the whole wheel for the dashboard: due load per minute and the
dead-letter count. Nothing here writes, and every read is bounded by the caller's arguments.

Due load: a task waiting for its first attempt or a retry sits in its bucket's minute slice
``m:<minute>`` (timewheel/store/keys.py). Counting a minute is one ZCARD per bucket, minus the
SCARD of the minute's delete-set ``d:<minute>``: cancel and replace are lazy (lua/cancel.lua),
their slice entry stays until the claimer drains that minute, and the delete-set names exactly
those stale entries. So for a minute the claimer has not reached yet the figure is exact. For
the minute being drained it may be low: the claimer removes entries from the slice as it reads
them but drops the delete-set only once the minute is past and empty, so stale entries already
removed are still subtracted (clamped at zero). Tasks parked for their flow (``w:<flow>``) and
tasks in flight are in no slice and are not counted.
"""

from __future__ import annotations

from typing import Any

from timewheel.store.task_store import Store, redis_errors

MINUTE_MS = 60_000
# Commands per pipeline. Bounded rounds keep any one read short for Redis and the reply small
# for us, whatever the bucket count.
CELLS_PER_ROUND = 2000


async def due_per_minute(store: Store, first_minute: int, count: int) -> list[int]:
    """Tasks due in each of ``count`` minutes from ``first_minute`` (minutes since the epoch),
    summed over every bucket: a ZCARD per bucket and minute, then an SCARD of the delete-set
    only where the slice has entries (most cells of a sparse wheel are empty), pipelined in
    rounds of ``CELLS_PER_ROUND``."""
    keys = store.keys
    cells = [(minute, bucket) for minute in range(first_minute, first_minute + count)
             for bucket in range(keys.buckets)]
    totals = dict.fromkeys(range(first_minute, first_minute + count), 0)
    async with redis_errors("due_per_minute"):
        entries = await _rounds(store, [keys.slice(b, m) for m, b in cells], "ZCARD")
        filled = [(cell, n) for cell, n in zip(cells, entries, strict=True) if n]
        stale = await _rounds(store, [keys.delete_set(b, m) for (m, b), _ in filled], "SCARD")
    for ((minute, _), n), gone in zip(filled, stale, strict=True):
        totals[minute] += max(0, n - gone)
    return [totals[minute] for minute in range(first_minute, first_minute + count)]


async def _rounds(store: Store, names: list[str], command: str) -> list[int]:
    """``command`` (ZCARD or SCARD) of each key, pipelined ``CELLS_PER_ROUND`` at a time.
    ``execute_command`` rather than ``pipe.zcard``: half the client time per command."""
    counts: list[int] = []
    for start in range(0, len(names), CELLS_PER_ROUND):
        pipe: Any = store.redis.pipeline(transaction=False)
        for name in names[start:start + CELLS_PER_ROUND]:
            pipe.execute_command(command, name)
        replies: list[Any] = await pipe.execute()
        counts += [int(n) for n in replies]
    return counts


async def dead_letter_count(store: Store) -> int:
    """Tasks in the dead letters over every bucket (one ZCARD per bucket, pipelined). Entries
    past the retention period count until the claimer next prunes their bucket."""
    keys = store.keys
    pipe: Any = store.redis.pipeline(transaction=False)
    for bucket in range(keys.buckets):
        pipe.zcard(keys.dead(bucket))
    async with redis_errors("dead_letter_count"):
        replies: list[Any] = await pipe.execute()
    return sum(int(n) for n in replies)
