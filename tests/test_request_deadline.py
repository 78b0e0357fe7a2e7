"""api/deadline.py's watchdog against the cancel requests it meets: another cancel that comes
while the app unwinds the watchdog's stays a cancel, and a watchdog cancel the app swallowed
is not left on the task. The app runs in the caller's task (httpx's ASGI transport), as each
request runs in its own under uvicorn; no Redis, no timed assertion."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest
from starlette.responses import JSONResponse

from timewheel.api.deadline import RequestDeadline

PATIENCE_S = 30.0  # a bound on waiting for the watchdog (it looks every WATCH_S), not a timing


def client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=RequestDeadline(app, seconds=0.01))
    return httpx.AsyncClient(transport=transport, base_url="http://t")


async def test_a_cancel_from_elsewhere_while_the_app_unwinds_the_deadline_stays_a_cancel(
        ) -> None:
    """Past its deadline the request is cancelled and its app cleans up (a connection closed,
    say); shutdown cancels the request meanwhile. That cancel must reach the caller, as
    asyncio.timeout let it (it converts its own cancel only when no other is pending); the
    watchdog answered 503 and the task went on."""
    unwinding, cleaned_up = asyncio.Event(), asyncio.Event()

    async def slow_to_unwind(scope: Any, receive: Any, send: Any) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            unwinding.set()
            await cleaned_up.wait()
            raise

    async with client(slow_to_unwind) as http:
        request = asyncio.create_task(http.get("/"))
        await asyncio.wait_for(unwinding.wait(), PATIENCE_S)
        request.cancel()  # shutdown's
        with pytest.raises(asyncio.CancelledError):
            await request


async def test_a_deadline_cancel_the_app_swallowed_is_not_left_on_the_task() -> None:
    """An app (a library in it) swallows the watchdog's CancelledError and answers: the task
    goes on, and must not carry a cancel request nobody will take back (asyncio.timeout
    took its own back in every case): a later TaskGroup or timeout in it reads cancelling()."""
    swallowed = asyncio.Event()

    async def swallows(scope: Any, receive: Any, send: Any) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        swallowed.set()
        await JSONResponse({"late": True})(scope, receive, send)

    async with client(swallows) as http:
        r = await http.get("/")
    assert swallowed.is_set() and r.status_code == 200
    me = asyncio.current_task()
    assert me is not None and me.cancelling() == 0


async def _body_then_silence(first: bytes) -> Any:
    """A request body whose first chunk comes and whose rest never does: a client uploading
    slower than the deadline."""
    yield first
    await asyncio.Event().wait()


async def test_a_body_still_arriving_at_the_deadline_is_a_408_not_redis_unavailable() -> None:
    """The deadline bounds a Redis that does not answer (503, "a write may have been made").
    A request whose body has not all come by then was never in Redis's hands: it is answered
    408 (nothing stored) and its connection closed, as its body's rest was never read."""
    async def reads_its_body(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await JSONResponse({"stored": True}, status_code=201)(scope, receive, send)

    async with client(reads_its_body) as http:
        r = await http.post("/tasks", content=_body_then_silence(b'{"callback_url": '))
    assert r.status_code == 408, r.text
    assert "not received" in r.json()["detail"]
    assert r.headers["connection"] == "close"


async def test_a_request_whose_body_came_whole_is_a_503_at_the_deadline() -> None:
    """The 408 is only for the body's wait: a request that read its body and then waits on
    Redis past the deadline is the 503 it was."""
    async def waits_after_its_body(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await asyncio.Event().wait()  # Redis that never answers

    async with client(waits_after_its_body) as http:
        r = await http.post("/tasks", content=b'{"callback_url": "http://127.0.0.1/"}')
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"


async def test_a_wait_for_the_client_to_leave_after_the_body_is_not_a_slow_body() -> None:
    """After the whole body, a receive waits for the client to disconnect (a library
    listening for it beside the work): cut there at the deadline, the request was waiting
    on its work, so the answer is the 503, not the 408."""
    async def listens_after_its_body(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await receive()  # httpx's transport, like uvicorn, answers only at a disconnect

    async with client(listens_after_its_body) as http:
        r = await http.post("/tasks", content=b"{}")
    assert r.status_code == 503, r.text
