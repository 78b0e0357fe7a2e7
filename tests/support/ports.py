"""Loopback ports for tests that run beside other pytest-xdist workers.

``free_port()`` (redis_server.py) hands out a port that was free a moment ago: another worker
may bind it before the test's own process does. Where the test can, it binds port 0 itself and
hands the bound socket on; what it cannot, these mend:

- ``refused_port()``: a port nothing listens on, held by the test (bound, never listening) so
  that no other worker's server can take it meanwhile.
- ``on_a_free_port()``: a subprocess that must bind a port by number starts again on a new one
  when another worker took the port first.
- ``listens_on()``: whether the listener on a port is the test's own process, not another
  worker's server that answers there too.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import TypeVar

import psutil

from tests.support.redis_server import HOST, free_port

T = TypeVar("T")


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 where a connection is refused for as long as the block runs: the
    socket is bound and never listens (Linux answers a connect to it with ECONNREFUSED), and
    while it is bound no other process can bind or listen there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        yield int(sock.getsockname()[1])


def listens_on(pid: int, port: int) -> bool:
    """Whether the process ``pid``, or one it started (``bash -c``'s command), listens on TCP
    ``port``. An answer on the port proves less: another worker's server that took the port
    answers there too, while the test's own process has not yet failed to bind it."""
    try:
        parent = psutil.Process(pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for process in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                   for c in process.net_connections("tcp")):
                return True
    return False


def on_a_free_port(start: Callable[[int], T], output: Callable[[], str],
                   port: int | None = None) -> T:
    """``start(port)`` starts a process that binds ``port`` by number, waits until it listens
    there, and raises RuntimeError if it exits instead; ``output()`` is what it printed.

    The port (free_port()'s when ``port`` is None; a port a stopped process gave back is free
    for anyone as well) may be taken by another worker before the process binds it. Then the
    process exits saying "address already in use", and it starts again on a new port from
    free_port(): three tries in all."""
    for tries_left in (2, 1, 0):
        try:
            return start(free_port() if port is None else port)
        except RuntimeError:
            if not tries_left or "address already in use" not in output().lower():
                raise
        port = None
    raise AssertionError("unreachable")
