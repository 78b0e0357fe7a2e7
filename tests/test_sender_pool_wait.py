"""All three senders: a send's timeout bounds its whole exchange, however long it waits for a
connection of the pool. httpcore's pool hands one idle keep-alive connection to every request
queued for its origin; all but the first then find it taken (ConnectionNotAvailable) and wait
again, each time for a whole pool timeout (the send's timeout) from then. Past the send's end
that wait's connection then writes the request (its operations' polls past the end), which no
answer can follow: recorded as a timeout, the task is sent again, a duplicate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.support.local_server import serving
from timewheel.delivery.netguard import NetworkPolicy
from timewheel.delivery.senders import SendError, make_sender


@pytest.fixture
async def answers_after() -> AsyncIterator[tuple[str, list[tuple[str, float]]]]:
    """A local keep-alive server that answers each POST /<seconds> (body b"{}") 200 after
    that many seconds; its base URL and the (path, loop time) of each request it read."""
    arrivals: list[tuple[str, float]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            path = head.split()[1].decode()
            arrivals.append((path, asyncio.get_running_loop().time()))
            await asyncio.sleep(float(path.lstrip("/")))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    async with serving(handle) as base:
        yield base, arrivals


@pytest.mark.parametrize("kind", ["wire", "aiohttp", "httpx"])
async def test_a_send_waiting_for_a_pooled_connection_ends_at_its_timeout(
        answers_after: tuple[str, list[tuple[str, float]]], kind: str) -> None:
    """One connection: the first send holds it 0.3 s while a 5 s send and then a 1 s one
    queue. When it comes free both are handed it; the 5 s send takes it and is answered at
    ~1.2 s. The 1 s send must end at its timeout, without writing its request after that."""
    base, arrivals = answers_after
    sender = make_sender(kind, NetworkPolicy(allow_private=True), max_connections=1)
    loop = asyncio.get_running_loop()

    async def send(seconds: float, timeout: float, start: float) -> tuple[str, float, float]:
        await asyncio.sleep(start)
        began = loop.time()
        try:
            outcome = str((await sender.send("POST", f"{base}/{seconds}", [], b"{}",
                                             timeout)).status)
        except SendError as exc:
            outcome = exc.kind
        return outcome, began, loop.time()

    try:
        first, long, short = await asyncio.gather(
            send(0.3, 5.0, 0.0), send(0.9, 5.0, 0.01), send(0.5, 1.0, 0.02))
    finally:
        await sender.aclose()
    assert (first[0], long[0], short[0]) == ("200", "200", "timeout")
    _, began, ended = short
    assert ended - began < 1.1, f"the 1 s send took {ended - began:.3f} s"
    late = [(path, at - began) for path, at in arrivals if path == "/0.5"]
    assert all(after < 1.0 for _, after in late), f"written past its timeout: {late}"
