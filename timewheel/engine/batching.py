"""Coalesces per-task Redis calls into one script call per bucket (or per group of buckets).

A burst of 10,000 due tasks would otherwise cost 20,000 round trips (start and complete each);
batched, it costs a few dozen. Everything submitted during one event-loop iteration is flushed
together, one call per bucket, the calls running concurrently. A script that can take several
buckets' work at once (``group``: bucket -> the call it goes in) makes one call per group.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

MAX_BATCH = 1000  # keeps each script call short: Redis runs nothing else meanwhile


class BucketBatcher(Generic[Item, Result]):
    def __init__(self, flush: Callable[[int, Sequence[Item]], Awaitable[list[Result]]], *,
                 group: Callable[[int], int] | None = None, linger_s: float = 0.0) -> None:
        self._flush = flush  # called with the group (the bucket, by default) and its items
        self._group = group
        # Wait this long for more before a flush (0: the end of this loop iteration), for
        # writes nobody waits on: callbacks answered a millisecond apart share a call.
        self._linger_s = linger_s
        self._pending: defaultdict[int, list[tuple[Item, asyncio.Future[Result]]]] = (
            defaultdict(list))
        self._scheduled = False
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, bucket: int, item: Item) -> Result:
        return await self.submit_nowait(bucket, item)

    def submit_nowait(self, bucket: int, item: Item) -> asyncio.Future[Result]:
        """``submit`` for a caller that does not wait in a coroutine: the item's future."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._pending[bucket if self._group is None else self._group(bucket)].append(
            (item, future))
        if not self._scheduled:
            self._scheduled = True
            if self._linger_s:
                loop.call_later(self._linger_s, self._kick)
            else:
                loop.call_soon(self._kick)
        return future

    def _kick(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, defaultdict(list)
        for bucket, entries in pending.items():
            for i in range(0, len(entries), MAX_BATCH):
                task = asyncio.create_task(self._run(bucket, entries[i:i + MAX_BATCH]))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    async def _run(self, bucket: int,
                   entries: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            results = await self._flush(bucket, [item for item, _ in entries])
        except Exception as exc:  # handed to every waiter; each decides what to do
            for _, future in entries:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(entries, results, strict=True):
            if not future.done():
                future.set_result(result)
