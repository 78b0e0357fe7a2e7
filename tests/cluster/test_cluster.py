"""The wheel on a real three-master Redis Cluster: the Store's scripts each stay on their
bucket's node (a script touching a key another master serves raises "non local key"; the
16 buckets span all three masters), every key they leave sits under its own bucket's prefix,
the results equal those on a single Redis, and `timewheel serve` processes with
TIMEWHEEL_REDIS_CLUSTER=true deliver exactly once."""

from __future__ import annotations

import gc
import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.asyncio.cluster import ClusterNode

from tests.conftest import START_MS
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisCluster, RedisServer
from tests.support.waiting import wait_until
from timewheel.clock import FakeClock, RedisClock
from timewheel.engine.tick_phase import MAX_SHIFT_MS, TickPhases
from timewheel.engine.ticker import LOOKAHEAD_MARGIN_MS, Ticker
from timewheel.errors import StoreUnavailable
from timewheel.metrics import Metrics
from timewheel.models import TaskStatus
from timewheel.store import Outcome, ScheduleReply, Store
from timewheel.store.batch import schedule_many
from timewheel.store.connection import HiredisPacking, make_redis
from timewheel.store.keys import DEFAULT_BUCKETS, INDEX_KEEPER, Keyspace
from timewheel.store.listing import list_tasks
from timewheel.store.record import ClaimedTask, NewTask

from .conftest import (
    RETENTION_MS,
    all_keys,
    cluster_state,
    metric,
    node_clients,
    once_each,
    post_tasks,
    slot_owners,
    wait_finished,
)

pytestmark = pytest.mark.cluster

URL = "http://127.0.0.1:9/hook"  # never called: the Store tests play the dispatcher by hand
MINUTE = 60_000
START_MINUTE = START_MS // MINUTE


def keys_in_every_bucket(keys: Keyspace, per_bucket: int) -> list[str]:
    """`per_bucket` task keys for each bucket, in generation order."""
    counts: Counter[int] = Counter()
    found: list[str] = []
    n = 0
    while len(found) < per_bucket * keys.buckets:
        key, n = f"task-{n}", n + 1
        bucket = keys.bucket_of(key)
        if counts[bucket] < per_bucket:
            counts[bucket] += 1
            found.append(key)
    return found


def new_task(key: str, due_ms: int) -> NewTask:
    return NewTask(key=key, url=URL, method="POST",
                   headers=[("Content-Type", "application/json")], body=b'{"k":1}',
                   due_ms=due_ms, timeout_ms=1000, max_attempts=3, backoff_ms=1000,
                   fingerprint=f"fp-{key}-{due_ms}", flow="127.0.0.1:9")


class Collector:
    """Stands in for the Dispatcher under the real Ticker: keeps what each tick claimed."""

    in_flight = 0
    holding = 0  # claims it holds: none, it hands each tick's claims straight back

    def __init__(self) -> None:
        self.tasks: list[ClaimedTask] = []

    def submit(self, tasks: list[ClaimedTask], claimed_at_ms: int) -> None:
        self.tasks.extend(tasks)


# -- 1. the Store's scripts on a cluster ------------------------------------------------------

@pytest.fixture(params=["single", "cluster"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, bool, list[redis.Redis]]]:
    """(url, is_cluster, a sync client per node), every node empty."""
    if request.param == "single":
        server: RedisServer = request.getfixturevalue("redis_server")
        url, is_cluster, nodes = server.url, False, [server.client()]
    else:
        cluster: RedisCluster = request.getfixturevalue("cluster")
        url, is_cluster, nodes = cluster.seed_url, True, node_clients(cluster)
    for conn in nodes:
        conn.flushall()
        conn.script_flush()
    yield url, is_cluster, nodes
    for conn in nodes:
        conn.close()


