"""Acknowledged writes (TIMEWHEEL_REDIS_WAIT_REPLICAS) on a real Redis with one real replica
(``--replicaof``): a change is answered only once the replica has it; a replica that does not
confirm in time turns the answer into NotReplicated (the API's 503 with its detail), while the
change stays on the master, as Redis cannot undo it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from redis.asyncio import Redis

from tests.conftest import START_MS
from tests.support.redis_server import HOST, RedisServer
from tests.support.silent_redis import count_dials
from tests.support.waiting import settle, wait_until
from timewheel.errors import NotReplicated, StoreUnavailable
from timewheel.models import ScheduleCreate
from timewheel.operations.schedules import schedule_store, spec_of
from timewheel.settings import Settings
from timewheel.store import ScheduleReply, Store
from timewheel.store.batch import schedule_many
from timewheel.store.connection import make_redis
from timewheel.store.durability import Durability, DurableScript, marker
from timewheel.store.flow_store import FlowStore, StoredLimits
from timewheel.store.record import NewTask
from timewheel.store.scripts import ACKNOWLEDGED, Scripts

WAIT_MS = 300  # for the tests that wait for a replica which does not answer
# For a test that needs the replica to answer: the WAIT returns as soon as it does, and a
# replica scheduled late on a busy machine (CI, 4 workers on 2 cores) took over 300 ms to
# acknowledge the first write, failing the test with NotReplicated.
ANSWERED_WAIT_MS = 10_000
URL = "http://127.0.0.1:9/hook"


class Replicated:
    """A master and its replica, both real redis-server processes."""

    def __init__(self, directory: Path) -> None:
        self.master = RedisServer(directory / "master")
        self.replica: RedisServer | None = None
        self.directory = directory

    def start(self) -> Replicated:
        self.master.start()
        self.replica = RedisServer(self.directory / "replica", extra_args=[
            "--replicaof", HOST, str(self.master.port)]).start()
        with self.master.client() as conn:
            settle(lambda: conn.info("replication").get("connected_slaves") == 1
                   and self.in_sync(), 10, "the replica to synchronise")
        return self

    def in_sync(self) -> bool:
        assert self.replica is not None
        with self.replica.client() as conn:
            return conn.info("replication").get("master_link_status") == "up"

    def replica_client(self) -> sync_redis.Redis:
        assert self.replica is not None
        return self.replica.client()

    @contextmanager
    def replica_stopped(self) -> Iterator[None]:
        """SIGSTOP the replica: it neither applies nor confirms anything until SIGCONT."""
        assert self.replica is not None
        try:
            with self.replica.stopped():
                yield
        finally:
            self.wait_acknowledged()

    def wait_acknowledged(self) -> None:
        """Until the master has the replica's acknowledgement of all it sent: a resumed replica
        may take longer than a WAIT's WAIT_MS to be scheduled and catch up on a busy machine
        (CI, 4 workers on 2 cores), and the next acknowledged write must not pay for that."""
        with self.master.client() as conn:
            def acked() -> bool:
                info = conn.info("replication")
                replica = info.get("slave0")
                return isinstance(replica, dict) and \
                    int(replica["offset"]) >= int(info["master_repl_offset"])
            settle(acked, 30, "the resumed replica to acknowledge everything")

    def stop(self) -> None:
        if self.replica is not None:
            self.replica.stop()
        self.master.stop()


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicated]:
    pair = Replicated(tmp_path_factory.mktemp("replicated")).start()
    yield pair
    pair.stop()


@pytest.fixture
async def master(replicated: Replicated) -> AsyncIterator[Redis]:
    client = Redis.from_url(replicated.master.url)
    await client.flushall()
    await client.script_flush()
    yield client
    await client.aclose()


async def durable_store(client: Redis, replicas: int = 1, wait_ms: int = WAIT_MS) -> Store:
    store = Store(client, "tw", retention_ms=7 * 86_400_000, lease_margin_ms=5000)
    store.scripts.require_replicas(Durability(replicas, wait_ms))
    await store.init()
    return store


def new_task(key: str, due_ms: int = START_MS + 60_000) -> NewTask:
    return NewTask(key=key, url=URL, method="POST", headers=[], body=b"{}", due_ms=due_ms,
                   timeout_ms=1000, max_attempts=3, backoff_ms=1000,
                   fingerprint=f"fp-{key}", flow="127.0.0.1:9")


def on_replica(replicated: Replicated, store: Store, keys: list[str]) -> list[str]:
    """Which of these tasks' records the replica holds, read at once (no waiting)."""
    with replicated.replica_client() as conn:
        return [k for k in keys if conn.exists(store.keys.task(k))]


