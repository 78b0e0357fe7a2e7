"""How a shutdown stops the service's background loops (the ticker, the materializer, the
bulk-job runner, the publish sweeper). Told to stop, a loop finishes the step it is in, for up
to STOP_WAIT_S; then it is cancelled. A step waits on Redis, and a silent Redis (stopped, cut
off) held each loop for its client's socket timeout, once or twice, one loop after another: 11 s
for a shutdown with nothing in flight (a redis-server under SIGSTOP), and the ticker's pass 9 s
(tests/test_loops.py), on top of the batch deadline the dispatcher may take, and past a grace
period a process is killed. Each step is a script (atomic in Redis) or held under a lease, so a
cancelled step is what a crash between two steps is, which the wheel survives by design
(docs/design.md)."""

from __future__ import annotations

import asyncio

STOP_WAIT_S = 1.0


async def stop_loop(task: asyncio.Task[None] | None, wait_s: float = STOP_WAIT_S) -> None:
    """Wait up to ``wait_s`` for a loop told to stop, then cancel it and wait for it. A stop
    cancelled meanwhile cancels the loop too, as awaiting it did."""
    if task is None:
        return
    try:
        _, running = await asyncio.wait([task], timeout=wait_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if running:
        task.cancel()
        await asyncio.wait([task])
