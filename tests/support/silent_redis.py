"""A Redis that answers nothing, for the tests of what the service's client does then: the
socket timeout shortened, and the sockets the client opens counted (redis-py opens a new one
for each try after a failed one)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from redis.asyncio.connection import Connection

from timewheel.store import connection

SOCKET_TIMEOUT = 0.3


def count_dials(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Shortens the service client's socket timeout (for clients made after this) and counts
    the sockets its connections open; the returned function reads the count."""
    monkeypatch.setattr(connection, "SOCKET_TIMEOUT", SOCKET_TIMEOUT)
    dials = 0
    dial = Connection._connect

    async def counted(self: Connection) -> None:
        nonlocal dials
        dials += 1
        await dial(self)

    monkeypatch.setattr(Connection, "_connect", counted)
    return lambda: dials