def test_only_acknowledged_scripts_wait_and_none_without_replicas(master: Redis) -> None:
    """WAIT_REPLICAS=0 registers redis-py's own scripts: nothing more runs per call."""
    plain, durable = Scripts(master), Scripts(master, Durability(1, WAIT_MS))
    assert not any(isinstance(getattr(plain, n), DurableScript) for n in ("schedule", "cancel"))
    assert {n for n in ("schedule", "cancel", "replay", "flow_limits", "claim", "start",
                        "complete", "release", "park", "unpark", "permits")
            if isinstance(getattr(durable, n), DurableScript)} == {
        "schedule", "cancel", "replay", "flow_limits"}
    assert {"sched_put", "sched_pause", "sched_resume", "sched_delete"} <= ACKNOWLEDGED
    assert marker("{tw:3}:") == "{tw:3}~ack" and marker("tw:flows") == "{tw:flows}~ack"


async def test_an_acknowledged_change_is_on_the_replica_when_it_returns(
        replicated: Replicated, master: Redis) -> None:
    """Create, cancel, replay and a batch create each return only once the replica holds
    their result: it is read from the replica right after, without waiting."""
    store = await durable_store(master, wait_ms=ANSWERED_WAIT_MS)
    assert await store.schedule(new_task("a"), replace=False,
            now_ms=START_MS) == ScheduleReply.CREATED
    assert on_replica(replicated, store, ["a"]) == ["a"]
    assert await store.cancel("a", now_ms=START_MS) == 1
    with replicated.replica_client() as conn:
        cancelled = conn.dump(store.keys.task("a"))
    with replicated.master.client() as conn:
        assert cancelled == conn.dump(store.keys.task("a"))  # the replica has the cancel
    assert await store.replay("a", now_ms=START_MS) == 1
    keys = [f"batch-{i}" for i in range(40)]
    codes = await schedule_many(store, [new_task(k) for k in keys], START_MS)
    assert codes == [ScheduleReply.CREATED] * 40
    assert on_replica(replicated, store, keys) == keys


async def test_a_replica_that_does_not_confirm_makes_it_not_replicated(
        replicated: Replicated, master: Redis) -> None:
    """The replica stopped: the create raises NotReplicated after the timeout, yet the record
    is on the master (Redis cannot undo a write) and reaches the replica once it runs again."""
    store = await durable_store(master)
    with replicated.replica_stopped():
        with pytest.raises(NotReplicated) as caught:
            await store.schedule(new_task("late"), replace=False, now_ms=START_MS)
        assert (caught.value.confirmed, caught.value.wanted) == (0, 1)
        assert await master.exists(store.keys.task("late")) == 1
    await wait_until(lambda: on_replica(replicated, store, ["late"]) == ["late"],
                     "the replica to get the write", 10)


async def test_a_repeated_create_is_not_acknowledged_before_the_first_write_is_replicated(
        replicated: Replicated, master: Redis) -> None:
    """The client retries a create that got NotReplicated. The repeat writes nothing (the task
    exists), but it must not be answered "exists" while the replica still lacks the first
    write, even from another process whose own last write was confirmed long ago (here a
    second client). The marker SET before each WAIT (store/durability.py) moves the
    connection's offset to the master's; Redis 6.2 happens to do so for any script call too,
    so this pins the behaviour rather than the marker alone."""
    store = await durable_store(master)
    other_client = Redis.from_url(replicated.master.url)
    try:
        other = await durable_store(other_client)
        # Its last write confirmed: without the marker, its WAIT would be satisfied at once.
        assert await other.schedule(new_task("warm"), replace=False,
                now_ms=START_MS) == ScheduleReply.CREATED
        with replicated.replica_stopped():
            with pytest.raises(NotReplicated):
                await store.schedule(new_task("again"), replace=False, now_ms=START_MS)
            with pytest.raises(NotReplicated):
                await other.schedule(new_task("again"), replace=False, now_ms=START_MS)
        assert await other.schedule(new_task("again"), replace=False,
                now_ms=START_MS) == ScheduleReply.EXISTS
        assert on_replica(replicated, store, ["again"]) == ["again"]
    finally:
        await other_client.aclose()


