"""Request ids as pure ASGI middleware: every response carries ``X-Request-ID``, and every log
record emitted while the request is served carries it as ``request_id`` (timewheel.logs).

An incoming ``X-Request-ID`` (from a proxy, a load balancer or the client) is kept when it is
short and made of safe characters, so one id follows a request through every hop; otherwise
(absent, too long, odd characters that could forge log lines or headers) a fresh one replaces
it. Pure ASGI rather than Starlette's ``BaseHTTPMiddleware``: no extra task, no response
streaming through a memory channel, so the POST path pays a header scan, a random id and one
context variable set.
"""

from __future__ import annotations

import os
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from timewheel.logs import REQUEST_ID

HEADER = b"x-request-id"
MAX_LENGTH = 128
# UUIDs, ULIDs, hex and base64 trace ids, "<host>:<n>" counters: all fit. No spaces, quotes,
# CR/LF or control characters, which could break a log line or a header.
VALID = re.compile(rb"[A-Za-z0-9._:+/=-]{1,%d}" % MAX_LENGTH)


def new_request_id() -> str:
    """A fresh id: 128 random bits in hex (as unique as a UUID4, cheaper to make)."""
    return os.urandom(16).hex()


def incoming_request_id(scope: Scope) -> str | None:
    """The request's own ``X-Request-ID`` when it is acceptable, else None."""
    for name, value in scope["headers"]:
        if name == HEADER:
            return value.decode("ascii") if VALID.fullmatch(value) else None
    return None


class RequestId:
    """Accepts or makes the request's id, binds it in ``timewheel.logs.REQUEST_ID`` and adds it
    to the response's headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = incoming_request_id(scope) or new_request_id()
        header = (HEADER, request_id.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        token = REQUEST_ID.set(request_id)
        # Reset only on a normal return. When the app raises, the server logs the error after
        # this returns, in the same task (uvicorn runs each request in a task of its own): the
        # id left in place puts `request_id` on that traceback's record too.
        await self.app(scope, receive, send_with_id)
        REQUEST_ID.reset(token)
