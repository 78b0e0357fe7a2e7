"""lua/publish.lua, lua/topic_put.lua and lua/topic_delete.lua on their own against a real Redis:
seed raw state, run once, compare the whole keyspace (every bucket a publish touches)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tests.support.bucket_state import MIN, NOW, RET, template
from timewheel.clock import FakeClock
from timewheel.engine.publish_sweeper import PublishSweeper
from timewheel.errors import RedisFull
from timewheel.store import Store, layout
from timewheel.store.publish import Publisher, PublishRequest
from timewheel.store.record import NewTask
from timewheel.store.replies import PublishReply

KEYS = ["o1.billing", "o1.email", "o1.audit"]
REC = json.dumps({"topic": "orders", "tasks": KEYS, "created": NOW})
KEEP = 60_000 + RET


async def keyspace(redis: Redis) -> dict[str, Any]:
    """Every key (but the bucket count) and its value, records decoded."""
    out: dict[str, Any] = {}
    async for raw in redis.scan_iter(match="*"):
        name = raw.decode()
        kind = (await redis.type(raw)).decode()
        if name == "tw:buckets":
            continue
        if kind == "zset":
            out[name] = {m.decode(): int(s) for m, s in await redis.zrange(raw, 0, -1,
                                                                             withscores=True)}
        elif kind == "hash":
            out[name] = {k.decode(): v for k, v in (await redis.hgetall(raw)).items()}
        elif kind == "set":
            out[name] = {m.decode() for m in await redis.smembers(raw)}
        elif ":t:" in name:
            out[name] = layout.decode(await redis.get(raw))
        else:
            out[name] = (await redis.get(raw)).decode()
    return out


def prefix(store: Store, key: str) -> str:
    return store.keys.prefix(store.keys.bucket_of(key))


def args(store: Store, mode: str, *, fp: str = "pfp", req: str = "r1", task_fp: str = "fp",
         keys: list[str] = KEYS, all_keys: list[str] | None = None,
         results: str = "") -> tuple[list[str], list[Any]]:
    """KEYS and ARGV as store/publish.py passes them; ``all_keys`` lists every bucket (mode
    all), else each task's prefix position is 1."""
    prefixes = [prefix(store, "o1")]
    argv: list[Any] = [mode, "o1", NOW, req, fp, REC, KEEP]
    for key in keys:
        position = 1
        if all_keys is not None:
            if prefix(store, key) not in prefixes:
                prefixes.append(prefix(store, key))
            position = prefixes.index(prefix(store, key)) + 1
        argv += [position, key, template(NOW + 60_000, fp=task_fp), results]
    return prefixes, argv


async def publish(store: Store, mode: str = "all", **options: Any) -> Any:
    keys, argv = args(store, mode, all_keys=KEYS if mode == "all" else None, **options)
    return await Publisher(store).script(keys=keys, args=argv)


# -- mode all (one Redis) -------------------------------------------------------------------------

