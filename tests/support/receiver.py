"""A real local HTTP receiver for end-to-end tests (aiohttp.web on 127.0.0.1).

It records every request and answers each path from a script:

    async with Receiver() as r:              # in the test's own event loop
        r.respond("/hook", [500, Reply(503, {"Retry-After": "1"}), 200])
        ...
        await r.wait_for(3, timeout=10)

    with ThreadedReceiver() as r:            # own loop in a thread, for sync tests
        r.wait_for_sync(1, timeout=10)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from aiohttp import web

from tests.support.waiting import settle, wait_until

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Arrival:
    """One request as the receiver saw it; header names are lower-case."""

    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    received_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Reply:
    """A scripted answer: `delay` seconds of silence first (to outlast a client timeout)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    body: bytes = b""


class Receiver:
    """Records requests and replies from per-path scripts; default 200 with an empty body."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []
        self._scripts: dict[str, list[Reply]] = {}
        self._served: dict[str, int] = {}
        self._answered: dict[str, int] = {}  # replies handed to the server to send, per path
        self._open: dict[str, int] = {}  # requests being answered now, per path
        self._peak: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self.port = 0

    # -- scripting and inspection (safe from any thread) --

    def url(self, path: str = "/hook") -> str:
        return f"http://{HOST}:{self.port}{path}"

    def respond(self, path: str, script: Sequence[int | Reply]) -> None:
        """Answer the n-th request to `path` with script[n]; the last entry repeats."""
        if not script:
            raise ValueError("script must not be empty")
        replies = [r if isinstance(r, Reply) else Reply(status=r) for r in script]
        with self._lock:
            self._scripts[path] = replies
            self._served[path] = 0

    @property
    def arrivals(self) -> list[Arrival]:
        """A snapshot of every request so far, in arrival order."""
        with self._lock:
            return list(self._arrivals)

    def arrivals_for(self, path: str) -> list[Arrival]:
        return [a for a in self.arrivals if a.path == path]

    def answered(self, path: str) -> int:
        """How many requests to `path` have had their (scripted, maybe delayed) reply."""
        with self._lock:
            return self._answered.get(path, 0)

    def peak_in_flight(self, path: str) -> int:
        """The most requests to `path` this receiver was answering at the same time."""
        with self._lock:
            return self._peak.get(path, 0)

    def clear(self) -> None:
        with self._lock:
            self._arrivals.clear()

    def _count(self, path: str | None) -> int:
        return len(self.arrivals if path is None else self.arrivals_for(path))

    def _arrived(self, count: int, path: str | None) -> str:
        where = "" if path is None else f" to {path}"
        return f"{count} arrivals{where} (got {self._count(path)})"

    async def wait_for(self, count: int, timeout: float, path: str | None = None) -> None:
        """Return once at least `count` requests (to `path`, if given) have arrived."""
        await wait_until(lambda: self._count(path) >= count,
                         lambda: self._arrived(count, path), timeout)

    def wait_for_sync(self, count: int, timeout: float, path: str | None = None) -> None:
        """Blocking `wait_for`, for sync tests (the server must run in another thread)."""
        settle(lambda: self._count(path) >= count, timeout, lambda: self._arrived(count, path))

    # -- server --

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        with self._lock:
            self._arrivals.append(Arrival(request.path, request.method, headers, body))
            script = self._scripts.get(request.path, [Reply()])
            n = self._served.get(request.path, 0)
            self._served[request.path] = n + 1
            self._open[request.path] = now = self._open.get(request.path, 0) + 1
            self._peak[request.path] = max(now, self._peak.get(request.path, 0))
        try:
            reply = script[min(n, len(script) - 1)]
            if reply.delay > 0 and self._closing is not None:
                # Wake early on shutdown so a hanging reply never holds up cleanup.
                try:
                    await asyncio.wait_for(self._closing.wait(), reply.delay)
                except TimeoutError:
                    pass
            return web.Response(status=reply.status, headers=reply.headers, body=reply.body)
        finally:
            with self._lock:
                self._open[request.path] -= 1
                self._answered[request.path] = self._answered.get(request.path, 0) + 1

    async def start(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._closing = asyncio.Event()
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, HOST, 0).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        await self.stop()


class ThreadedReceiver(Receiver):
    """A Receiver whose server runs on its own event loop in a daemon thread."""

    def __init__(self) -> None:
        super().__init__()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="receiver", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout=10)
        except BaseException:
            self._shutdown_loop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        if self._loop is not None:
            try:
                asyncio.run_coroutine_threadsafe(self.stop(), self._loop).result(timeout=10)
            finally:
                self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        # The async generators are shut down on the receiver's own thread: this thread may
        # have an event loop running already (Playwright's sync API, in the browser tests),
        # and then run_until_complete here raises.
        if thread.is_alive():
            asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        self._loop = self._thread = None
