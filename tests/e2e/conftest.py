"""End-to-end fixtures: real `timewheel serve` processes against a real redis-server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import pytest

from tests.support.ports import listens_on, on_a_free_port
from tests.support.redis_server import RedisServer, free_port
from tests.support.waiting import settle

pytestmark = pytest.mark.e2e


class Service:
    """One `timewheel serve` process. ``redis_url=None`` makes it start its embedded Redis.
    It is told where to listen by ``--host`` and ``--port``, or with ``address_from="env"``
    by TIMEWHEEL_HOST and TIMEWHEEL_PORT."""

    def __init__(self, directory: Path, redis_url: str | None,
                 address_from: Literal["flags", "env"] = "flags", **settings: str) -> None:
        self.directory = directory
        self.address_from = address_from
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEWHEEL_")}
        self.env.update({
            "TIMEWHEEL_ALLOW_PRIVATE_NETWORKS": "true",
            "TIMEWHEEL_DATA_DIR": str(directory / "data"),
            "TIMEWHEEL_LEASE_MARGIN_SECONDS": "2",
        })
        if redis_url:
            self.env["TIMEWHEEL_REDIS_URL"] = redis_url
        self.env.update({f"TIMEWHEEL_{k.upper()}": v for k, v in settings.items()})
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = directory / f"serve-{self.port}.log"
        self.base_url = f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Service:
        """Start the process and return once it is healthy: on its port (kept from a start
        before), or on a new one if another worker's socket took that port meanwhile (CI saw
        a receiver answer in the service's place)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return on_a_free_port(lambda port: self._start(port, timeout), self.log, self.port)

    def _start(self, port: int, timeout: float) -> Service:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "timewheel.cli", "serve", *self._address()],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        settle(self._healthy, timeout, lambda: f"timewheel serve healthy; its log:\n{self.log()}")
        return self

    def _address(self) -> list[str]:
        """Where it listens: flags, or TIMEWHEEL_HOST and TIMEWHEEL_PORT (``address_from``)."""
        if self.address_from == "flags":
            return ["--host", "127.0.0.1", "--port", str(self.port)]
        self.env.update(TIMEWHEEL_HOST="127.0.0.1", TIMEWHEEL_PORT=str(self.port))
        return []

    def _healthy(self) -> bool:
        """This process listens on the port (not another worker's server, which answers there
        while this one has not yet found the port taken: it is not asked) and /healthz answers
        timewheel's 200; raises if the process has exited (then it never will)."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"timewheel serve exited early:\n{self.log()}")
        if not listens_on(self.process.pid, self.port):
            return False
        try:
            answer = httpx.get(f"{self.base_url}/healthz", timeout=1)
            return answer.status_code == 200 and answer.json().get("status") == "ok"
        except (httpx.HTTPError, ValueError):
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=10)

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash). Also ends a SIGSTOPped process."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(timeout)


@pytest.fixture
def redis_server_e2e(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own, so killing or restarting it disturbs no other test."""
    with RedisServer(tmp_path / "redis", appendfsync="always") as server:
        yield server


@pytest.fixture
def services(tmp_path: Path) -> Iterator[list[Service]]:
    """Tests append the Services they start; every one is killed at the end."""
    started: list[Service] = []
    yield started
    for service in started:
        service.kill()


@pytest.fixture
def start_service(tmp_path: Path, services: list[Service], redis_server_e2e: RedisServer):
    """``start_service(**settings)`` starts one more process on the test's Redis;
    ``start_service(redis_url=None)`` uses the embedded Redis in the test's data dir."""
    def start(redis_url: str | None = redis_server_e2e.url, **settings: str) -> Service:
        service = Service(tmp_path, redis_url, **settings)
        services.append(service)
        return service.start()
    return start
