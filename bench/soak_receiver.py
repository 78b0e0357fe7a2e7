"""The soak's receiver: bench/receiver.py's parser, answering by behaviour, naming the sender.

Callback paths choose the answer, counted per webhook-id:

- ``/soak/ok``: 200.
- ``/soak/fail``: 503 to the first ``FAILS`` arrivals of a webhook-id, then 200.
- ``/soak/hang``: the first arrival is held ``hang_s`` (longer than the task timeout) and then
  the connection is closed without an answer; later ones get 200.

Which process sent an arrival: when a connection is accepted, the receiver looks up which of the
live serve processes owns the other end (``psutil.Process(pid).net_connections()``: the socket
whose local port is the connection's peer port and whose remote port is ours) and keeps the
answer for the connection's life. The lookup runs at accept, while the sender necessarily holds
the socket; only the serve processes are searched, so it costs a few ms per new connection, and
connections are kept alive. ``pid`` is None when no live serve process owns it (it was killed
between connect and accept).

It runs on its own thread and event loop so that the load's client work does not delay the
arrival timestamps.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import psutil

from bench.receiver import _Connection, _response, require_loopback
from bench.soak_history import History

FAILS = 2
HUNG = 0  # "answered" of an arrival held past the timeout and never answered


def peer_pid(candidates: list[int], peer_port: int, own_port: int) -> int | None:
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


class _SoakState:
    def __init__(self, history: History, pids: Callable[[], list[int]], hang_s: float) -> None:
        self.history = history
        self.pids = pids
        self.hang_s = hang_s
        self.port = 0
        self.seen: dict[str, int] = {}
        self.ok = _response(200, b"ok")
        self.fail = _response(503, b"try again")


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
        self.pid = peer_pid(self.soak.pids(), int(peer[1]), self.soak.port) if peer else None

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
        soak.history.add("arrival", t=arrival, key=key, attempt=attempt,
                         scheduled_at=parse_rfc3339(headers.get("timewheel-scheduled-at")),
                         answered=status, pid=self.pid, path=path)


def parse_rfc3339(value: str | None) -> float | None:
    if not value:
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class SoakReceiver:
    """``with SoakReceiver(history, pids, hang_s) as r: r.url("ok")``; its own thread."""

    def __init__(self, history: History, pids: Callable[[], list[int]], hang_s: float,
                 host: str = "127.0.0.1") -> None:
        require_loopback(host)
        self.host = host
        self.state = _SoakState(history, pids, hang_s)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="soak-receiver",
                                        daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def url(self, behaviour: str) -> str:
        return f"http://{self.host}:{self.state.port}/soak/{behaviour}"

    async def _start(self) -> None:
        self._server = await self._loop.create_server(
            lambda: _SoakConnection(self.state), self.host, 0, backlog=1024)
        self.state.port = int(self._server.sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> SoakReceiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
