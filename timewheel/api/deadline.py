"""A deadline for every API request, as pure ASGI middleware: a request still unanswered after
``TIMEWHEEL_REQUEST_DEADLINE_SECONDS`` is answered 503 with ``Retry-After``, like a Redis that
refuses.

A single Redis that stops answering is a 503 within the client's socket timeout (5 s,
store/connection.py). A Redis Cluster client retries a silent master by its own rule, reading
the slot map again after each timeout, so a request for that master's slots waited minutes (an
operator's audit measured 160 s for a ``POST /tasks``, 100 s for ``/healthz``), longer than any
client waits. The deadline bounds that, whatever the client library does. The request's work
is cancelled: a write may or may not have been made, as with any answer lost on the way.
A request still sending its body at the deadline is the client's slowness, not Redis's: it
is answered 408, and nothing was written (the app had not read what to write).

One watchdog timer for all requests, not ``asyncio.timeout`` in each: that cost 12-14 us a
request (a timer scheduled and cancelled, and its bookkeeping), ~3 % of a ``POST /tasks``;
the watchdog's dictionary entry 3.6-4 us (``python -m bench.deadline_cost``). A request is
cancelled up to WATCH_S after its deadline.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

WATCH_S = 0.25  # how often the watchdog looks for requests past their deadline


class RequestDeadline:
    """Answers 503 for a request its app has not answered within ``seconds``."""

    def __init__(self, app: ASGIApp, *, seconds: float) -> None:
        self.app = app
        self.seconds = seconds
        self._running: dict[asyncio.Task[object], float] = {}  # -> its deadline, loop time
        self._expired: set[asyncio.Task[object]] = set()  # cancelled by the watchdog
        self._watchdog: asyncio.TimerHandle | None = None
        self._watched: asyncio.AbstractEventLoop | None = None  # the watchdog's loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        if scope["type"] != "http" or task is None:
            await self.app(scope, receive, send)
            return
        loop = task.get_loop()
        before = task.cancelling()  # cancel requests pending on entry (none, under uvicorn)
        self._running[task] = loop.time() + self.seconds
        if self._watchdog is None or self._watched is not loop:  # (tests run loop after loop)
            self._watched = loop
            self._watchdog = loop.call_later(WATCH_S, self._watch, loop)
        answered = receiving = body_whole = False

        async def send_once_started(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
            await send(message)

        async def receive_watched() -> Message:
            # Only a wait for the body's rest counts: a receive after the whole body waits for
            # the client to leave, and a cut there is the app's wait, not the body's.
            nonlocal receiving, body_whole
            receiving = not body_whole
            message = await receive()  # a cancel here leaves ``receiving`` set
            receiving = False
            body_whole = body_whole or not message.get("more_body", False)
            return message

        try:
            await self.app(scope, receive_watched, send_once_started)
        except asyncio.CancelledError:
            # Not the watchdog's (shutdown, a client gone), another cancel came besides it
            # (it stands, as asyncio.timeout lets it), or too late to answer otherwise (the
            # server then closes the connection).
            if task not in self._expired or task.cancelling() > before + 1 or answered:
                raise
        else:
            return
        finally:
            del self._running[task]
            if task in self._expired:  # the watchdog's cancel is taken back in every case,
                self._expired.discard(task)  # an app that swallowed it included
                task.uncancel()
        await self._late(scope, receive, send, body_unread=receiving)

    async def _late(self, scope: Scope, receive: Receive, send: Send, *,
                    body_unread: bool) -> None:
        """The answer to a request cut at its deadline: 408 if it was still waiting for its
        body (and the connection closed, the rest of the body unread), 503 otherwise."""
        within = f"within {self.seconds:g} s"
        if body_unread:
            status, why, headers = 408, "request body not received", {"Connection": "close"}
            detail = f"the request body was not received {within}; nothing was stored"
        else:
            status, why, headers = 503, "Redis slow or unavailable", {"Retry-After": "1"}
            detail = (f"Redis did not answer {within}; try again later (a write may have "
                      "been made: read it back before repeating it)")
        log.warning("%s %s not answered %s (%s): %d", scope["method"], scope["path"], within,
                    why, status)
        await JSONResponse({"detail": detail}, status_code=status, headers=headers)(
            scope, receive, send)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel the requests past their deadline; look again while any is running."""
        now = loop.time()
        for task, deadline in self._running.items():
            if deadline <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        self._watchdog = loop.call_later(WATCH_S, self._watch, loop) if self._running else None