async def test_all_creates_every_task_and_the_record(store: Store, redis: Redis) -> None:
    assert len({prefix(store, k) for k in KEYS}) > 1  # the tasks span several buckets
    assert await publish(store) == [0, []]
    state = await keyspace(redis)
    home = prefix(store, "o1")
    record = state.pop(f"{home}pb:o1")
    assert record == {"fp": b"pfp", "op": layout.digest("r1"), "st": b"done", "rec": REC.encode()}
    assert KEEP - 60_000 < await redis.pttl(f"{home}pb:o1") <= KEEP
    due = NOW + 60_000
    for key in KEYS:
        p = prefix(store, key)
        stored = state.pop(f"{p}t:{key}")
        assert (stored["st"], stored["due"], stored["created"], stored["op"]) == (
            "s", due, NOW, layout.digest("r1"))
        assert state[f"{p}ms:{due // MIN}"][key] == due
        assert state[f"{p}cur"] == str(NOW // MIN)
    assert {name.split("}:")[1].split(":")[0] for name in state} == {"ms", "mn", "cur"}


async def test_all_repeat_answers_exists_and_writes_nothing(store: Store, redis: Redis) -> None:
    await publish(store)
    before = await keyspace(redis)
    reply = await publish(store, req="r2")
    assert reply == [1, REC.encode(), b"done"]
    assert await keyspace(redis) == before


async def test_all_resent_call_answers_as_before(store: Store, redis: Redis) -> None:
    """redis-py re-sends a call whose reply was lost: same request id, same answer."""
    await publish(store)
    before = await keyspace(redis)
    assert await publish(store, req="r1") == [0, []]
    assert await keyspace(redis) == before


async def test_all_other_content_conflicts_and_writes_nothing(store: Store, redis: Redis) -> None:
    await publish(store)
    before = await keyspace(redis)
    assert await publish(store, req="r2", fp="other") == [-1, b""]
    assert await keyspace(redis) == before


async def test_all_a_taken_key_writes_nothing(store: Store, redis: Redis) -> None:
    """The last task's key holds another task: the two before it are not written either."""
    taken = prefix(store, KEYS[2])
    await redis.set(f"{taken}t:{KEYS[2]}", template(NOW, fp="someone-else"))
    before = await keyspace(redis)
    assert await publish(store) == [-2, KEYS[2].encode()]
    assert await keyspace(redis) == before


async def test_all_an_identical_task_is_kept_and_named(store: Store, redis: Redis) -> None:
    same = prefix(store, KEYS[1])
    await redis.set(f"{same}t:{KEYS[1]}", template(NOW + 60_000, fp="fp"))
    assert await publish(store) == [0, [KEYS[1].encode()]]
    state = await keyspace(redis)
    assert state[f"{same}t:{KEYS[1]}"]["op"] == layout.NONE  # not rewritten
    assert state[f"{prefix(store, KEYS[0])}t:{KEYS[0]}"]["op"] == layout.digest("r1")


async def test_a_malformed_record_is_refused_before_any_write(store: Store,
                                                              redis: Redis) -> None:
    keys, argv = args(store, "all", all_keys=KEYS)
    argv[-2] = argv[-2][:-1]
    with pytest.raises(ResponseError, match=r"malformed record for o1\.audit"):
        await Publisher(store).script(keys=keys, args=argv)
    assert await keyspace(redis) == {}


# -- the cluster's steps --------------------------------------------------------------------------

async def test_steps_check_open_tasks_close(store: Store, redis: Redis) -> None:
    home = prefix(store, "o1")
    script = Publisher(store).script
    groups: dict[str, list[str]] = {}
    for key in KEYS:
        groups.setdefault(prefix(store, key), []).append(key)

    for p, keys in groups.items():  # (0) check: nothing written
        _, argv = args(store, "check", keys=keys)
        assert await script(keys=[p], args=argv) == [0, []]
    assert await keyspace(redis) == {}

    _, argv = args(store, "open")  # (1) open, with every task's record
    assert await script(keys=[home], args=argv) == [0, []]
    state = await keyspace(redis)
    assert state[f"{home}pb:o1"]["st"] == b"open"
    assert {k for k in state[f"{home}pb:o1"] if k.startswith("t:")} == {f"t:{k}" for k in KEYS}
    assert state[f"{home}po"] == {"o1": NOW}
    assert not any(":t:" in name for name in state)

    # A repeat of the open finds the same publish, open.
    _, argv = args(store, "open", req="r2")
    assert await script(keys=[home], args=argv) == [1, REC.encode(), b"open"]

    for p, keys in groups.items():  # (2) each bucket's tasks
        _, argv = args(store, "tasks", keys=keys)
        assert await script(keys=[p], args=argv) == [0, []]
    assert sum(":t:" in name for name in await keyspace(redis)) == 3

    close = ["close", "o1", NOW, "r1", "", "done", 0]  # (3) close
    assert await script(keys=[home], args=close) == [0, []]
    state = await keyspace(redis)
    assert state[f"{home}pb:o1"] == {"fp": b"pfp", "op": layout.digest("r1"), "st": b"done",
                                     "rec": REC.encode()}
    assert f"{home}po" not in state


async def test_check_finds_a_taken_key(store: Store, redis: Redis) -> None:
    p = prefix(store, KEYS[0])
    await redis.set(f"{p}t:{KEYS[0]}", template(NOW, fp="someone-else"))
    _, argv = args(store, "check", keys=[KEYS[0]])
    assert await Publisher(store).script(keys=[p], args=argv) == [-2, KEYS[0].encode()]


async def test_close_of_an_expired_record_only_drops_its_open_entry(store: Store,
                                                                    redis: Redis) -> None:
    """The record expired while open (nothing to complete): its entry in po goes, so the
    sweep does not look at it again; no record is made up."""
    home = prefix(store, "o1")
    await redis.zadd(f"{home}po", {"o1": NOW})
    close = ["close", "o1", NOW, "r1", "", "done", 0]
    assert await Publisher(store).script(keys=[home], args=close) == [0, []]
    assert await keyspace(redis) == {}


async def test_complete_open_finishes_a_publish_left_open(store: Store, redis: Redis) -> None:
    """A process died after (1): the sweep creates the tasks from the open record, once."""
    publisher = Publisher(store)
    _, argv = args(store, "open")
    await publisher.script(keys=[prefix(store, "o1")], args=argv)
    bucket = store.keys.bucket_of("o1")
    # Not yet: opened less than older_than_ms ago.
    assert await publisher.complete_open(bucket, now_ms=NOW + 5_000, older_than_ms=10_000) == 0
    assert not any(":t:" in name for name in await keyspace(redis))
    assert await publisher.complete_open(bucket, now_ms=NOW + 10_000, older_than_ms=10_000) == 1
    state = await keyspace(redis)
    assert sorted(n.split(":t:")[1] for n in state if ":t:" in n) == sorted(KEYS)
    assert state[f"{prefix(store, 'o1')}pb:o1"]["st"] == b"done"
    assert await publisher.complete_open(bucket, now_ms=NOW + 20_000, older_than_ms=10_000) == 0


def request(url: str = "http://127.0.0.1:9/hook", keys: list[str] = KEYS) -> PublishRequest:
    """Publish "o1" of fingerprint "pfp" as the topic makes it: its tasks' URL and keys."""
    tasks = [NewTask(key=key, url=url, method="POST", headers=[], body=None,
                     due_ms=NOW + 60_000, timeout_ms=10_000, max_attempts=5, backoff_ms=1000,
                     fingerprint=f"fp-{url}", flow="f") for key in keys]
    return PublishRequest(key="o1", fingerprint="pfp", rec={"topic": "orders", "tasks": keys,
                                                             "created": NOW}, tasks=tasks)


async def urls(store: Store, keys: list[str]) -> dict[str, str | None]:
    records = {key: await store.get(key) for key in keys}
    return {key: record.callback_url if record else None for key, record in records.items()}


async def test_steps_answer_a_repeat_from_the_record_whatever_the_topic_makes_now(
        store: Store, redis: Redis) -> None:
    """An endpoint's URL changed after the publish: its repeat makes tasks of other content,
    and must still be answered from the record (200), as mode all answers it."""
    publisher = Publisher(store)
    assert (await publisher._in_steps(request(), NOW)).reply is PublishReply.CREATED
    before = await keyspace(redis)
    again = await publisher._in_steps(request(url="http://127.0.0.1:9/moved"), NOW + 1)
    assert again.reply is PublishReply.EXISTS and again.rec is not None
    assert again.rec["state"] == "done"
    assert await keyspace(redis) == before


async def test_steps_complete_a_publish_left_open_as_it_was_recorded(
        store: Store, redis: Redis) -> None:
    """A publish died after (1). Its retry comes after the topic changed (one endpoint moved,
    one gone, one new): the tasks made are those the open record holds, no others."""
    publisher = Publisher(store)
    first = request(keys=KEYS[:2])
    quads = [v for t in first.tasks for v in (1, t.key, t.record(), t.results())]
    assert await publisher.script(keys=[prefix(store, "o1")], args=publisher._head(
        "open", first, NOW, "r1") + quads) == [0, []]
    retry = request(url="http://127.0.0.1:9/moved", keys=[KEYS[0], KEYS[2]])
    answer = await publisher._in_steps(retry, NOW + 1)
    assert answer.reply is PublishReply.EXISTS
    assert await urls(store, KEYS) == {KEYS[0]: "http://127.0.0.1:9/hook",
                                       KEYS[1]: "http://127.0.0.1:9/hook", KEYS[2]: None}
    home = prefix(store, "o1")
    assert await redis.hget(f"{home}pb:o1", "st") == b"done"
    assert await redis.zcard(f"{home}po") == 0


async def test_a_sweep_after_the_close_leaves_a_partial_publish_partial(
        store: Store, redis: Redis) -> None:
    """The sweep read the open entry, then the publish's own call closed it partial (a task
    key was taken): the sweep's close drops the entry and changes nothing else."""
    home = prefix(store, "o1")
    await redis.hset(f"{home}pb:o1", mapping={"fp": "pfp", "op": "x", "st": "partial",
                                              "rec": REC})
    await redis.zadd(f"{home}po", {"o1": NOW})
    before = {k: v for k, v in (await keyspace(redis)).items() if not k.endswith("po")}
    assert await Publisher(store).complete_open(store.keys.bucket_of("o1"), now_ms=NOW + 20_000,
                                                older_than_ms=10_000) == 1
    assert await keyspace(redis) == before
    close = ["close", "o1", NOW, "r9", "", "done", 0]
    assert await Publisher(store).script(keys=[home], args=close) == [0, []]
    assert (await redis.hget(f"{home}pb:o1", "st")) == b"partial"


# -- topics ---------------------------------------------------------------------------------------

async def test_topic_put_creates_replaces_and_delete_removes(store: Store, redis: Redis) -> None:
    script_put = store.scripts.register("topic_put")
    script_delete = store.scripts.register("topic_delete")
    p = store.keys.topics
    assert await script_put(keys=[p], args=["orders", '{"endpoints":[]}', NOW]) == [1, NOW]
    assert await script_put(keys=[p], args=["orders", '{"endpoints":[1]}', NOW + 5]) == [0, NOW]
    await redis.zadd(f"{p}r:orders", {"o1": NOW})
    assert await keyspace(redis) == {
        f"{p}tp:orders": {"spec": b'{"endpoints":[1]}', "created": str(NOW).encode(),
                          "updated": str(NOW + 5).encode()},
        f"{p}n": {"orders": 0}, f"{p}r:orders": {"o1": NOW}}
    assert await script_delete(keys=[p], args=["orders"]) == 1
    assert await keyspace(redis) == {}
    assert await script_delete(keys=[p], args=["orders"]) == -1


async def test_the_sweeper_completes_open_publishes_of_every_bucket(store: Store,
                                                                   redis: Redis) -> None:
    """PublishSweeper.tick: one pass over every bucket, counting what it completed."""
    publisher = Publisher(store)
    _, argv = args(store, "open")
    await publisher.script(keys=[prefix(store, "o1")], args=argv)
    sweeper = PublishSweeper(publisher, FakeClock(NOW), older_than_ms=10_000)
    assert await sweeper.tick(NOW + 9_999) == 0  # control: not open long enough yet
    assert await sweeper.tick(NOW + 10_000) == 1
    assert sweeper.completed == 1
    assert sum(":t:" in name for name in await keyspace(redis)) == len(KEYS)
    assert await sweeper.tick(NOW + 20_000) == 0


async def test_result_callbacks_are_stored_with_each_task(store: Store, redis: Redis) -> None:
    """A publish with on_success / on_failure: each task's r:<key> (lua/lib/results.lua), in
    one call (mode all) and through the cluster's open record and its sweep alike."""
    results = "http://127.0.0.1:9/ok\nhttp://127.0.0.1:9/failed"
    assert await publish(store, results=results) == [0, []]
    for key in KEYS:
        assert await redis.get(f"{prefix(store, key)}r:{key}") == results.encode()
        assert await redis.pttl(f"{prefix(store, key)}r:{key}") == -1  # pending: no TTL
    await redis.flushall()
    await store.init()
    publisher = Publisher(store)
    _, argv = args(store, "open", results=results)
    await publisher.script(keys=[prefix(store, "o1")], args=argv)
    home = f"{prefix(store, 'o1')}pb:o1"
    assert await redis.hget(home, f"u:{KEYS[0]}") == results.encode()
    bucket = store.keys.bucket_of("o1")
    assert await publisher.complete_open(bucket, now_ms=NOW + 10_000, older_than_ms=10_000) == 1
    for key in KEYS:
        assert await redis.get(f"{prefix(store, key)}r:{key}") == results.encode()
    assert [f for f in await redis.hkeys(home) if f.startswith((b"t:", b"u:"))] == []


async def test_tasks_a_completion_makes_are_told_to_the_ticker(store: Store,
                                                                redis: Redis) -> None:
    """A publish left open and completed later (by its repeat, or by the sweep) makes its
    tasks as a first call does, and tells the ticker of each (Store.due_soon), or a task due
    before the next tick waits for it: up to a tick late."""
    told: list[tuple[int, int]] = []
    store.due_soon = lambda bucket, due_ms: told.append((bucket, due_ms))
    publisher = Publisher(store)
    first = request(keys=KEYS[:2])
    quads = [v for t in first.tasks for v in (1, t.key, t.record(), t.results())]
    await publisher.script(keys=[prefix(store, "o1")],
                           args=publisher._head("open", first, NOW, "r1") + quads)
    assert (await publisher._in_steps(first, NOW + 1)).reply is PublishReply.EXISTS
    assert sorted(told) == sorted((store.keys.bucket_of(k), NOW + 60_000) for k in KEYS[:2])

    told.clear()
    head = publisher._head("open", PublishRequest(key="o2", fingerprint="pfp", rec=first.rec,
                                                  tasks=[]), NOW, "r2")
    await publisher.script(keys=[prefix(store, "o2")],
                           args=[*head, 1, "o2-a", first.tasks[0].record(), ""])
    assert await publisher.complete_open(store.keys.bucket_of("o2"), now_ms=NOW + 20_000,
                                         older_than_ms=10_000) == 1
    assert told == [(store.keys.bucket_of("o2-a"), NOW + 60_000)]


async def test_a_cluster_publish_refused_part_way_still_tells_the_tasks_it_made(
        store: Store, redis: Redis) -> None:
    """A cluster publish whose tasks step is refused on one master (full) after another
    master stored its share: 503, and the publish stays open for its repeat or the sweep.
    The tasks stored meanwhile are told to the ticker all the same, or one due before the
    next tick waits for it (before, the refusal skipped every word)."""
    told: list[tuple[int, int]] = []
    store.due_soon = lambda bucket, due_ms: told.append((bucket, due_ms))
    publisher = Publisher(store)
    full = prefix(store, KEYS[0])
    assert prefix(store, KEYS[1]) != full
    script = publisher.script

    async def refused_on_one_master(keys: list[str], args: list[Any]) -> Any:
        if args[0] == "tasks" and keys == [full]:
            raise RedisFull("publish: OOM command not allowed when used memory > 'maxmemory'")
        return await script(keys=keys, args=args)

    publisher.script = refused_on_one_master  # type: ignore[assignment]
    with pytest.raises(RedisFull):
        await publisher._in_steps(request(), NOW)
    assert await redis.exists(f"{prefix(store, KEYS[1])}t:{KEYS[1]}") == 1
    assert sorted(told) == sorted((store.keys.bucket_of(k), NOW + 60_000) for k in KEYS)
