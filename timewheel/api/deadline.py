"""A deadline for every API request, as pure ASGI middleware: a request still unanswered after
``TIMEWHEEL_REQUEST_DEADLINE_SECONDS`` is answered 503 with ``Retry-After``, like a Redis that
refuses.

A single Redis that stops answering is a 503 within the client's socket timeout (5 s,
store/connection.py). A Redis Cluster client retries a silent master by its own rule, reading
the slot map again after each timeout, so a request for that master's slots waited minutes (an
operator's audit measured 160 s for a ``POST /tasks``, 100 s for ``/healthz``), longer than any
client waits. The deadline bounds that, whatever the client library does. The request's work
is cancelled: a write may or may not have been made, as with any answer lost on the way.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


class RequestDeadline:
    """Answers 503 for a request its app has not answered within ``seconds``."""

    def __init__(self, app: ASGIApp, *, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answered = False

        async def send_once_started(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
            await send(message)

        deadline = asyncio.timeout(self.seconds)
        try:
            async with deadline:
                await self.app(scope, receive, send_once_started)
        except TimeoutError:
            # Not ours (a library's own timeout, left unhandled), or too late to answer
            # otherwise (the server then closes the connection).
            if not deadline.expired() or answered:
                raise
            log.warning("%s %s not answered within %g s (Redis slow or unavailable): 503",
                        scope["method"], scope["path"], self.seconds)
            answer = JSONResponse(
                {"detail": f"Redis did not answer within {self.seconds:g} s; try again later "
                           "(a write may have been made: read it back before repeating it)"},
                status_code=503, headers={"Retry-After": "1"})
            await answer(scope, receive, send)
