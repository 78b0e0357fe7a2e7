"""Waiting for something to happen, the one way the tests do it: bounded polling of a
condition, failing with what was awaited (never a timed assertion: how long it took is not
checked, only that it happened within a generous bound).

``wait_until`` in async tests (the condition may be a coroutine function), ``settle`` for code
that runs in threads or against real processes (e2e, browser): same rules, blocking.

``what`` may be a function, called only on failure, for a message that needs the state of
the moment (a process's log, the statuses seen on the way). A condition may raise to stop
the wait at once, e.g. when the process it waits on has exited.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
What = str | Callable[[], str]

POLL_SECONDS = 0.005
BLOCKING_POLL_SECONDS = 0.05


def _said(what: What) -> str:
    return what if isinstance(what, str) else what()


async def wait_until(predicate: Callable[[], bool | Awaitable[bool]], what: What,
                     timeout: float = 20.0) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() > give_up:
            raise AssertionError(f"timed out after {timeout}s waiting for {_said(what)}")
        await asyncio.sleep(POLL_SECONDS)


def settle(probe: Callable[[], T | None], timeout: float, what: What) -> T:
    """Poll ``probe`` until it returns something truthy, and return that; fail with ``what``
    (and the last value seen) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(BLOCKING_POLL_SECONDS)
    raise AssertionError(f"timed out after {timeout}s waiting for {_said(what)}; "
                         f"last: {last!r}")
