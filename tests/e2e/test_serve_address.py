"""Where a real ``timewheel serve`` listens: TIMEWHEEL_HOST / TIMEWHEEL_PORT, as ``serve --help``
promises for every setting, and a flag wins over the variable."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Service
from tests.support.ports import refused_port
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.e2e


def test_serve_listens_on_timewheel_port_and_a_flag_wins(
        tmp_path: Path, redis_server_e2e: RedisServer, services: list[Service]) -> None:
    # Each is healthy only once its own process listens on its port (a port another worker
    # took first is given up for a new one). The port the flag overrides is held by the test,
    # bound and never listening, so no other worker's server can answer there.
    with refused_port() as unused:
        by_env = Service(tmp_path / "a", redis_server_e2e.url, address_from="env")
        by_flag = Service(tmp_path / "b", redis_server_e2e.url, port=str(unused))
        services.extend([by_env, by_flag])
        by_env.start()
        by_flag.start()
        assert by_flag.env["TIMEWHEEL_PORT"] == str(unused)
        # The variable the flag overrode was not used: nothing listens there.
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{unused}/healthz", timeout=2)
    for service in (by_env, by_flag):
        assert service.stop() == 0
