"""What TIMEWHEEL_REDIS_WAIT_REPLICAS=1 costs: acknowledged writes, and (not done by the
service, measured to decide) outcome writes of callbacks.

    python -m bench.wait_cost                   # 2,000 single creates, 10,000 concurrent, ...
    python -m bench.wait_cost --single 500 --concurrent 2000 --outcomes 2000

A dedicated redis-server (bench/memory.py) and a replica of it (``--replicaof``) on loopback,
no persistence. Each figure is taken with WAIT_REPLICAS 0 and 1 (timeout 1000 ms), through the
service's own Store and the scripts it registers:

- **create, one at a time**: ``Store.schedule`` called sequentially; µs per call (p50, p99);
- **create, 64 at once**: ``Store.schedule`` from 64 concurrent callers; creates per second;
- **batch create**: ``schedule_many`` (``POST /tasks/batch``) of 1,000 tasks; tasks per second;
- **outcomes**: ``Store.complete`` for tasks claimed and started, 100 outcomes per call, calls
  one after another (the dispatcher batches outcomes per bucket); outcomes per second, with
  ``complete`` as the service registers it and as a ``DurableScript``.

Loopback makes the replica's round trip about as small as it gets: on a network, add one
replica round trip (plus the replica's apply time) per acknowledged call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import redis as sync_redis

from bench.common import machine_facts, print_machine, run
from bench.memory import DAY_MS, NOW_MS, dedicated_redis, new_keys, task_maker

TIMEOUT_MS = 1000


@contextlib.contextmanager
def master_and_replica() -> Iterator[str]:
    """The master's URL; its replica is attached and in sync."""
    with dedicated_redis() as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        with dedicated_redis(extra=["--replicaof", "127.0.0.1", port]) as replica_url:
            deadline = time.monotonic() + 20
            with sync_redis.Redis.from_url(replica_url) as replica:
                while replica.info("replication").get("master_link_status") != "up":
                    if time.monotonic() > deadline:
                        raise SystemExit("bench: the replica never synchronised")
                    time.sleep(0.05)
            yield url


@contextlib.asynccontextmanager
async def store_for(url: str, replicas: int) -> AsyncIterator[Any]:
    from timewheel.store import Store
    from timewheel.store.connection import make_redis
    from timewheel.store.durability import Durability

    store = Store(make_redis(url), "tw", retention_ms=7 * DAY_MS, lease_margin_ms=5000)
    if replicas:
        store.scripts.require_replicas(Durability(replicas, TIMEOUT_MS))
    try:
        await store.redis.flushall()
        await store.init()
        yield store
    finally:
        await store.redis.aclose()


async def single_creates(store: Any, n: int) -> dict[str, float]:
    make = task_maker(NOW_MS)
    times = []
    for key in new_keys(n):
        t0 = time.perf_counter()
        await store.schedule(make(key, NOW_MS + DAY_MS), replace=False, now_ms=NOW_MS)
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return {"p50_us": statistics.median(times), "p99_us": times[int(len(times) * 0.99) - 1]}


async def concurrent_creates(store: Any, n: int, callers: int = 64) -> dict[str, float]:
    make = task_maker(NOW_MS)
    keys = new_keys(n)
    tasks = [make(key, NOW_MS + DAY_MS) for key in keys]

    async def caller(share: list[Any]) -> None:
        for task in share:
            await store.schedule(task, replace=False, now_ms=NOW_MS)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(tasks[i::callers]) for i in range(callers)))
    return {"per_s": n / (time.perf_counter() - t0)}


async def batch_creates(store: Any, batches: int, size: int = 1000) -> dict[str, float]:
    from timewheel.store.batch import schedule_many

    make = task_maker(NOW_MS)
    elapsed = 0.0
    for _ in range(batches):
        tasks = [make(key, NOW_MS + DAY_MS) for key in new_keys(size)]
        t0 = time.perf_counter()
        await schedule_many(store, tasks, NOW_MS)
        elapsed += time.perf_counter() - t0
    return {"per_s": batches * size / elapsed}


async def outcomes(store: Any, n: int, durable: bool) -> dict[str, float]:
    """Tasks due now, claimed and started; then their outcomes, 100 per complete call."""
    from timewheel.store.batch import schedule_many
    from timewheel.store.durability import Durability, DurableScript
    from timewheel.store.scripts import source
    from timewheel.store.task_store import Outcome

    make = task_maker(NOW_MS)
    await schedule_many(store, [make(key, NOW_MS) for key in new_keys(n)], NOW_MS)
    claimed: dict[int, list[tuple[str, str]]] = {}
    for bucket in range(store.keys.buckets):
        more, calls = True, 0
        while more:
            token = f"bench.{bucket}.{calls}"
            more, tasks = await store.claim(bucket, now_ms=NOW_MS, horizon_ms=NOW_MS + 1,
                                            limit=100, token=token)
            calls += 1
            claimed.setdefault(bucket, []).extend((t.key, t.token) for t in tasks)
    for bucket, pairs in claimed.items():
        for i in range(0, len(pairs), 100):
            await store.start(bucket, claims=pairs[i:i + 100])
    if durable:
        store.scripts.complete = DurableScript(store.redis, source("complete"), "complete",
                                               Durability(1, TIMEOUT_MS))
    batches = [(bucket, pairs[i:i + 100]) for bucket, pairs in claimed.items()
               for i in range(0, len(pairs), 100)]
    done = sum(len(batch) for _, batch in batches)
    t0 = time.perf_counter()
    for bucket, batch in batches:
        await store.complete(bucket, now_ms=NOW_MS + 5, outcomes=[
            Outcome(key, token, "ok", 200, started_ms=NOW_MS) for key, token in batch])
    elapsed = time.perf_counter() - t0
    return {"per_s": done / elapsed, "us_per_call": elapsed / len(batches) * 1e6}


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for replicas in (0, 1):
        async with store_for(url, replicas) as store:
            row = {"single": await single_creates(store, args.single),
                   "concurrent": await concurrent_creates(store, args.concurrent),
                   "batch": await batch_creates(store, args.batches)}
        async with store_for(url, 0) as store:
            row["outcomes"] = await outcomes(store, args.outcomes, durable=bool(replicas))
        results[f"wait_replicas={replicas}"] = row
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--concurrent", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--outcomes", type=int, default=10_000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args(argv)
    print_machine(machine_facts())
    with master_and_replica() as url:
        results = run(measure(url, args))
    for name, row in results.items():
        print(f"{name}: create p50 {row['single']['p50_us']:.0f} us, "
              f"p99 {row['single']['p99_us']:.0f} us; "
              f"64 at once {row['concurrent']['per_s']:,.0f}/s; "
              f"batch {row['batch']['per_s']:,.0f} tasks/s; "
              f"outcomes {row['outcomes']['per_s']:,.0f}/s "
              f"({row['outcomes']['us_per_call']:.0f} us per call of 100)")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
