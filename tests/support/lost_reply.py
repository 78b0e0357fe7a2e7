"""A script call whose first reply is lost: the call runs in Redis, then the client sees the
socket timeout, as when Redis stalls past it. For the tests of what is sent again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

Script = Callable[..., Awaitable[Any]]


def first_reply_lost(script: Script, on_loss: Callable[[], None] = lambda: None
                     ) -> tuple[Script, list[list[Any]]]:
    """``script`` wrapped, and the list of the arguments of each call made through it.
    ``on_loss`` runs between the first call's run and its timeout (a clock moved on)."""
    sent: list[list[Any]] = []

    async def call(*, keys: list[str], args: list[Any]) -> Any:
        sent.append(list(args))
        reply = await script(keys=keys, args=args)
        if len(sent) == 1:
            on_loss()
            raise RedisTimeoutError("Timeout reading from socket (injected after it ran)")
        return reply

    return call, sent
