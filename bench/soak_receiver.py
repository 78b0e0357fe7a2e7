"""The soak's receiver: bench/receiver.py's parser, answering by behaviour, naming the sender.

    python -m bench.soak_receiver --port 0 --out ARRIVALS.jsonl --hang 3

Callback paths choose the answer, counted per webhook-id:

- ``/soak/ok``: 200.
- ``/soak/fail``: 503 to the first ``FAILS`` arrivals of a webhook-id, then 200.
- ``/soak/hang``: the first arrival is held ``--hang`` seconds (longer than the task timeout)
  and then the connection is closed without an answer; later ones get 200.

Which process sent an arrival: when a connection is accepted, the receiver looks up which
process owns the other end among its siblings, the children of bench/soak.py (the serve
processes and the redis-servers): ``psutil.Process(pid).net_connections()``, the socket whose
local port is the connection's peer port and whose remote port is ours. The answer is kept for
the connection's life (connections are kept alive, so this costs a few ms now and then). The
lookup runs at accept: a live sender necessarily still holds the socket. ``pid`` is None when
no live process owns it: the sender was killed after it connected and before the accept (its
request still sits in the socket and is read).

It is a process of its own, so the load's work and the fault injector (which forks restarts)
never hold its interpreter. It still shares the machine's CPUs: a heartbeat every 50 ms writes
a ``receiver_stall`` record when the loop did not run for more than 0.25 s, because a request
read late may have been answered after its sender had given up (bench/soak_check.py).
Arrivals are JSON lines in ``--out`` (line-buffered, written as they happen).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from datetime import datetime
from typing import IO, Any

import psutil

from bench.common import run
from bench.receiver import _Connection, _response, require_loopback

FAILS = 2
HUNG = 0  # "answered" of an arrival held past the timeout and never answered
HEARTBEAT_S = 0.05
STALL_S = 0.25


def peer_pid(candidates: list[int], peer_port: int, own_port: int) -> int | None:
    """The pid among ``candidates`` whose socket is the other end of our connection."""
    for pid in candidates:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for conn in conns:
            if conn.laddr and conn.laddr.port == peer_port and conn.raddr \
                    and conn.raddr.port == own_port:
                return pid
    return None


def parse_rfc3339(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class _SoakState:
    def __init__(self, out: IO[str], hang_s: float) -> None:
        self.out = out
        self.hang_s = hang_s
        self.siblings: list[int] = []
        self.port = 0
        self.seen: dict[str, int] = {}
        self.ok = _response(200, b"ok")
        self.fail = _response(503, b"try again")

    def sender(self, peer_port: int) -> int | None:
        pid = peer_pid(self.siblings, peer_port, self.port)
        if pid is None:  # a process started since the last look
            me = os.getpid()
            self.siblings = [c.pid for c in psutil.Process(os.getppid()).children()
                             if c.pid != me]
            pid = peer_pid(self.siblings, peer_port, self.port)
        return pid

    def add(self, type_: str, **fields: Any) -> None:
        self.out.write(json.dumps({"type": type_, **fields}) + "\n")


class _SoakConnection(_Connection):
    """bench/receiver.py's HTTP/1.1 parsing; the answer and the record are the soak's."""

    __slots__ = ("pid", "soak")

    def __init__(self, soak: _SoakState) -> None:
        super().__init__(state=None)  # type: ignore[arg-type]  # _handle is ours
        self.soak = soak
        self.pid: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.pid = self.soak.sender(int(peer[1])) if peer else None

    def _handle(self, arrival: float, method: str, target: str, keep: bool,
                headers: dict[str, str]) -> None:
        soak, transport = self.soak, self.transport
        assert transport is not None
        key = headers.get("webhook-id", "")
        n = soak.seen.get(key, 0)
        soak.seen[key] = n + 1
        path = target.split("?", 1)[0]
        if path == "/soak/hang" and n == 0:
            status = HUNG
            loop = asyncio.get_running_loop()
            loop.call_later(soak.hang_s, transport.close)
            self.transport = None  # nothing more is read or written on this connection
        elif path == "/soak/fail" and n < FAILS:
            status = 503
            transport.write(soak.fail)
        else:
            status = 200
            transport.write(soak.ok)
        if status != HUNG and not keep:
            transport.close()
            self.transport = None
        try:
            attempt: int | None = int(headers.get("timewheel-attempt", ""))
        except ValueError:
            attempt = None
        soak.add("arrival", t=arrival, key=key, attempt=attempt,
                 scheduled_at=parse_rfc3339(headers.get("timewheel-scheduled-at")),
                 answered=status, pid=self.pid, path=path)


async def _heartbeat(state: _SoakState) -> None:
    last = time.time()
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        now = time.time()
        if now - last > STALL_S:
            state.add("receiver_stall", start=last, end=now)
        last = now


async def _serve(args: argparse.Namespace) -> int:
    require_loopback(args.host)
    with open(args.out, "a", buffering=1) as out:
        state = _SoakState(out, args.hang)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _SoakConnection(state), args.host, args.port,
                                          backlog=1024)
        state.port = int(server.sockets[0].getsockname()[1])
        print(f"LISTENING {state.port}", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        beat = loop.create_task(_heartbeat(state))
        await stop.wait()
        beat.cancel()
        server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak_receiver")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--hang", type=float, required=True, help="seconds a hung answer is held")
    return run(_serve(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
