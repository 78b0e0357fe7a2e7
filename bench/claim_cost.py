"""What a claim costs with many tasks pending: does it stay flat from 10 k to 1 M?

    python -m bench.claim_cost                      # 10,000, 100,000 and 1,000,000 pending
    python -m bench.run --workload claim-cost       # the same
    python -m bench.claim_cost --sizes 10000 100000 --layout minute

One dedicated redis-server (bench/memory.py), tasks made and stored as ``POST /tasks`` makes
them (bench.memory.create). The pending tasks fall due *later* than the claim's horizon, so a
claim must pass them by:

- ``spread``: due evenly over the next 24 hours (most sit in later minute slices);
- ``minute``: all in the current minute, after the horizon (one big slice per bucket that the
  claim reads every time).

At each size, two figures, claims made the ticker's way (bucket after bucket, one call at a
time, ``Store.claim`` with limit 100 at one fixed ``now``):

- **idle claim**: nothing due; calls per second (client round trip included) and the script's
  own time in Redis (``INFO commandstats``, ``evalsha`` µs per call);
- **claiming**: ``--due`` (10,000) more tasks due now are claimed, 100 per call; ms per 100
  claimed (wall time of the calls) and the script's µs per call.

Sizes grow in one Redis (10 k, then 90 k more, then 900 k more); the claimed tasks stay
leased (their leases run out after ``now``, so the next size's idle claims do not see them).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis as sync_redis

from bench.common import RESULTS_DIR, print_machine, run
from bench.memory import (
    DAY_MS,
    NOW_MS,
    create,
    dedicated_redis,
    facts_for,
    new_keys,
    opened,
    spread,
)

HORIZON_MS = NOW_MS + 1000 + 250  # the ticker's: now + tick + lookahead margin
LIMIT = 100


def evalsha_stats(url: str, reset: bool = False) -> dict[str, float]:
    with sync_redis.Redis.from_url(url) as client:
        if reset:
            client.config_resetstat()
            return {}
        stats: dict[str, Any] = client.info("commandstats")
    row = stats.get("cmdstat_evalsha", {})
    return {"calls": float(row.get("calls", 0)),
            "usec_per_call": float(row.get("usec_per_call", 0))}


async def claim_round(store: Any, tag: str) -> tuple[int, int, float]:
    """One ticker-like pass: every bucket until it has nothing more. (calls, claimed, seconds)"""
    calls = claimed = 0
    t0 = time.perf_counter()
    for bucket in range(store.keys.buckets):
        more = True
        while more:
            more, tasks = await store.claim(bucket, now_ms=NOW_MS, horizon_ms=HORIZON_MS,
                                            limit=LIMIT, token=f"{tag}.{bucket}.{calls}")
            calls += 1
            claimed += len(tasks)
    return calls, claimed, time.perf_counter() - t0


def later(n: int, layout: str) -> list[int]:
    if layout == "minute":  # the rest of the current minute, after the horizon
        minute_end = (NOW_MS // 60_000 + 1) * 60_000
        return spread(n, HORIZON_MS + 1000, minute_end - HORIZON_MS - 2000)
    return spread(n, HORIZON_MS + 1000, DAY_MS)


async def measure(url: str, sizes: Sequence[int], layout: str, due: int,
                  idle_rounds: int, listing: bool = True) -> list[dict[str, Any]]:
    rows = []
    async with opened(url) as store:
        pending = 0
        for n in sorted(sizes):
            batch = n - pending
            # The new tasks' due times interleave with the earlier ones': same layout at every size.
            times = later(batch, layout)
            seconds = await create(store, new_keys(batch), times, NOW_MS)
            pending = n
            evalsha_stats(url, reset=True)
            calls = 0
            t0 = time.perf_counter()
            for r in range(idle_rounds):
                c, claimed, _ = await claim_round(store, f"idle{n}.{r}")
                calls += c
                assert claimed == 0, f"an idle claim took {claimed} tasks"
            idle_s = time.perf_counter() - t0
            idle = evalsha_stats(url)

            await create(store, new_keys(due), spread(due, NOW_MS - 900, 800), NOW_MS)
            evalsha_stats(url, reset=True)
            c, claimed, claim_s = await claim_round(store, f"due{n}")
            busy = evalsha_stats(url)
            row = {
                "pending": n, "layout": layout, "created_per_s": round(batch / seconds),
                "idle_calls": calls, "idle_calls_per_s": round(calls / idle_s),
                "idle_script_us_per_call": idle["usec_per_call"],
                "due": due, "claimed": claimed, "claim_calls": c,
                "ms_per_100_claimed": round(claim_s / claimed * 100 * 1000, 3) if claimed else None,
                "claim_script_us_per_call": busy["usec_per_call"],
            }
            rows.append(row)
            print(f"  {n:>9,} pending ({layout}): idle {row['idle_calls_per_s']:,} calls/s, "
                  f"script {row['idle_script_us_per_call']:.1f} µs; claiming "
                  f"{row['ms_per_100_claimed']} ms per 100, script "
                  f"{row['claim_script_us_per_call']:.0f} µs per call of 100 "
                  f"({claimed} in {c} calls)", flush=True)
            if claimed != due:
                raise SystemExit(f"bench: claimed {claimed} of {due} due tasks")
            if not listing:
                continue
            row.update(await listing_cost(store, url))
            row.update(await passes_while_listing(store, url))
            print(f"            listing: {row['list_ms_per_page_100']} ms per page of 100, "
                  f"{row['list_ms_per_page_1000']} ms per page of 1000, "
                  f"{row['list_ms_per_page_no_match']} ms per page matching nothing; script "
                  f"{row['list_script_us_per_call']:.0f} µs per call (max "
                  f"{row['list_script_us_max']} µs)", flush=True)
            print(f"            ticker pass (16 idle claims) p50/p99/max ms: alone "
                  f"{row['pass_ms_alone']}, while another process lists "
                  f"{row['pass_ms_listing']} ({row['pages_listed_meanwhile']} pages of 1000)",
                  flush=True)
    return rows


LISTER = """
import asyncio, sys
from timewheel.models import TaskStatus
from timewheel.store.listing import list_tasks
from bench.memory import new_store

