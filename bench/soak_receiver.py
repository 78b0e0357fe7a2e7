"""The soak's receiver: bench/receiver.py's parser, answering by behaviour, naming the sender.

    python -m bench.soak_receiver --port 0 --out ARRIVALS.jsonl --hang 3

Callback paths choose the answer, counted per webhook-id:

- ``/soak/ok``: 200.
- ``/soak/fail``: 503 to the first ``FAILS`` arrivals of a webhook-id, then 200.
- ``/soak/hang``: the first arrival is held ``--hang`` seconds (longer than the task timeout)
  and then the connection is closed without an answer; later ones get 200.

Which process sent an arrival: within 5 ms of accepting a connection, the receiver looks up
which serve process (a child of bench/soak.py running timewheel) owns the other end:
``psutil.Process(pid).net_connections()``, the socket whose local port is the connection's
peer port and whose remote port is ours. One look serves every connection accepted since the
last one, so a burst of new connections costs one pass, and the answer is kept for the
connection's life (connections are kept alive). Requests are answered at once; their records
wait for the look. A live sender still holds its socket then; ``pid`` is None when no live
process owns it: the sender was killed (its request is still read from the socket), or it
had already given up and closed it.

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

import psutil  # type: ignore[import-untyped, unused-ignore]  # ships no stubs: types-psutil

from bench.common import require_loopback, run
from bench.receiver import _Connection, _response

FAILS = 2
HUNG = 0  # "answered" of an arrival held past the timeout and never answered
HEARTBEAT_S = 0.05
STALL_S = 0.25
RESOLVE_S = 0.005


def peer_pids(candidates: list[int], own_port: int) -> dict[int, int]:
    """Local port -> pid, for the ``candidates``' sockets connected to ``own_port``."""
    found: dict[int, int] = {}
    for pid in candidates:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for conn in conns:
            if conn.laddr and conn.raddr and conn.raddr.port == own_port:
                found[conn.laddr.port] = pid
    return found


def serve_processes() -> list[int]:
    """The serve processes among bench/soak.py's children (not this one, not redis-server)."""
    out = []
    for child in psutil.Process(os.getppid()).children():
        try:
            if "timewheel" in " ".join(child.cmdline()):
                out.append(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


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
        self.unresolved: list[_SoakConnection] = []
        self.port = 0
        self.seen: dict[str, int] = {}
        self.ok = _response(200, b"ok")
        self.fail = _response(503, b"try again")

    def resolve(self) -> None:
        """One look at the serve processes' sockets for every connection accepted since the
        last one (a burst of new connections costs one pass, not one each)."""
        conns, self.unresolved = self.unresolved, []
        found = peer_pids(self.siblings, self.port)
        if any(c.peer not in found for c in conns):  # a process started since the last look
            self.siblings = serve_processes()
            found = peer_pids(self.siblings, self.port)
        for conn in conns:
            conn.resolved(found.get(conn.peer))

    def add(self, type_: str, **fields: Any) -> None:
        self.out.write(json.dumps({"type": type_, **fields}) + "\n")


class _SoakConnection(_Connection):
    """bench/receiver.py's HTTP/1.1 parsing; the answer and the record are the soak's."""

    __slots__ = ("done", "peer", "pid", "soak", "waiting")

    def __init__(self, soak: _SoakState) -> None:
        super().__init__(state=None)  # type: ignore[arg-type]  # _handle is ours
        self.soak = soak
        self.pid: int | None = None
        self.peer = 0
        self.done = False  # the sender's pid is known (or known to be gone)
        self.waiting: list[dict[str, Any]] = []  # arrivals recorded once it is

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.peer = int(peer[1]) if peer else 0
        self.soak.unresolved.append(self)

    def resolved(self, pid: int | None) -> None:
        self.pid, self.done = pid, True
        for fields in self.waiting:
            self.soak.add("arrival", **fields, pid=pid)
        self.waiting.clear()

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
        fields = {"t": arrival, "key": key, "attempt": attempt, "answered": status,
                  "scheduled_at": parse_rfc3339(headers.get("timewheel-scheduled-at")),
                  "path": path}
        if self.done:
            soak.add("arrival", **fields, pid=self.pid)
        else:
            self.waiting.append(fields)


async def _heartbeat(state: _SoakState) -> None:
    last = time.time()
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        now = time.time()
        if now - last > STALL_S:
            state.add("receiver_stall", start=last, end=now)
        last = now


async def _resolver(state: _SoakState) -> None:
    while True:
        await asyncio.sleep(RESOLVE_S)
        if state.unresolved:
            state.resolve()


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
        resolver = loop.create_task(_resolver(state))
        await stop.wait()
        beat.cancel()
        resolver.cancel()
        if state.unresolved:
            state.resolve()
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
