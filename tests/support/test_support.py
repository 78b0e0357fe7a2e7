"""The test support itself: real redis-server, real cluster, real receiver."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import redis
import redis.cluster

from .ports import listens_on, on_a_free_port, refused_port
from .receiver import Receiver, Reply, ThreadedReceiver
from .redis_server import PortTaken, RedisCluster, RedisServer, free_port


def test_server_keeps_acknowledged_writes_across_sigkill(tmp_path: Path) -> None:
    with RedisServer(tmp_path, appendfsync="always") as server:
        port = server.port
        with redis.Redis.from_url(server.url) as conn:
            conn.set("k", "v")
            conn.zadd("z", {"task": 1_700_000_000_123})
        server.kill()
        assert not server.running
        server.restart()
        assert server.port == port
        with redis.Redis.from_url(server.url) as conn:
            assert conn.get("k") == b"v"
            assert conn.zscore("z", "task") == 1_700_000_000_123
            assert conn.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


def test_a_picked_port_another_server_took_is_given_up(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Another worker's server on the probed port answers PING too; the server must not take
    it for itself (it would run a test on another's data) but start again elsewhere."""
    with RedisServer(tmp_path / "theirs") as theirs:
        picked = iter([theirs.port])
        monkeypatch.setattr(RedisServer, "_pick_port", lambda self: next(picked, free_port()))
        with RedisServer(tmp_path / "ours") as ours:
            assert ours.port != theirs.port and ours.running
            with ours.client() as conn:
                conn.set("mine", 1)
            with theirs.client() as conn:
                assert conn.get("mine") is None
            ours.restart()  # the port it ran on is kept
            with ours.client() as conn:
                assert conn.get("mine") == b"1"


def test_a_port_taken_by_a_plain_socket_is_given_up(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picked = iter([taken.getsockname()[1]])
        monkeypatch.setattr(RedisServer, "_pick_port", lambda self: next(picked, free_port()))
        with RedisServer(tmp_path) as server:
            assert server.port != taken.getsockname()[1] and server.running


def test_a_port_given_by_the_test_is_not_changed(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "theirs") as theirs:
        with pytest.raises(PortTaken):
            RedisServer(tmp_path / "ours", port=theirs.port).start()


def test_a_refused_port_refuses_and_cannot_be_taken() -> None:
    with refused_port() as port:
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError, match="in use"):
                other.bind(("127.0.0.1", port))


def test_listens_on_tells_the_process_listening_from_another() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import socket, sys; s = socket.create_server(('127.0.0.1', 0));"
         " print(s.getsockname()[1], flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        childs = int(child.stdout.readline())
        with socket.create_server(("127.0.0.1", 0)) as ours:
            assert listens_on(child.pid, childs)
            assert not listens_on(child.pid, ours.getsockname()[1])
    finally:
        child.communicate("")


def test_a_start_that_found_its_port_taken_starts_again_on_another() -> None:
    tried: list[int] = []
    said = ""

    def start(port: int) -> int:
        nonlocal said
        tried.append(port)
        if len(tried) == 1:
            said = "error while attempting to bind: address already in use"
            raise RuntimeError("exited")
        return port

    assert on_a_free_port(start, lambda: said, 1) == tried[1]
    assert tried[0] == 1 and tried[1] != 1


def test_a_start_that_failed_otherwise_is_not_tried_again() -> None:
    tried: list[int] = []

    def start(port: int) -> int:
        tried.append(port)
        raise RuntimeError("exited")

    with pytest.raises(RuntimeError, match="exited"):
        on_a_free_port(start, lambda: "no Redis")
    assert len(tried) == 1


async def test_receiver_scripted_statuses_and_delay() -> None:
    before = time.time()
    async with Receiver() as r, aiohttp.ClientSession() as session:
        r.respond("/hook", [500, Reply(503, {"Retry-After": "2"}), 200])
        r.respond("/slow", [Reply(200, delay=5.0), 204])
        statuses = []
        for i in range(4):
            async with session.post(r.url(), data=f"b{i}", headers={"X-Test": "1"}) as resp:
                statuses.append(resp.status)
                if resp.status == 503:
                    assert resp.headers["Retry-After"] == "2"
        assert statuses == [500, 503, 200, 200]

        with pytest.raises(asyncio.TimeoutError):
            timeout = aiohttp.ClientTimeout(total=0.2)
            async with session.get(r.url("/slow"), timeout=timeout):
                pass
        async with session.get(r.url("/slow")) as resp:
            assert resp.status == 204
        async with session.get(r.url("/other")) as resp:
            assert resp.status == 200 and await resp.read() == b""

        await r.wait_for(7, timeout=2)
        after = time.time()
        hooks = r.arrivals_for("/hook")
        assert [a.body for a in hooks] == [b"b0", b"b1", b"b2", b"b3"]
        assert hooks[0].method == "POST" and hooks[0].headers["x-test"] == "1"
        # Stamped when it arrived: in order, between the clock reads around the requests.
        stamps = [a.received_at for a in r.arrivals]
        assert before <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= after
        with pytest.raises(AssertionError, match=r"8 arrivals \(got 7\)"):
            await r.wait_for(8, timeout=0.05)


def test_threaded_receiver_from_sync_code() -> None:
    with ThreadedReceiver() as r:
        r.respond("/hook", [503, 200])
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(urllib.request.Request(r.url(), data=b"x"), timeout=5)
        info.value.close()
        with urllib.request.urlopen(r.url(), timeout=5) as resp:
            assert resp.status == 200
        r.wait_for_sync(2, timeout=2)
        assert [a.method for a in r.arrivals] == ["POST", "GET"]
        # A reply that hangs must not hold up shutdown: it ends before the reply was due.
        r.respond("/hang", [Reply(delay=60)])
        reply_due = time.monotonic() + 60  # at the earliest: the request arrives after this
        with pytest.raises(TimeoutError):
            urllib.request.urlopen(r.url("/hang"), timeout=0.2)
    assert time.monotonic() < reply_due


@pytest.mark.cluster
def test_cluster_spreads_keys_over_masters(tmp_path: Path) -> None:
    with RedisCluster(tmp_path) as cluster:
        keys = [f"{{tw:{i}}}:task" for i in range(16)]
        with redis.cluster.RedisCluster.from_url(cluster.seed_url) as rc:
            for key in keys:
                rc.set(key, key)
            assert [rc.get(key) for key in keys] == [key.encode() for key in keys]
            owners = {rc.get_node_from_key(key).port for key in keys}
        assert owners == {node.port for node in cluster.nodes}