class Wheel:
    """Plays the dispatcher for 48 tasks (3 per bucket, over 3 minutes): claims them with the
    real Ticker's loop on a FakeClock, and runs every script on them by hand."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.keys = keys_in_every_bucket(store.keys, 3)
        k = self.keys
        self.special = {"cancel": k[5], "fail": k[10], "release": k[15], "retry": k[20],
                        "replace": k[30], "cancel_claimed": k[40]}
        self.clock = FakeClock(START_MS)
        self.collector = Collector()
        self.ticker = Ticker(store, self.clock, self.collector,  # type: ignore[arg-type]
                             Metrics(), tick_ms=1000, claim_batch=4, max_pending=10_000)
        self.claims: dict[str, list[int]] = defaultdict(list)  # key -> due_ms of each claim
        self.not_started: list[str] = []
        self.failed_now = False

    async def run(self) -> dict[str, Any]:
        store, s = self.store, self.special
        for i, key in enumerate(self.keys):
            task = new_task(key, START_MS + 2000 + i * 2500)
            assert await store.schedule(task, replace=False,
                    now_ms=START_MS) == ScheduleReply.CREATED
        assert await store.schedule(new_task(s["replace"], START_MS + 150_000), replace=True,
                                    now_ms=START_MS) == ScheduleReply.REPLACED
        assert await store.cancel(s["cancel"], now_ms=START_MS) == 1
        while self.clock.now_ms() <= START_MS + 200_000:
            now = self.clock.now_ms()
            await self.ticker.tick()
            by_bucket: dict[int, list[ClaimedTask]] = defaultdict(list)
            claimed, self.collector.tasks = self.collector.tasks, []
            for task in claimed:
                assert task.due_ms <= now + 1000 + LOOKAHEAD_MARGIN_MS  # never claimed early
                self.claims[task.key].append(task.due_ms)
                by_bucket[task.bucket].append(task)
            self.failed_now = False
            for bucket, tasks in by_bucket.items():
                await self.deliver(bucket, tasks, now)
            if self.failed_now:
                dead, _ = await list_tasks(store, TaskStatus.FAILED, key_prefix="", limit=10,
                                           cursor=None)
                assert [(v.key, v.status.value) for v in dead] == [(s["fail"], "failed")]
                assert await store.replay(s["fail"], now_ms=now) == 1
            self.clock.advance(1000)
        views = {key: await store.get(key) for key in self.keys}
        assert None not in views.values()
        return {
            "status": {k: v.status.value for k, v in views.items() if v},
            "attempts": {k: v.attempts for k, v in views.items() if v},
            "last_code": {k: v.last_status_code for k, v in views.items() if v},
            "claims": dict(self.claims),
            "not_started": self.not_started,
            "dead": (await list_tasks(store, TaskStatus.FAILED, key_prefix="", limit=10,
                                      cursor=None))[0],
            "final_minute": self.clock.now_ms() // MINUTE,
        }

    async def deliver(self, bucket: int, tasks: list[ClaimedTask], now: int) -> None:
        s, to_start = self.special, []
        for task in tasks:
            if task.key == s["release"] and len(self.claims[task.key]) == 1:
                assert await self.store.release(bucket, [(task.key, task.token)]) == [1]
                continue
            if task.key == s["cancel_claimed"]:
                assert await self.store.cancel(task.key, now_ms=now) == 1
            to_start.append(task)
        started = await self.store.start(bucket, claims=[(t.key, t.token) for t in to_start])
        outcomes = []
        for task, start in zip(to_start, started, strict=True):
            attempt = start.attempt
            if attempt == 0:
                self.not_started.append(task.key)
                continue
            assert attempt == task.attempts + 1
            outcomes.append(self.outcome(task, attempt, now))
        if outcomes:
            assert await self.store.complete(bucket, now_ms=now, outcomes=outcomes) == (
                [1] * len(outcomes))

    def outcome(self, task: ClaimedTask, attempt: int, now: int) -> Outcome:
        if task.key == self.special["fail"] and len(self.claims[task.key]) == 1:
            self.failed_now = True
            return Outcome(task.key, task.token, "fail", 400, "HTTP 400", started_ms=now)
        if task.key == self.special["retry"] and attempt == 1:
            return Outcome(task.key, task.token, "retry", 503, "HTTP 503",
                           next_due_ms=now + 30_000, started_ms=now)
        return Outcome(task.key, task.token, "ok", 200, started_ms=now)


async def test_every_script_runs_in_its_bucket_slot_with_single_redis_results(
        backend: tuple[str, bool, list[redis.Redis]]) -> None:
    """Schedule, replace, cancel (lazy and claimed), claim, start, complete (ok, retry, fail),
    release and replay over all 16 buckets give the same, exact results on a cluster as on a
    single Redis, and leave no slice, delete-set, lease or dead-letter key behind."""
    url, is_cluster, nodes = backend
    client = make_redis(url, cluster=is_cluster)
    try:
        store = Store(client, "tw", retention_ms=RETENTION_MS, lease_margin_ms=5000)
        await store.init()
        wheel = Wheel(store)
        got = await wheel.run()
    finally:
        await client.aclose()

    keys, s = wheel.keys, wheel.special
    assert len(keys) == 48 and len({store.keys.bucket_of(k) for k in keys}) == 16
    due = {k: START_MS + 2000 + i * 2500 for i, k in enumerate(keys)}
    cancelled = {s["cancel"], s["cancel_claimed"]}
    assert got["status"] == {k: "cancelled" if k in cancelled else "succeeded" for k in keys}
    assert got["attempts"] == {k: 0 if k in cancelled else 2 if k == s["retry"] else 1
                               for k in keys}
    assert got["last_code"] == {k: None if k in cancelled else 200 for k in keys}
    expected_claims = {k: [due[k]] for k in keys if k not in (s["cancel"], s["replace"])}
    expected_claims[s["replace"]] = [START_MS + 150_000]  # only at its new time
    # Failed at its claim (tick START+26 s), replayed at once: due then, claimed next tick.
    expected_claims[s["fail"]] = [due[s["fail"]], START_MS + 26_000]
    expected_claims[s["release"]] = [due[s["release"]]] * 2  # handed back, claimed again
    # Claimed by the tick at START+51 s, retried 30 s later: into the next minute's slice.
    expected_claims[s["retry"]] = [due[s["retry"]], START_MS + 81_000]
    assert got["claims"] == expected_claims
    assert got["not_started"] == [s["cancel_claimed"]]
    assert got["dead"] == []
    assert got["final_minute"] == START_MINUTE + 3

    left = all_keys(nodes)
    tasks = {k: ttl for k, (_, ttl) in left.items() if ":t:" in k}
    claim_records = {k: ttl for k, (_, ttl) in left.items() if ":cl:" in k}
    histories = {k: ttl for k, (_, ttl) in left.items() if ":a:" in k}
    rest = {k for k in left if k not in tasks and k not in claim_records and k not in histories}
    assert set(tasks) == {store.keys.task(k) for k in keys}
    assert all(0 < ttl <= RETENTION_MS for ttl in tasks.values())  # finished: retention TTL
    # Every task tried (or stopped once claimed) has its attempt history, expiring with it.
    assert set(histories) == {store.keys.attempts(store.keys.bucket_of(k), k)
                              for k in keys if k != s["cancel"]}
    assert all(0 < ttl <= RETENTION_MS for ttl in histories.values())
    assert claim_records and all(0 < ttl <= 300_000 for ttl in claim_records.values())
    # No slice or delete-set, no lease and no dead letter: each bucket's cursor, the indexes
    # of succeeded and cancelled tasks (pruned at the retention age), the bucket count, and
    # each lease index holding its keeper alone (no lease left: store/keys.py INDEX_KEEPER).
    # The cancelled index: in each cancel's bucket, its pages' directory and the pages, which
    # hold the cancelled tasks (lua/lib/record.lua).
    cancelled_buckets = {store.keys.bucket_of(k) for k in cancelled}
    pages = {k for k in rest for b in cancelled_buckets
             if k.startswith(store.keys.cancelled_page(b, ""))}
    assert {m.decode() for k in pages for m in left[k][0].zrange(k, 0, -1)} == cancelled
    finished = {store.keys.finished(b, "succeeded") for b in range(16)} | pages | {
        store.keys.cancelled_pages(b) for b in cancelled_buckets}
    # A dead-letter index whose task left it (replayed) stays too, holding its keeper alone.
    leases = {store.keys.lease(b) for b in range(16)}
    dead = rest & {store.keys.dead(b) for b in range(16)}
    assert rest == ({store.keys.cursor(b) for b in range(16)} | finished | leases | dead
                    | {"tw:buckets"})
    assert all(left[k][0].zrange(k, 0, -1) == [INDEX_KEEPER.encode()] for k in leases | dead)
    cursors = {b: int(left[k][0].get(k)) for b in range(16) if (k := store.keys.cursor(b))}
    assert cursors == dict.fromkeys(range(16), START_MINUTE + 3)  # past minutes all drained


async def test_buckets_spread_over_all_three_masters(cluster: RedisCluster,
                                                     cluster_store: Store) -> None:
    """The 16 bucket prefixes map to slots on all three masters, and each master holds exactly
    the tasks of the buckets it serves (a minute's load spreads over the cluster)."""
    owners = slot_owners(cluster)
    assert set(owners.values()) == {node.port for node in cluster.nodes}
    keys = keys_in_every_bucket(cluster_store.keys, 1)
    for key in keys:
        task = new_task(key, START_MS + 5000)
        assert await cluster_store.schedule(task, replace=False,
                now_ms=START_MS) == ScheduleReply.CREATED
    for node in cluster.nodes:
        with node.client() as conn:
            held = {k.decode() for k in conn.scan_iter(match="{tw:*}:t:*")}
        mine = {cluster_store.keys.task(k) for k in keys
                if owners[cluster_store.keys.bucket_of(k)] == node.port}
        assert held == mine and mine


async def test_every_node_connection_packs_with_hiredis(cluster: RedisCluster,
                                                        cluster_store: Store) -> None:
    """Every master's connections, startup node or found by the slot map, pack commands with
    hiredis (store/connection.py), and the scripts run through them (one task a bucket)."""
    for key in keys_in_every_bucket(cluster_store.keys, 1):
        assert await cluster_store.schedule(new_task(key, START_MS + 5000), replace=False,
                now_ms=START_MS) == ScheduleReply.CREATED
    nodes = cluster_store.redis.get_primaries()
    assert len(nodes) == 3
    for node in [*nodes, *cluster_store.redis.nodes_manager.startup_nodes.values()]:
        assert issubclass(node.connection_class, HiredisPacking), node.name
    used = [conn for node in nodes for conn in node._connections]
    assert used and all(isinstance(conn, HiredisPacking) for conn in used)



TORN_DOWN = AttributeError("'NoneType' object has no attribute 'writelines'")


@pytest.mark.parametrize("path", ["command", "pipeline"])
@pytest.mark.parametrize(("raised", "seen"), [
    (TORN_DOWN, StoreUnavailable),  # redis-py's connection reset under the command
    (RuntimeError("unable to perform operation on <TCPTransport closed=True>"),
     StoreUnavailable),
    (AttributeError("'Store' object has no attribute 'nope'"), AttributeError),  # a bug
], ids=["torn-down", "transport-closed", "a-bug"])
async def test_a_connection_closed_under_a_command_is_a_503_not_a_crash(
        cluster_store: Store, monkeypatch: pytest.MonkeyPatch, path: str,
        raised: Exception, seen: type[Exception]) -> None:
    """What redis-py's cluster client raises when a connection is closed under a command (a
    concurrent command's reset, seen once in 250 with the loop held during connects) reaches
    the store as StoreUnavailable, so the API answers 503, not 500; any other error is left
    as it is. Injected where redis-py's node runs a command or a pipeline."""
    async def closed(*args: Any, **kwargs: Any) -> Any:
        raise raised

    monkeypatch.setattr(ClusterNode, "execute_command" if path == "command"
                        else "execute_pipeline", closed)
    key = keys_in_every_bucket(cluster_store.keys, 1)[0]
    with pytest.raises(seen):
        if path == "command":
            await cluster_store.get(key)
        else:
            await schedule_many(cluster_store, [new_task(key, START_MS + 5000)], START_MS)


async def test_init_and_clock_on_a_cluster(cluster: RedisCluster, cluster_redis: Any,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Store.init fixes the bucket count, reads every master's noeviction policy without a
    false warning, and the RedisClock reads TIME through the cluster client."""
    caplog.set_level(logging.WARNING, logger="timewheel.store")
    store = Store(cluster_redis, "tw", retention_ms=RETENTION_MS, lease_margin_ms=5000)
    await store.init()
    assert store.ready and store.keys.buckets == DEFAULT_BUCKETS
    assert await cluster_redis.get("tw:buckets") == b"16"
    assert [r.getMessage() for r in caplog.records] == []
    clock = RedisClock(cluster_redis)

    def node_time_ms() -> float:
        with cluster.nodes[0].client() as conn:
            seconds, micros = conn.time()
        return seconds * 1000 + micros / 1000

    before = node_time_ms()
    await clock.refresh()
    after = node_time_ms()
    # The sample is a TIME read between the two (every node runs on this host's clock). The
    # estimate is compared with Redis's own readings, not with the host's monotonic clock
    # across time: a CI host's wall clock stepped back 8 ms once between a refresh and a later
    # TIME, which no process can see coming (docs/design.md, "one clock").
    sample = clock.last_sample
    assert sample is not None and before <= sample.redis_ms <= after


async def test_tick_phases_through_the_cluster_client(cluster_redis: Any) -> None:
    """Processes note their ticks through the cluster client too (one key, its own slot): a
    failure here would only be logged and leave the ticks unspread."""
    store = Store(cluster_redis, "tw", retention_ms=RETENTION_MS, lease_margin_ms=5000)
    await store.init()
    a, b = TickPhases(store, 1000), TickPhases(store, 1000)
    assert await a.note(START_MS) == 0.0
    assert await b.note(START_MS + 100) == 0.0
    assert await a.note(START_MS + 1000) == MAX_SHIFT_MS  # 900 ms after b: it moves earlier
    assert 0 < await cluster_redis.pttl(store.keys.ticks) <= 3000


async def test_eviction_warning_covers_every_master(cluster: RedisCluster, cluster_redis: Any,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A master other than the client's default node with an evicting policy is warned about
    at start-up (docs/design.md invariant 5: warn if Redis does not run with noeviction)."""
    await cluster_redis.initialize()
    default_port = cluster_redis.get_default_node().port
    others = [node for node in cluster.nodes if node.port != default_port]
    assert len(others) == 2
    caplog.set_level(logging.WARNING, logger="timewheel.store")
    try:
        for node in others:
            with node.client() as conn:
                conn.config_set("maxmemory-policy", "allkeys-lru")
        store = Store(cluster_redis, "tw", retention_ms=RETENTION_MS, lease_margin_ms=5000)
        await store.init()
    finally:
        for node in others:
            with node.client() as conn:
                conn.config_set("maxmemory-policy", "noeviction")
    assert any("allkeys-lru" in r.getMessage() for r in caplog.records)


# -- 2, 3. `timewheel serve` on a cluster ----------------------------------------------------

def no_keys_left(cluster: RedisCluster, *suffixes: str) -> list[str]:
    """Keys ending in one of `suffixes` still present on any master."""
    left = []
    for conn in node_clients(cluster):
        with conn:
            left += [k.decode() for s in suffixes for k in conn.scan_iter(match=f"*{s}")]
    return left


def assert_stops_gracefully(service: Service) -> None:
    """SIGTERM runs the lifespan's shutdown (ticker, dispatcher, cluster client) without error
    and exits 0 (docs/api.md)."""
    assert service.stop() == 0
    log = service.log()
    assert "Application shutdown complete." in log
    assert "Traceback" not in log and " ERROR " not in log


def test_serve_on_a_cluster_delivers_each_task_once(
        start_cluster_service: Any, receiver: ThreadedReceiver, cluster: RedisCluster) -> None:
    """A `timewheel serve` with TIMEWHEEL_REDIS_CLUSTER=true is healthy, delivers 200 tasks
    spread over all 16 buckets exactly once each, and never sends a cancelled task."""
    service = start_cluster_service()
    health = httpx.get(f"{service.base_url}/healthz", timeout=10)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    # The slot-to-master spread is logged at start-up, as Redis itself reports it.
    counts = Counter(slot_owners(cluster).values())
    shares = ", ".join(f"127.0.0.1:{port}={counts[port]}"
                       for port in sorted(node.port for node in cluster.nodes))
    assert f"16 buckets over 3 masters (buckets per master: {shares})" in service.log()

    post_tasks(service, ["cancelled-0"], receiver.url("/cancelled"), 3)
    with service.client() as http:
        assert http.delete("/tasks/cancelled-0").status_code == 204
    keys = [f"once-{i}" for i in range(200)]
    assert {Keyspace("tw").bucket_of(k) for k in keys} == set(range(16))
    post_tasks(service, keys, receiver.url("/hook"), 3)

    receiver.wait_for_sync(200, timeout=40, path="/hook")
    views = wait_finished(service, keys, timeout=20)
    assert {k: (v["status"], v["attempts"], v["last_status_code"]) for k, v in views.items()} \
        == dict.fromkeys(keys, ("succeeded", 1, 200))
    # Every task was finished (so claimed past the cancelled one's due time): counts are final.
    assert once_each(receiver, "/hook") == Counter(dict.fromkeys(keys, 1))
    assert {a.headers["timewheel-attempt"] for a in receiver.arrivals_for("/hook")} == {"1"}
    assert receiver.arrivals_for("/cancelled") == []
    with service.client() as http:
        cancelled = http.get("/tasks/cancelled-0").json()
    assert (cancelled["status"], cancelled["attempts"]) == ("cancelled", 0)
    assert metric(service, 'timewheel_callbacks_total{outcome="succeeded"}') == 200
    assert no_keys_left(cluster, ":lease", ":dead") == []

    # The scrape's memory gauge: the fullest master's used / max memory, 0 where none has a
    # maxmemory; one master limited to four times what it uses reads a quarter.
    assert metric(service, "timewheel_redis_memory_used_ratio") == 0.0
    with cluster.nodes[1].client() as conn:
        used = int(conn.info("memory")["used_memory"])
        conn.config_set("maxmemory", 4 * used)
        try:
            assert 0.2 < metric(service, "timewheel_redis_memory_used_ratio") < 0.3
        finally:
            conn.config_set("maxmemory", 0)

    assert_stops_gracefully(service)


def test_two_serve_processes_on_a_cluster_split_the_work(
        start_cluster_service: Any, receiver: ThreadedReceiver, cluster: RedisCluster) -> None:
    """Two processes on one cluster deliver 300 tasks exactly once each between them. Each may
    hold at most 80 claims (max_concurrency 4 x 20), so both must take part."""
    services = [start_cluster_service(max_concurrency="4") for _ in range(2)]
    keys = [f"pair-{i}" for i in range(300)]
    for n, service in enumerate(services):  # either process accepts tasks
        post_tasks(service, keys[n::2], receiver.url("/hook"), 3)

    receiver.wait_for_sync(300, timeout=50, path="/hook")
    views = wait_finished(services[0], keys, timeout=20)
    assert {k: (v["status"], v["attempts"]) for k, v in views.items()} == (
        dict.fromkeys(keys, ("succeeded", 1)))
    assert once_each(receiver, "/hook") == Counter(dict.fromkeys(keys, 1))
    sent = [metric(s, 'timewheel_callbacks_total{outcome="succeeded"}') for s in services]
    assert sum(sent) == 300 and min(sent) > 0, sent
    assert no_keys_left(cluster, ":lease", ":dead") == []

    for service in services:
        assert_stops_gracefully(service)



async def test_health_check_sees_a_master_down(tmp_path: Path) -> None:
    """With a master dead and the cluster in state fail, every task operation is refused
    (StoreUnavailable, the API's 503), and so is the health check (docs/api.md: 503 then). Closing
    the client then closes every connection it opened, to the dead node and to nodes redis-py
    dropped from its table included: nothing is left to the garbage collector."""
    with RedisCluster(tmp_path / "own-cluster") as own:
        await refused_with_a_master_down(own)
        ports = {node.port for node in own.nodes}
    gc.collect()
    open_nodes = [node for node in gc.get_objects()
                  if isinstance(node, ClusterNode) and node.port in ports
                  and any(conn.is_connected for conn in node._connections)]
    assert open_nodes == []


async def refused_with_a_master_down(own: RedisCluster) -> None:
    client = make_redis(own.seed_url, cluster=True)
    try:
        store = Store(client, "tw", retention_ms=RETENTION_MS, lease_margin_ms=5000)
        await store.init()
        await client.initialize()
        default_port = client.get_default_node().port
        victim = next(node for node in own.nodes if node.port != default_port)
        victim.kill()
        survivor = next(n for n in own.nodes if n is not victim)
        with survivor.client() as conn:
            await wait_until(lambda: cluster_state(conn) == "fail",
                             "the cluster to notice the dead master", 15)
        with pytest.raises(StoreUnavailable):
            await store.schedule(new_task("k", START_MS), replace=False, now_ms=START_MS)
        with pytest.raises(StoreUnavailable):
            await store.ping()
    finally:
        await client.aclose()
