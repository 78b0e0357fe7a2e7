"""Figures over the whole wheel, without HTTP: what ``/stats/due`` and the dead-letter count of
``/stats`` read (store/stats.py counts the slices). This process's own counters are read from
its metrics by the handler."""

from __future__ import annotations

from dataclasses import dataclass

from timewheel.clock import Clock
from timewheel.store.stats import MINUTE_MS, dead_letter_count, due_per_minute
from timewheel.store.task_store import Store

# Bucket-minute cells one request may cover. Only minutes that have a slice cost anything (a
# ZCARD and an SCARD, about 10-40 us of this process's time each), but a busy wheel may have a
# slice in every bucket and minute, so the bound is on the cells. With the default 16 buckets
# every allowed ``minutes`` fits (16 x 1440 = 23,040); a wheel with very many buckets gets
# fewer minutes per request (``clamped`` says so) instead of an unbounded read.
MAX_CELLS = 25_000


@dataclass(frozen=True, slots=True)
class DueLoad:
    """``minutes``: (start of the minute in ms, tasks due in it) from the current minute on,
    summed over ``buckets`` buckets; ``clamped``: fewer minutes than asked."""

    minutes: list[tuple[int, int]]
    buckets: int
    clamped: bool


class StatsOperations:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    async def due_load(self, minutes: int) -> DueLoad:
        """The due load of ``minutes`` minutes from the current one, or of as many as fit in
        MAX_CELLS bucket-minute cells."""
        buckets = self.store.keys.buckets
        count = min(minutes, max(1, MAX_CELLS // buckets))
        first = self.clock.now_ms() // MINUTE_MS
        dues = await due_per_minute(self.store, first, count)
        return DueLoad([((first + i) * MINUTE_MS, due) for i, due in enumerate(dues)],
                       buckets, count < minutes)

    async def dead_letters(self) -> int:
        """Failed tasks in the dead letters, over every bucket."""
        return await dead_letter_count(self.store)
