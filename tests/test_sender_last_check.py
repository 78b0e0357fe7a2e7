"""The aiohttp sender asks the attempt once more when its connection is ready, just before the
request is written: a process stopped while the request waited for its connection (a new one,
or one from the pool) must not send it once its lease has run short (docs/design.md, "The life
of an attempt"). A real local server counts what reaches it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from timewheel.delivery.netguard import NetworkPolicy, NotWritten
from timewheel.delivery.senders import AiohttpSender


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(text="ok", headers={"X-Request-Id": "r-1", "X-Other": "no"})

    app = web.Application()
    app.router.add_post("/{name}", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_a_request_whose_lease_ran_short_is_not_written(
        server: tuple[str, list[str]]) -> None:
    base, seen = server
    sender = AiohttpSender(NetworkPolicy(allow_private=True), max_connections=4)
    try:
        # Control first: the same request with room left is written and answered, and its
        # connection goes back to the pool.
        answer = await sender.send("POST", f"{base}/a", [], b"{}", 5.0, ready=lambda: True)
        assert (answer.status, seen) == (200, ["/a"])
        assert answer.headers == {"x-request-id": "r-1", "content-type":
                                  "text/plain; charset=utf-8", "content-length": "2"}
        assert answer.body == b"ok" and not answer.body_truncated
        # On the pooled connection, and on a new one: not written, nothing arrives.
        with pytest.raises(NotWritten):
            await sender.send("POST", f"{base}/b", [], b"{}", 5.0, ready=lambda: False)
        await sender.send("POST", f"{base}/c", [], b"{}", 5.0)  # no check: written
        assert seen == ["/a", "/c"]
    finally:
        await sender.aclose()
    fresh = AiohttpSender(NetworkPolicy(allow_private=True), max_connections=4)
    try:
        with pytest.raises(NotWritten):
            await fresh.send("POST", f"{base}/d", [], b"{}", 5.0, ready=lambda: False)
        assert seen == ["/a", "/c"]
    finally:
        await fresh.aclose()


async def test_a_request_stalled_after_its_connection_is_not_written(
        server: tuple[str, list[str]]) -> None:
    """aiohttp writes a request with a body in a task of its own, on the next loop iteration
    after the connection is ready: the lease is asked again there, just before the bytes
    leave. Here it has room when the connection is ready and none a moment later (a process
    stopped in between). Control: with room left, the same request is written."""
    base, seen = server
    sender = AiohttpSender(NetworkPolicy(allow_private=True), max_connections=4)
    answers = iter([True, False])
    try:
        with pytest.raises(NotWritten):
            await sender.send("POST", f"{base}/late", [], b'{"a":1}', 5.0,
                              ready=lambda: next(answers))
        assert seen == []
        answer = await sender.send("POST", f"{base}/again", [], b"{}", 5.0, ready=lambda: True)
        assert answer.status == 200 and seen == ["/again"]
    finally:
        await sender.aclose()
