"""The grace an expired request timeout gives an answer that already came.

A process that runs again after a stop (SIGSTOP, a frozen VM, a CPU it did not get) past a
request's timeout has its event loop run the expired timers before it reads its sockets
(uvloop: libuv's wait for them returned EINTR), although the answer may be waiting there. Had
the timeout won, the attempt would go into the history as a timeout and be sent again. So a
timeout, once its time is up, lets the loop poll its sockets once more (a timer GRACE_S on; a
``call_soon`` would run before that poll) and only then gives up. wire.py's ``_time_out``
does this for its exchange, ``timeout_after_a_poll`` for the aiohttp sender's request and
each of httpx's reads and writes (senders.py, guarded_clients.py). tests/test_sender_stall.py
stops a real sending process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

GRACE_S = 0.001  # after its timeout, a request reads what has come once more (one poll)


@asynccontextmanager
async def timeout_after_a_poll(delay: float | None,
                               unless: Callable[[], bool] | None = None) -> AsyncIterator[None]:
    """``asyncio.timeout(delay)`` (TimeoutError), but once ``delay`` is up the block is
    cancelled only after the loop has polled its sockets once more (a timer GRACE_S on), and
    then behind what that poll woke (``call_soon``): a task whose answer came is woken first
    and leaves the block, whatever the time its loop took meanwhile. None: no timeout.
    ``unless``, asked then: True leaves the block uncancelled (it is bounded otherwise)."""
    async with asyncio.timeout(None) as deadline:
        if delay is None:
            yield
            return
        loop = asyncio.get_running_loop()

        timers: list[asyncio.TimerHandle] = []

        def give_up() -> None:
            if unless is None or not unless():
                deadline.reschedule(loop.time())  # now: call_soon, behind the ready callbacks

        def time_up() -> None:
            timers.append(loop.call_later(GRACE_S, give_up))

        timers.append(loop.call_later(delay, time_up))
        try:
            yield
        finally:
            for timer in timers:
                timer.cancel()
