"""All three senders (TIMEWHEEL_HTTP_CLIENT=wire, aiohttp and httpx): a process stopped
(SIGSTOP: a frozen VM, a CPU it does not get) while its request is out, past the request's
timeout, while the receiver answers. When it runs again, uvloop's wait for the sockets returns
EINTR and the loop runs its expired timers before it reads them; the answer waiting in the
socket must still win over the timeout that expired meanwhile, or the attempt is recorded as a
timeout and sent again (a duplicate: an outside audit found it for wire in session 23, then
for the other two). And the timeout still ends a request nothing answers."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from tests.support.local_server import serving
from tests.support.receiver import Reply, ThreadedReceiver
from tests.support.waiting import settle
from timewheel.delivery.netguard import NetworkPolicy
from timewheel.delivery.senders import SendError, make_sender

SEND = """
import asyncio, sys, time, uvloop
from timewheel.delivery.netguard import NetworkPolicy
from timewheel.delivery.senders import SendError, make_sender

async def main():
    sender = make_sender(sys.argv[1], NetworkPolicy(allow_private=True), max_connections=1)
    if sys.argv[3] == "busy":  # other timers that expired meanwhile take the loop's time
        asyncio.get_running_loop().call_later(1.0, time.sleep, 0.01)
    try:
        answer = await sender.send("POST", sys.argv[2], [], b"{}", 1.0)
        print("status", answer.status, flush=True)
    except SendError as exc:
        print("error", exc.kind, flush=True)
    await sender.aclose()

uvloop.run(main())
"""


@pytest.mark.parametrize("loop", ["quiet", "busy"])
@pytest.mark.parametrize("kind", ["wire", "aiohttp", "httpx"])
def test_an_answer_that_came_while_the_process_was_stopped_beats_the_timeout(
        receiver: ThreadedReceiver, kind: str, loop: str) -> None:
    """"busy": another timer that expired meanwhile holds the loop 10 ms first, past the
    1 ms a timeout waits for the loop to poll its sockets (timewheel/delivery/grace.py): the
    answer that poll reads must still win."""
    receiver.respond("/stalled", [Reply(delay=0.3)])
    sending = subprocess.Popen(
        [sys.executable, "-c", SEND, kind, receiver.url("/stalled"), loop],
        stdout=subprocess.PIPE, text=True)
    try:
        settle(lambda: len(receiver.arrivals_for("/stalled")) == 1, 30,
               lambda: "the request to arrive")
        os.kill(sending.pid, signal.SIGSTOP)
        # Stopped past the send's 1 s timeout; the receiver answers 0.3 s after the request.
        time.sleep(1.5)
        os.kill(sending.pid, signal.SIGCONT)
        out, _ = sending.communicate(timeout=30)
    finally:
        sending.kill()
        sending.wait()
    assert out.split() == ["status", "200"], out


HELD = """
import asyncio, sys, time, uvloop
from timewheel.delivery.netguard import NetworkPolicy
from timewheel.delivery.senders import SendError, make_sender

async def answer_held(reader, writer):
    await reader.readuntil(b"\\r\\n\\r\\n")
    await reader.readexactly(2)
    time.sleep(1.5)  # the loop is held past the send's 1 s timeout
    await asyncio.sleep(0)  # the answer comes in the next turn, once its expired timers ran
    writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
    slow()  # and each turn from then on takes 2 ms
    await asyncio.sleep(30)

def slow():
    time.sleep(0.002)
    asyncio.get_running_loop().call_soon(slow)

