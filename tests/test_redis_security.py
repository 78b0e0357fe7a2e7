"""Redis connection security: AUTH (ACL user and password in the URL) and TLS (`rediss://`)
with certificate verification, through the app's real client and clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.conftest import running_app
from tests.support.redis_server import RedisServer
from tests.support.tls import tls_terminator
from timewheel.api.app import create_app
from timewheel.settings import Settings
from timewheel.store.keys import Keyspace

TASK = {"callback_url": "http://127.0.0.1:9/hook", "delay": 60}


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis whose `timewheel` user needs a password (the default user stays open so the
    fixture can tell when it is up)."""
    args = ["--user", "timewheel", "on", ">s3cret", "~*", "&*", "+@all"]
    with RedisServer(tmp_path / "acl", extra_args=args) as server:
        yield server


async def test_auth_user_and_password_in_the_url(acl_redis: RedisServer, tmp_path: Path) -> None:
    good = Settings(redis_url=f"redis://timewheel:s3cret@127.0.0.1:{acl_redis.port}/0",
                    data_dir=tmp_path, allow_private_networks=True)
    async with running_app(create_app(good, run_ticker=False)) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.post("/tasks", json={**TASK, "key": "a"})).status_code == 201
    bad = Settings(redis_url=f"redis://timewheel:wrong@127.0.0.1:{acl_redis.port}/0",
                   data_dir=tmp_path, allow_private_networks=True)
    async with running_app(create_app(bad, run_ticker=False)) as client:
        assert (await client.get("/healthz")).status_code == 503
        assert (await client.post("/tasks", json={**TASK, "key": "b"})).status_code == 503
    with acl_redis.client() as plain:
        keys = Keyspace("tw")
        assert plain.exists(keys.task("a")) == 1
        assert plain.exists(keys.task("b")) == 0


@pytest.fixture
async def tls_proxy(redis_server: RedisServer, tmp_path: Path
                    ) -> AsyncIterator[tuple[int, Path]]:
    async with tls_terminator(redis_server.port, tmp_path) as (port, cert):
        yield port, cert


async def test_rediss_verifies_the_certificate(tls_proxy: tuple[int, Path], redis: object,
                                               tmp_path: Path) -> None:
    port, ca = tls_proxy
    trusted = Settings(redis_url=f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}",
                       data_dir=tmp_path, allow_private_networks=True)
    async with running_app(create_app(trusted, run_ticker=False)) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.post("/tasks", json={**TASK, "key": "tls"})).status_code == 201
        assert (await client.get("/tasks/tls")).json()["status"] == "scheduled"
    # The same server without its CA: the self-signed certificate must be refused.
    untrusted = Settings(redis_url=f"rediss://127.0.0.1:{port}/0", data_dir=tmp_path,
                         allow_private_networks=True)
    async with running_app(create_app(untrusted, run_ticker=False)) as client:
        assert (await client.get("/healthz")).status_code == 503
        assert (await client.post("/tasks", json={**TASK, "key": "no"})).status_code == 503
