"""Where a real ``timewheel serve`` listens: TIMEWHEEL_HOST / TIMEWHEEL_PORT, as ``serve --help``
promises for every setting, and a flag wins over the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.redis_server import RedisServer, free_port
from tests.support.waiting import settle

pytestmark = pytest.mark.e2e


def _serve(tmp_path: Path, redis_url: str, env: dict[str, str], *argv: str
           ) -> subprocess.Popen[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TIMEWHEEL_")}
    full.update({"TIMEWHEEL_REDIS_URL": redis_url, "TIMEWHEEL_DATA_DIR": str(tmp_path), **env})
    return subprocess.Popen([sys.executable, "-m", "timewheel", "serve", *argv], env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)


def _healthy(process: subprocess.Popen[bytes], port: int) -> None:
    def answers() -> bool:
        assert process.poll() is None, f"serve exited {process.returncode}"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    settle(answers, 30, f"serve healthy on port {port}")


def test_serve_listens_on_timewheel_port_and_a_flag_wins(
        tmp_path: Path, redis_server_e2e: RedisServer) -> None:
    from_env, from_flag, unused = free_port(), free_port(), free_port()
    by_env = _serve(tmp_path / "a", redis_server_e2e.url,
                    {"TIMEWHEEL_HOST": "127.0.0.1", "TIMEWHEEL_PORT": str(from_env)})
    by_flag = _serve(tmp_path / "b", redis_server_e2e.url, {"TIMEWHEEL_PORT": str(unused)},
                     "--port", str(from_flag))
    try:
        _healthy(by_env, from_env)
        _healthy(by_flag, from_flag)
        # The variable the flag overrode was not used: nothing listens there.
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{unused}/healthz", timeout=2)
    finally:
        for process in (by_env, by_flag):
            process.terminate()
            assert process.wait(60) == 0