async def main():
    store = new_store(sys.argv[1])
    await store.init()
    cursor = None
    while True:
        _, cursor = await list_tasks(store, TaskStatus.SCHEDULED, key_prefix="", limit=1000,
                                     cursor=cursor)
        print(1, flush=True)

asyncio.run(main())
"""


async def passes_while_listing(store: Any, url: str, passes: int = 200) -> dict[str, Any]:
    """Does a listing slow the ticker? Idle ticker passes (one claim call per bucket, one after
    another) timed alone, then while another process (as an API process of the wheel would)
    pages through the scheduled listing, 1000 a page, without pause: p50 / p99 / max ms."""
    async def timed(tag: str) -> list[float]:
        times = []
        for r in range(passes):
            t0 = time.perf_counter()
            await claim_round(store, f"{tag}.{r}")
            times.append((time.perf_counter() - t0) * 1000)
        return sorted(times)

    def summary(times: list[float]) -> list[float]:
        return [round(times[len(times) // 2], 2), round(times[int(len(times) * 0.99)], 2),
                round(times[-1], 2)]

    alone = await timed("alone")
    lister = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LISTER, url, stdout=asyncio.subprocess.PIPE)
    assert lister.stdout is not None
    await lister.stdout.readline()  # the first page is out: the lister is running
    busy = await timed("busy")
    lister.kill()
    pages = (await lister.stdout.read()).count(b"1") + 1
    await lister.wait()
    return {"pass_ms_alone": summary(alone), "pass_ms_listing": summary(busy),
            "pages_listed_meanwhile": pages}


async def listing_cost(store: Any, url: str, pages: int = 5) -> dict[str, Any]:
    """GET /tasks?status=scheduled through the store: ms per page (five pages followed by
    their cursors) for limits 100 and 1000, and for a prefix that matches nothing (every call
    runs to its budget). The script's mean and max µs per call (SLOWLOG, threshold 0) bound
    how long one listing call can hold the ticker's claim behind it."""
    from timewheel.models import TaskStatus
    from timewheel.store.listing import list_tasks

    out: dict[str, Any] = {}
    with sync_redis.Redis.from_url(url) as client:
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()
        evalsha_stats(url, reset=True)
        for name, limit, prefix in (("100", 100, ""), ("1000", 1000, ""),
                                    ("no_match", 100, "nothing-")):
            cursor, t0 = None, time.perf_counter()
            for _ in range(pages):
                _, cursor = await list_tasks(store, TaskStatus.SCHEDULED, key_prefix=prefix,
                                             limit=limit, cursor=cursor)
            out[f"list_ms_per_page_{name}"] = round((time.perf_counter() - t0) / pages * 1000, 2)
        out["list_script_us_per_call"] = evalsha_stats(url)["usec_per_call"]
        entries: Any = client.slowlog_get(100_000)
        out["list_script_us_max"] = max((int(e["duration"]) for e in entries
                                         if e["command"].startswith(b"EVALSHA")), default=0)
        client.config_set("slowlog-log-slower-than", 10_000)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.claim_cost",
                                description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--layout", choices=["spread", "minute"], nargs="+", default=["spread"])
    p.add_argument("--due", type=int, default=10_000, help="tasks due now, claimed per size")
    p.add_argument("--idle-rounds", type=int, default=100,
                   help="ticker passes over every bucket with nothing due, per size")
    p.add_argument("--no-listing", action="store_true", help="claims only (no listing costs)")
    p.add_argument("--redis-server", default=None)
    p.add_argument("--redis-args", default="", help="more redis-server arguments")
    p.add_argument("--results-dir", default=None)
    args = p.parse_args(argv)
    facts = facts_for(args.redis_server)
    print_machine(facts)
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}"
    t0 = time.perf_counter()
    rows = []
    for layout in args.layout:
        with dedicated_redis(args.redis_server, shlex.split(args.redis_args)) as url:
            print(f"redis   : dedicated {url} ({layout})")
            rows += run(measure(url, args.sizes, layout, args.due, args.idle_rounds,
                                not args.no_listing))
    out = {"benchmark": "claim_cost", "started_at": stamp,
           "command": "python -m bench.claim_cost " + " ".join(sys.argv[1:]),
           "machine": facts, "limit": LIMIT, "rows": rows,
           "wall_s": round(time.perf_counter() - t0, 1)}
    directory = Path(args.results_dir) if args.results_dir else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stamp}-claim_cost.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"written : {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