async def test_schedule_and_flow_changes_are_acknowledged(
        replicated: Replicated, master: Redis) -> None:
    """PUT /schedules and PUT/DELETE /flows go through acknowledged scripts as well."""
    store = await durable_store(master)
    schedules = schedule_store(store, default_timeout=10.0)
    flows = FlowStore(master, store.keys, store.scripts, default_parallelism=100)
    spec = ScheduleCreate.model_validate({"every": 60, "task": {"callback_url": URL}})

    def nxt(_spec: dict[str, Any], after: int) -> int:
        return after + 60_000

    with replicated.replica_stopped():
        with pytest.raises(NotReplicated):
            await schedules.put("s1", spec_of(spec), paused=False, now_ms=START_MS,
                                next_after=nxt)
        with pytest.raises(NotReplicated):
            await flows.set_limits("f1", StoredLimits(3, None))
        with pytest.raises(NotReplicated):
            await flows.delete_limits("f1")
    await flows.set_limits("f2", StoredLimits(None, 5.0))
    with replicated.replica_client() as conn:
        assert conn.hgetall(store.keys.flow("f2") + "cfg") == {b"r": b"5.0"}


async def test_the_api_answers_503_with_what_it_means(
        replicated: Replicated, master: Redis, make_client: Callable[..., Any],
        tmp_path: Path) -> None:
    """WAIT timeout → 503, Retry-After, and a detail that says the change may or may not
    survive and that repeating the request is safe; the task is readable on the master."""
    settings = Settings(redis_url=replicated.master.url, allow_private_networks=True,
                        data_dir=tmp_path, redis_wait_replicas=1,
                        redis_wait_timeout_ms=WAIT_MS)
    async with make_client(settings) as client:
        with replicated.replica_stopped():
            reply = await client.post("/tasks", json={"key": "k1", "callback_url": URL,
                                                       "delay": 60})
            assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
            detail = reply.json()["detail"]
            assert "0 of the 1 replicas" in detail and f"{WAIT_MS} ms" in detail
            assert "may or may not survive a failover" in detail
            assert "Repeating the same request is safe" in detail
            batch = await client.post("/tasks/batch", json={"tasks": [
                {"key": "k2", "callback_url": URL}]})
            assert batch.status_code == 503
            assert (await client.put("/flows/f", json={"parallelism": 2})).status_code == 503
        assert (await client.get("/tasks/k1")).json()["status"] == "scheduled"
        again = await client.post("/tasks", json={"key": "k1", "callback_url": URL,
                                                   "delay": 60})
        assert again.status_code == 200
        assert (await client.delete("/tasks/k1")).status_code == 204


async def test_a_silent_master_is_given_up_on_after_one_timeout(
        replicated: Replicated, master: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """An acknowledged write to a single Redis that answers nothing raises at its first socket
    timeout, as the service's other commands do (tests/test_redis_pool.py): not after two
    more rounds of the same timeout, each on a new connection."""
    dials = count_dials(monkeypatch)
    client = make_redis(replicated.master.url)
    try:
        assert isinstance(client, Redis)
        store = await durable_store(client, wait_ms=ANSWERED_WAIT_MS)
        created = await store.schedule(new_task("before"), replace=False, now_ms=START_MS)
        assert created == ScheduleReply.CREATED
        before = dials()
        with replicated.master.stopped(), pytest.raises(StoreUnavailable):
            await store.schedule(new_task("silent"), replace=False, now_ms=START_MS)
        assert dials() == before  # no new connection for another round
    finally:
        await client.aclose()
    replicated.wait_acknowledged()


async def test_a_rotation_waits_for_the_replicas_as_acknowledged_changes_do(
        replicated: Replicated, master: Redis) -> None:
    """keys rotate re-seals records and the operator then removes the old key: a failover
    that lost the re-sealed records would leave them under a key no longer listed. With
    replicas wanted, the rotation ends only once they have it all; a replica that does not
    confirm (stopped) makes it NotReplicated (the CLI says so, exit 1), not a quiet success."""
    from timewheel.store.encryption import Cipher
    from timewheel.store.rotation import Rotation

    store = await durable_store(master, replicas=0)
    await store.schedule(new_task("plain-1"), replace=False, now_ms=START_MS)
    k0, k1 = ("k0", bytes(range(32))), ("k1", bytes(range(32, 64)))
    report = await Rotation(master, "tw", Cipher([k0]), durability=Durability(1, WAIT_MS)).run()
    assert report.tasks_rekeyed == 1
    with replicated.replica_client() as conn:  # there when run() returned, not later
        assert b"k0" in conn.get(store.keys.task("plain-1"))
    with replicated.replica_stopped(), pytest.raises(NotReplicated):
        await Rotation(master, "tw", Cipher([k1, k0]), durability=Durability(1, WAIT_MS)).run()
