"""Request size limit as pure ASGI middleware: it counts bytes as they arrive, so an oversized
body is refused (413) before it is read whole, whatever Content-Length claims or omits."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await refuse(send, self.max_bytes)
            return
        guard = _Guard(receive, send, self.max_bytes)
        try:
            await self.app(scope, guard.receive, guard.send)
        except Exception:
            if not guard.refused:
                raise


class _Guard:
    """Counts a request's body bytes. Past the limit it answers 413 itself, tells the app the
    client left (so it stops reading) and drops whatever the app sends after that."""

    def __init__(self, receive: Receive, send: Send, max_bytes: int) -> None:
        self._receive, self._send, self._max = receive, send, max_bytes
        self.received = 0
        self.refused = False
        self.started = False

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self._max and not self.started:
                self.refused = True
                await refuse(self._send, self._max)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)


async def refuse(send: Send, max_bytes: int) -> None:
    body = json.dumps({"detail": [{
        "type": "too_large", "loc": ["body"], "msg": f"request body is over {max_bytes} bytes",
    }]}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
