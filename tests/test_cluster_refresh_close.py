"""WheelCluster.aclose while a slot-map refresh is under way (connection.py): the refresh is
shielded from its callers, so the owner's close must end it, or it finishes after the close
and leaves the client open again (redis-py's ``_initialize`` False: its connections kept, the
"Unclosed RedisCluster client" warning at collection)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ConnectionError

from timewheel.store.connection import make_redis


async def test_a_refresh_under_way_does_not_reopen_a_closed_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    client: Any = make_redis("redis://127.0.0.1:1", cluster=True)
    go_on = asyncio.Event()
    refreshes: list[str] = []

    async def slow_refresh(self: Any, *args: Any, **kwargs: Any) -> None:
        refreshes.append("refresh")
        await go_on.wait()  # a silent master's socket timeout, say

    async def parsed(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(type(client.nodes_manager), "initialize", slow_refresh)
    monkeypatch.setattr(client.commands_parser, "initialize", parsed)
    caller = asyncio.create_task(client.initialize())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert refreshes == ["refresh"]
    await client.aclose()  # the owner's close (shutdown) while the refresh waits
    go_on.set()
    (answer,) = await asyncio.gather(caller, return_exceptions=True)
    # The caller was not cancelled: it hears of the close as a Redis error (a 503), not as a
    # cancellation it never asked for.
    assert isinstance(answer, ConnectionError), answer
    for _ in range(5):
        await asyncio.sleep(0)
    assert client._initialize is True, "the refresh reopened the client after its close"
