"""PublishSweeper: completes topic publishes whose process died half-way, on a Redis Cluster.

On a cluster a publish is written in steps (timewheel/store/publish.py): a record opened in
the publish key's bucket, holding every task's record, then the tasks, bucket by bucket, then
the record closed. A process that dies in between leaves the record open; its client's retry
completes it, and so does this sweep, run by every process each second: it picks records open
for longer than ``older_than_ms`` (a live publish closes its record within milliseconds) and
creates what is missing, once (an identical task is left as it is). On one Redis a publish is
one script call and nothing is ever left open; the sweep is not started there.
"""

from __future__ import annotations

import asyncio
import logging

from timewheel.clock import Clock
from timewheel.errors import StoreUnavailable
from timewheel.loops import stop_loop
from timewheel.store.publish import Publisher

log = logging.getLogger(__name__)


class PublishSweeper:
    def __init__(self, publisher: Publisher, clock: Clock, *, period_ms: int = 1000,
                 older_than_ms: int = 10_000) -> None:
        self._publisher = publisher
        self._clock = clock
        self.period_ms = period_ms
        self.older_than_ms = older_than_ms
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.completed = 0  # publishes this process completed (tests read it)

    async def tick(self, now_ms: int) -> int:
        """One pass over every bucket; returns how many publishes it completed."""
        keys = self._publisher.keys
        done = sum(await asyncio.gather(*(
            self._publisher.complete_open(b, now_ms=now_ms, older_than_ms=self.older_than_ms)
            for b in range(keys.buckets))))
        if done:
            log.warning("completed %d topic publishes left open by a process that stopped", done)
        self.completed += done
        return done

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self.run(), name="timewheel-publish-sweeper")

    async def stop(self) -> None:
        """Stop after the sweep under way, or cancel it if Redis holds it up
        (timewheel/loops.py)."""
        self._stopping.set()
        await stop_loop(self._task)
        self._task = None

    async def run(self) -> None:
        """Sweep every ``period_ms`` until ``stop()``; errors are logged and the loop goes on."""
        while not self._stopping.is_set():
            try:
                if self._publisher.store.ready:
                    await self.tick(self._clock.now_ms())
            except StoreUnavailable as exc:
                log.debug("publish sweep waits for Redis: %s", exc)
            except Exception:  # one bad pass must not stop the sweeps
                log.exception("publish sweep failed")
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=self.period_ms / 1000)
            except TimeoutError:
                pass