async def main():
    server = await asyncio.start_server(answer_held, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/held"
    sender = make_sender(sys.argv[1], NetworkPolicy(allow_private=True), max_connections=1)
    try:
        answer = await sender.send("POST", url, [], b"{}", 1.0)
        print("status", answer.status, flush=True)
    except SendError as exc:
        print("error", exc.kind, flush=True)
    await sender.aclose()

uvloop.run(main())
"""


@pytest.mark.parametrize("kind", ["wire", "aiohttp", "httpx"])
def test_an_answer_read_in_the_grace_wins_however_many_turns_the_rest_takes(kind: str) -> None:
    """A loaded machine: the sending loop is held past the 1 s timeout (by its receiver, in
    the same loop, which answers meanwhile), then each turn takes 2 ms. The grace's one poll
    reads the answer; the steps after that read must not time out, however many turns they
    take (httpcore yields at its locks: the whole-exchange bound cancelled httpx there,
    found by CI's load)."""
    out = subprocess.run([sys.executable, "-c", HELD, kind], stdout=subprocess.PIPE,
                         text=True, timeout=30, check=True).stdout
    assert out.split() == ["status", "200"], out


@pytest.fixture
async def silent_then_ok() -> AsyncIterator[str]:
    """A local server whose first connection reads the request and never answers; each later
    one answers 200. Its URL."""
    connections = itertools.count()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = next(connections) == 0
        while await reader.readuntil(b"\r\n\r\n"):
            await reader.readexactly(2)  # the request's body: b"{}"
            if first:
                await reader.read()  # until the client closes
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    async with serving(handle) as base:
        yield f"{base}/hook"


@pytest.mark.parametrize("kind", ["aiohttp", "httpx", "wire"])
async def test_a_receiver_that_never_answers_is_still_a_timeout(
        silent_then_ok: str, kind: str) -> None:
    """The timeout that lets a waiting answer win still ends a request nothing answers; the
    sender is fine afterwards (control: the next request is answered)."""
    sender = make_sender(kind, NetworkPolicy(allow_private=True), max_connections=1)
    try:
        with pytest.raises(SendError) as caught:
            await sender.send("POST", silent_then_ok, [], b"{}", 0.2)
        assert caught.value.kind == "timeout"
        assert (await sender.send("POST", silent_then_ok, [], b"{}", 10.0)).status == 200
    finally:
        await sender.aclose()


@pytest.fixture(params=["slow", "fast"])
async def dripping(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A local server that answers 200 with a body dripped past a 1 s timeout: "slow", 20
    bytes one every 0.1 s (each well within the timeout); "fast", after 0.9 s, 60,000 bytes
    one each turn of the loop (each read past the timeout finds a byte waiting). Its URL and
    an event set when it has written the whole body."""
    whole = asyncio.Event()
    size, first, every = (20, 0.1, 0.1) if request.param == "slow" else (60_000, 0.9, 0.0)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        await writer.drain()
        await asyncio.sleep(first)
        for _ in range(size):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(every)
        whole.set()

    async with serving(handle) as base:
        yield f"{base}/hook", whole


@pytest.mark.parametrize("kind", ["aiohttp", "httpx", "wire"])
async def test_an_answer_dripped_past_the_timeout_does_not_hold_the_attempt(
        dripping: tuple[str, asyncio.Event], kind: str) -> None:
    """A request's timeout bounds the whole exchange, not each read: a receiver that sends
    its answer a byte at a time would otherwise hold an attempt past its lease, when another
    process may send the task again while this one is still out. The send ends before the
    receiver has written the whole answer: a timeout (wire, httpx), or the status with the
    body cut at what had come (aiohttp reads what is there, then drops the connection).
    "fast": the grace that lets an answer already waiting win does not let a receiver that
    keeps a few bytes waiting go on (httpx: ExchangeEnd.LATE_OPERATIONS)."""
    url, whole = dripping
    sender = make_sender(kind, NetworkPolicy(allow_private=True), max_connections=1)
    try:
        try:
            answer = await sender.send("POST", url, [], b"{}", 1.0)
            outcome = f"{answer.status} cut={answer.body_truncated}"
        except SendError as exc:
            outcome = exc.kind
        assert not whole.is_set(), f"held until the whole answer came: {outcome}"
        assert outcome in ("timeout", "200 cut=True")
    finally:
        await sender.aclose()
