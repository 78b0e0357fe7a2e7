"""A local asyncio TCP server for tests that script an HTTP peer byte by byte (a receiver that
never answers, drips, or answers late): only the handler differs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(handle: Handler) -> AsyncIterator[str]:
    """``handle`` serves each connection on 127.0.0.1; yields the server's base URL. A peer
    gone mid-way (IncompleteReadError, ConnectionError) ends its connection quietly; each
    connection is closed when its handler returns, and any still open at the end."""
    connections: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            await handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in connections:
            writer.close()
        await server.wait_closed()
