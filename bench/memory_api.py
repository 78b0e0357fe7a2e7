"""Redis memory per pending and per cancelled task through the API, in the default setup.

    python -m bench.memory_api                                   # 100 k and 1 M, 100 k cancelled
    python -m bench.memory_api --sizes 100000 --cancelled 0 --per-minute 6000 --key-length 23

One ``timewheel serve`` (bench/service.py) with its embedded Redis (as started by default:
timewheel/store/embedded.py, with its memory settings), tasks created with ``POST
/tasks/batch`` (1,000 a request, two requests in flight): a ``--key-length`` key, a 34-byte URL,
a 13-byte body, due ``--per-minute`` a minute from ten minutes on (nothing falls due during the
run). The figure is the embedded Redis's ``used_memory`` (less the clients' buffers) after
minus before, divided by N, read through its unix socket (``--redis-defaults``: the service on
a redis-server of the bench's own with Redis's defaults instead, for the figure before); sizes
grow in one wheel. The cancelled figure comes from a second service: N tasks created, then
each cancelled with ``DELETE /tasks/{key}`` (32 in flight) before its minute comes, so each
still sits in its minute's delete-set. bench/memory.py measures the same without HTTP, in a
Redis of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import RESULTS_DIR, print_machine, run, stop_process
from bench.memory import BODY, URL, dedicated_redis, facts_for, used_memory
from bench.service import start_service, wait_healthy

START_S = 600  # the first task is due ten minutes after the run starts


def service_args() -> argparse.Namespace:
    return argparse.Namespace(service_port=None, sign=False, fake_service=False,
                              service_cmd=None)


def redis_url(data_dir: Path) -> str:
    from timewheel.store.embedded import socket_dir

    return f"unix://{socket_dir(data_dir)}/redis.sock"


async def create(session: aiohttp.ClientSession, base: str, keys: list[str], first: int,
                 start_s: float, per_minute: int) -> float:
    """POST every task in batches of 1,000, two in flight; the ``first``-th task of the wheel
    is due at ``start_s``. Returns the seconds it took; exits unless every item is 201."""
    bodies = []
    for at in range(0, len(keys), 1000):
        tasks = [{"key": key, "callback_url": URL, "body": BODY,
                  "execute_at": round(start_s + (first + at + i) * 60 / per_minute, 3)}
                 for i, key in enumerate(keys[at:at + 1000])]
        bodies.append(json.dumps({"tasks": tasks}).encode())
    queue = list(reversed(bodies))

    async def worker() -> None:
        while queue:
            body = queue.pop()
            async with session.post(base + "/tasks/batch", data=body,
                                    headers={"content-type": "application/json"}) as reply:
                data = await reply.json()
                statuses = {r["status"] for r in data["results"]}
                if reply.status != 200 or statuses != {201}:
                    raise SystemExit(f"bench: batch answered {reply.status} {statuses}")

    t0 = time.perf_counter()
    await asyncio.gather(worker(), worker())
    return time.perf_counter() - t0


async def cancel(session: aiohttp.ClientSession, base: str, keys: list[str]) -> float:
    queue = list(keys)

    async def worker() -> None:
        while queue:
            key = queue.pop()
            async with session.delete(f"{base}/tasks/{key}") as reply:
                if reply.status not in (200, 204):
                    raise SystemExit(f"bench: DELETE answered {reply.status}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(32)))
    return time.perf_counter() - t0


async def measure(svc: Any, sizes: list[int], cancelled: bool, per_minute: int,
                  key_length: int, url: str | None = None) -> list[dict[str, Any]]:
    url = url or redis_url(svc.data_dir)
    rows = []
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        await wait_healthy(svc, session, 60)
        start_s = time.time() + START_S
        # Warm-up: the scripts loaded, the connections open, the bookkeeping keys written.
        await create(session, svc.base, [f"warm-{i}" for i in range(1000)], 0, start_s + 86_400,
                     per_minute)
        base = used_memory(url)
        keys: list[str] = []
        for n in sorted(sizes):
            more = [secrets.token_urlsafe(key_length)[:key_length] for _ in range(n - len(keys))]
            seconds = await create(session, svc.base, more, len(keys), start_s, per_minute)
            keys += more
            mem = used_memory(url)
            row: dict[str, Any] = {"tasks": n, "bytes_per_task": round((mem - base) / n, 1),
                                   "created_per_s": round(len(more) / seconds)}
            if cancelled:
                seconds = await cancel(session, svc.base, keys)
                row["cancelled_bytes_per_task_until_minute_drains"] = round(
                    (used_memory(url) - base) / n, 1)
                row["cancelled_per_s"] = round(n / seconds)
            rows.append(row)
            print(f"  {json.dumps(row)}", flush=True)
    return rows


def one_service(sizes: list[int], cancelled: bool, per_minute: int, key_length: int,
                redis_defaults: bool = False) -> list[dict[str, Any]]:
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="timewheel-bench-memory-"))
        url = None
        if redis_defaults:  # "before": a Redis of the bench's own, with Redis's defaults
            url = stack.enter_context(dedicated_redis(None, []))
            stack.enter_context(patched_env(TIMEWHEEL_REDIS_URL=url, TIMEWHEEL_KEY_PREFIX="tw"))
        svc = start_service(service_args(), Path(tmp), secrets.token_hex(3))
        try:
            return run(measure(svc, sizes, cancelled, per_minute, key_length, url))
        finally:
            stop_process(svc.proc, 30.0)


@contextlib.contextmanager
def patched_env(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory_api",
                                description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--cancelled", type=int, default=100_000, help="tasks for the cancelled-task "
                   "figure, in a second service (0: skip)")
    p.add_argument("--per-minute", type=int, default=6000, help="tasks due a minute")
    p.add_argument("--key-length", type=int, default=23)
    p.add_argument("--redis-defaults", action="store_true", help="the service on a Redis of the "
                   "bench's own with Redis's default settings, not its embedded Redis")
    p.add_argument("--results-dir", default=None)
    args = p.parse_args(argv)
    facts = facts_for(None)
    print_machine(facts)
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}"
    t0 = time.perf_counter()
    print("pending (one service, sizes grow):")
    pending = one_service(args.sizes, False, args.per_minute, args.key_length,
                          args.redis_defaults)
    cancelled = None
    if args.cancelled:
        print("cancelled (a second service):")
        cancelled = one_service([args.cancelled], True, args.per_minute, args.key_length,
                                args.redis_defaults)[0]
    out = {"benchmark": "memory_api", "started_at": stamp,
           "command": "python -m bench.memory_api " + " ".join(sys.argv[1:]),
           "machine": facts, "redis_defaults": args.redis_defaults,
           "per_minute": args.per_minute, "key_length": args.key_length,
           "pending": pending, "cancelled": cancelled,
           "wall_s": round(time.perf_counter() - t0, 1)}
    directory = Path(args.results_dir) if args.results_dir else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stamp}-memory_api.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"written : {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
