"""The partition forwarder (tests/support/partition_proxy.py) against a real redis-server:
commands pass through it; while it is partitioned a command neither reaches Redis nor is
answered; once healed, a command whose client closed normally meanwhile runs (a kernel
retransmits what it sent before its FIN), one whose client aborted (RST) does not."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.partition_proxy import PartitionProxy, forwarding
from tests.support.redis_server import RedisServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    started = RedisServer(tmp_path / "redis").start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[PartitionProxy]:
    with forwarding(server.port) as forwarder:
        yield forwarder


def wait_for(probe: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.02)


def test_commands_pass_through(server: RedisServer, proxy: PartitionProxy) -> None:
    client = redis.Redis.from_url(proxy.url, socket_timeout=5)
    assert client.set("k", "v") and client.get("k") == b"v"
    client.close()


def test_a_partition_holds_a_command_until_it_heals(server: RedisServer,
                                                    proxy: PartitionProxy) -> None:
    direct = server.client()
    through = redis.Redis.from_url(proxy.url, socket_timeout=0.3)
    through.ping()  # connected before the cut, as a running service is
    proxy.partition()
    with pytest.raises(redis.TimeoutError):
        through.set("k", "during")
    through.close()  # the client gave up, as redis-py does after its socket timeout
    # a fresh connection during the cut: accepted, but nothing reaches Redis
    raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    raw.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nj\r\n$6\r\nduring\r\n")
    time.sleep(0.3)
    assert direct.get("k") is None and direct.get("j") is None
    proxy.heal()
    wait_for(lambda: direct.get("k") == b"during")  # the abandoned command runs now
    assert raw.recv(5) == b"+OK\r\n"
    raw.close()
    direct.close()


def test_a_command_whose_client_aborted_during_the_partition_is_dropped(
        server: RedisServer, proxy: PartitionProxy) -> None:
    """As a kernel drops unacknowledged data on an abortive close (SO_LINGER 0); the command
    sent before the cut went through."""
    direct = server.client()
    raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    raw.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$6\r\nbefore\r\n")
    assert raw.recv(5) == b"+OK\r\n"
    proxy.partition()
    raw.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$6\r\nduring\r\n")
    time.sleep(0.3)  # the proxy has read it (and holds it) before the reset comes
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()  # the reset is in the proxy's socket when this returns (loopback)
    proxy.heal()
    wait_for(lambda: proxy.joined == 0)  # its Redis side closed, with nothing written
    assert direct.get("a") == b"before" and direct.get("k") is None
    direct.close()
