"""A process stopped (SIGSTOP: a frozen VM, a CPU it does not get) while its request is out,
past the request's timeout, while the receiver answers. When it runs again, the event loop's
wait for the sockets returns EINTR, and libuv runs the expired timers before it reads them:
the timeout fired first, and the attempt went into the history as a timeout and was sent
again, although its 200 had come (an outside audit, session 23). The sender now reads what
has come before it gives up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.support.receiver import Reply, ThreadedReceiver
from tests.support.waiting import settle

SEND = """
import asyncio, sys, uvloop
from timewheel.delivery.netguard import NetworkPolicy
from timewheel.delivery.wire import SendError, WireSender

async def main():
    sender = WireSender(NetworkPolicy(allow_private=True), max_connections=1)
    try:
        answer = await sender.send("POST", sys.argv[1], [], b"{}", 1.0)
        print("status", answer.status, flush=True)
    except SendError as exc:
        print("error", exc.kind, flush=True)
    await sender.aclose()

uvloop.run(main())
"""


def test_an_answer_that_came_while_the_process_was_stopped_beats_the_timeout(
        receiver: ThreadedReceiver) -> None:
    receiver.respond("/stalled", [Reply(delay=0.3)])
    sending = subprocess.Popen([sys.executable, "-c", SEND, receiver.url("/stalled")],
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
