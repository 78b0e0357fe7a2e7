"""Redis time per callback of the three scripts every callback runs: claim, start, complete;
and per task of creating them as ``POST /tasks/batch`` does.

    python -m bench.script_cost                     # 4,000 tasks a round, 3 rounds, batches of 20
    python -m bench.script_cost --rounds 5 --batch 40

Issue #20 asks for <= 60 us of Redis CPU per callback. A sustained run (``bench.run``) shares
the machine's two cores with the service, the receiver and the load generator, so its Redis
figure moves with them; this bench runs the scripts alone, in one process against a
redis-server of its own (``bench.memory.dedicated_redis``, the embedded Redis's settings), so
a change to a script shows as a ratio within one sitting.

Each round, each phase on its own, with ``CONFIG RESETSTAT`` before it and ``INFO
commandstats`` after it:

- create: ``--tasks`` tasks made as ``POST /tasks`` makes them and stored as ``POST
  /tasks/batch`` stores them (``bench.memory.create``: ``schedule_many``, 1,000 a call), due
  within one second of a fixed ``now`` (reported apart: not part of a callback's cost);
- claim: ``Store.claim`` bucket after bucket, 100 a call, as the ticker claims;
- start: ``Store.start_many`` in batches of ``--batch`` in due order, over every bucket, as the
  recorder starts one wake-up's attempts on a single Redis;
- complete: ``Store.complete_many`` of a delivered outcome each, with a history entry as the
  executor writes it (status 200, two response headers, a 2-byte body), same batches.

Reported per task and phase: the scripts' own time (``evalsha`` usec, as Redis measures it,
Lua and the commands it runs) and the commands the scripts ran (calls per task). Nothing else
runs in that Redis meanwhile.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import redis as sync_redis

from bench.common import RESULTS_DIR, print_machine, run
from bench.memory import (
    NOW_MS,
    create,
    dedicated_redis,
    facts_for,
    memory_settings,
    new_keys,
    opened,
)

HORIZON_MS = NOW_MS + 1000 + 250  # the ticker's: now + tick + lookahead margin
PHASES = ("claim", "start", "complete")


def commandstats(url: str, reset: bool = False) -> dict[str, tuple[int, int]]:
    """Every command's (calls, usec) since the last reset."""
    with sync_redis.Redis.from_url(url) as client:
        if reset:
            client.config_resetstat()
            return {}
        stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in stats.items()}


async def phase(url: str, n: int, body: Callable[[], Awaitable[None]]) -> dict[str, Any]:
    commandstats(url, reset=True)
    await body()
    stats = commandstats(url)
    calls, usec = stats.pop("evalsha", (0, 0))
    stats.pop("config", None)
    return {"script_us": round(usec / n, 2), "script_calls": calls,
            "commands_per_task": round(sum(c for c, _ in stats.values()) / n, 2),
            "by_command": {k: round(c / n, 2) for k, (c, _) in sorted(stats.items())}}


async def claim_all(store: Any, tag: str) -> list[Any]:
    """Every bucket, 100 a call, until nothing more (the ticker's way)."""
    claimed: list[Any] = []
    for bucket in range(store.keys.buckets):
        more, calls = True, 0
        while more:
            more, got = await store.claim(bucket, now_ms=NOW_MS, horizon_ms=HORIZON_MS,
                                          limit=100, token=f"{tag}.{bucket}.{calls}")
            claimed.extend(got)
            calls += 1
    return claimed


async def start_all(store: Any, claimed: list[Any], batch: int) -> None:
    for i in range(0, len(claimed), batch):
        chunk = claimed[i:i + batch]
        started = await store.start_many([(t.bucket, t.key, t.token) for t in chunk],
                                         now_ms=NOW_MS + 1000)
        if not all(s.attempt == 1 for s in started):
            raise SystemExit("bench: a start did not answer attempt 1")


async def complete_all(store: Any, claimed: list[Any], batch: int) -> None:
    from timewheel.store import Outcome, attempts

    for i in range(0, len(claimed), batch):
        outcomes = [(t.bucket, Outcome(
            t.key, t.token, "ok", 200, None, None, NOW_MS + 1000,
            attempts.entry(attempt=1, started_ms=NOW_MS + 1000, duration_ms=2, verdict="ok",
                           status_code=200, error=None,
                           headers={"content-type": "text/plain", "content-length": "2"},
                           body="ok", body_truncated=False, next_attempt_ms=None,
                           process="bench-host:12345", key=t.key)))
            for t in claimed[i:i + batch]]
        replies = await store.complete_many(outcomes, now_ms=NOW_MS + 1002)
        if not all(int(r) == 1 for r in replies):
            raise SystemExit("bench: a complete did not answer RECORDED")


async def one_round(store: Any, url: str, tasks: int, batch: int, tag: str
                    ) -> dict[str, dict[str, Any]]:
    keys = new_keys(tasks)

    async def create_all() -> None:
        await create(store, keys, [NOW_MS + (i * 1000) // tasks for i in range(tasks)], NOW_MS)

    created = await phase(url, tasks, create_all)
    claimed: list[Any] = []

    async def claim() -> None:
        claimed.extend(await claim_all(store, tag))
        if len(claimed) != tasks:
            raise SystemExit(f"bench: claimed {len(claimed)} of {tasks}")

    return {"create": created, "claim": await phase(url, tasks, claim),
            "start": await phase(url, tasks, lambda: start_all(store, claimed, batch)),
            "complete": await phase(url, tasks, lambda: complete_all(store, claimed, batch))}


async def measure(url: str, tasks: int, batch: int, rounds: int) -> list[dict[str, Any]]:
    async with opened(url) as store:
        return [await one_round(store, url, tasks, batch, f"r{r}") for r in range(rounds)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.script_cost",
        description="Redis time per callback of claim, start and complete, scripts alone.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tasks", type=int, default=4000, help="tasks a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=20, help="starts and outcomes a call")
    parser.add_argument("--redis-server", help="redis-server binary (default: the embedded one)")
    args = parser.parse_args(argv)

    facts = facts_for(args.redis_server)
    print_machine(facts)
    with dedicated_redis(args.redis_server, memory_settings(args.redis_server)) as url:
        results = run(measure(url, args.tasks, args.batch, args.rounds))
    for r, result in enumerate(results):
        line = "  ".join(f"{name} {result[name]['script_us']:5.2f} us "
                         f"({result[name]['commands_per_task']:.2f} cmds)" for name in PHASES)
        total = sum(result[name]["script_us"] for name in PHASES)
        print(f"round {r}: {line}  total {total:5.2f} us a callback; "
              f"create {result['create']['script_us']:5.2f} us a task")
    for name in ("create", *PHASES):
        print(f"  {name:8s} commands a task: {json.dumps(results[-1][name]['by_command'])}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    path = RESULTS_DIR / f"{stamp}-script_cost.json"
    path.write_text(json.dumps({"machine": facts, "args": vars(args), "rounds": results},
                               indent=1))
    print(f"written : {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
