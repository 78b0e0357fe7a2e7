"""Topics: how fast are publishes made, and how late are a fan-out's healthy endpoints while one
endpoint hangs?

    python -m bench.fanout [--publishes 2000] [--concurrency 16] [--fanout 300] [--window 10]

One `timewheel serve` (embedded Redis), a topic of 10 endpoints, in two parts:

1. **Publish rate.** ``--publishes`` publishes to the 10-endpoint topic (due an hour ahead, so
   nothing fires meanwhile), ``--concurrency`` at a time; reported as tasks created per second.
   For comparison within the same run, the same number of tasks through ``POST /tasks/batch``
   with 10 items per request (the one-request-per-event alternative).
2. **Lateness.** ``--fanout`` publishes due evenly over ``--window`` seconds, each to 9 healthy
   endpoints (the bench receiver, timestamping each arrival) and a 10th; run twice in one
   invocation: first the 10th is healthy too (control), then it is a receiver that reads each
   request and never answers (20 s timeout, one attempt). Lateness is arrival minus execute_at
   of the healthy nine's callbacks, as bench/noisy.py measures it.

The machine is shared: read ratios within one invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import summary_ms
from bench.noisy import HungReceiver
from bench.receiver import Receiver
from bench.service import add_service_args, run_on_service

BENCH_DIR = Path(__file__).resolve().parent
ENDPOINTS = 10


async def _put_topic(session: aiohttp.ClientSession, base: str, name: str,
                     urls: list[str]) -> None:
    endpoints = [{"name": f"e{i}", "url": url} for i, url in enumerate(urls)]
    async with session.put(f"{base}/topics/{name}", json={"endpoints": endpoints}) as r:
        if r.status not in (200, 201):
            raise SystemExit(f"bench: PUT /topics/{name}: {r.status} {await r.text()}")


async def _in_parallel(count: int, concurrency: int, one: Any) -> float:
    """Run ``one(i)`` for i < count, ``concurrency`` at a time; seconds taken."""
    queue = iter(range(count))

    async def worker() -> None:
        for i in queue:
            await one(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


async def _rates(args: argparse.Namespace, session: aiohttp.ClientSession, base: str,
                 receiver: Receiver) -> dict[str, Any]:
    urls = [f"http://127.0.0.1:{receiver.port}/rate/{i}" for i in range(ENDPOINTS)]
    await _put_topic(session, base, "rate", urls)
    due = time.time() + 3600

    async def publish(i: int) -> None:
        async with session.post(f"{base}/topics/rate/publish", json={
                "key": f"pub-{i}", "execute_at": due, "body": {"event": i}}) as r:
            if r.status != 201:
                raise SystemExit(f"bench: publish: {r.status} {await r.text()}")

    async def batch(i: int) -> None:
        tasks = [{"key": f"bat-{i}.e{n}", "callback_url": url, "execute_at": due,
                  "body": {"event": i}} for n, url in enumerate(urls)]
        async with session.post(f"{base}/tasks/batch", json={"tasks": tasks}) as r:
            body = await r.json()
            if r.status != 200 or {x["status"] for x in body["results"]} != {201}:
                raise SystemExit(f"bench: batch: {r.status} {str(body)[:300]}")

    published = await _in_parallel(args.publishes, args.concurrency, publish)
    batched = await _in_parallel(args.publishes, args.concurrency, batch)
    tasks = args.publishes * ENDPOINTS
    return {"publishes": args.publishes, "tasks": tasks, "concurrency": args.concurrency,
            "publish_seconds": round(published, 3),
            "publish_tasks_per_s": round(tasks / published),
            "publishes_per_s": round(args.publishes / published),
            "batch10_seconds": round(batched, 3), "batch10_tasks_per_s": round(tasks / batched)}


async def _round(args: argparse.Namespace, session: aiohttp.ClientSession, base: str,
                 receiver: Receiver, hung: HungReceiver | None, tag: str) -> dict[str, Any]:
    healthy = [f"http://127.0.0.1:{receiver.port}/fan/{i}" for i in range(ENDPOINTS - 1)]
    tenth = (f"http://127.0.0.1:{hung.port}/hang" if hung is not None
             else f"http://127.0.0.1:{receiver.port}/fan/9")
    await _put_topic(session, base, tag, [*healthy, tenth])
    start = time.time() + args.lead
    due = {f"{tag}-{i}": round(start + i * args.window / args.fanout, 3)
           for i in range(args.fanout)}
    keys = list(due)

    async def publish(i: int) -> None:
        async with session.post(f"{base}/topics/{tag}/publish", json={
                "key": keys[i], "execute_at": due[keys[i]], "timeout": 20,
                "max_attempts": 1}) as r:
            if r.status != 201:
                raise SystemExit(f"bench: publish: {r.status} {await r.text()}")

    await _in_parallel(args.fanout, args.concurrency, publish)
    if time.time() > start:
        raise SystemExit("bench: publishing took longer than --lead; raise it")
    expected = {f"{k}.e{n}": t for k, t in due.items() for n in range(ENDPOINTS - 1)}
    give_up = start + args.window + args.grace
    seen: dict[str, list[float]] = {}
    read = 0
    while time.time() < give_up:
        for rec in receiver.records[read:]:
            seen.setdefault(rec[1] or "", []).append(rec[0])
        read = len(receiver.records)
        if all(k in seen for k in expected):
            break
        await asyncio.sleep(0.2)
    lateness = sorted(seen[k][0] - expected[k] for k in expected if k in seen)
    return {
        "healthy_lateness_ms": summary_ms(lateness),
        "lost": sum(1 for k in expected if k not in seen),
        "duplicates": sum(len(v) - 1 for k, v in seen.items() if k in expected),
        "early": sum(1 for x in lateness if x < 0),
        "hung_requests": hung.requests if hung else 0,
        "hung_peak_at_once": hung.peak if hung else 0,
    }


async def _main(args: argparse.Namespace, base: str, svc_wait: Any) -> dict[str, Any]:
    receiver = Receiver()
    await receiver.start()
    hung = HungReceiver()
    await hung.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await svc_wait(session)
            rates = await _rates(args, session, base, receiver)
            control = await _round(args, session, base, receiver, None, "control")
            await asyncio.sleep(args.pause)
            hung_round = await _round(args, session, base, receiver, hung, "hung")
    finally:
        await hung.stop()
        await receiver.stop()
    return {"rates": rates, "control": control, "hung": hung_round}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fanout", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--publishes", type=int, default=2000, help="publishes timed for the rate")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    p.add_argument("--fanout", type=int, default=300, help="publishes of the lateness rounds")
    p.add_argument("--window", type=float, default=10.0, help="seconds their due times span")
    p.add_argument("--lead", type=float, default=15.0, help="seconds from now to the first")
    p.add_argument("--grace", type=float, default=15.0)
    add_service_args(p)
    args = p.parse_args(argv)
    res, facts = run_on_service(args, "fanout",
                                lambda base, healthy: _main(args, base, healthy))
    rates = res["rates"]
    print(f"== publish rate: {rates['publish_tasks_per_s']} tasks/s "
          f"({rates['publishes_per_s']} publishes/s of {ENDPOINTS} endpoints, "
          f"concurrency {rates['concurrency']}); POST /tasks/batch of 10: "
          f"{rates['batch10_tasks_per_s']} tasks/s")
    for name in ("control", "hung"):
        r = res[name]
        lat = r["healthy_lateness_ms"]
        print(f"== {name}: healthy nine lateness ms p50 {lat['p50_ms']} p99 {lat['p99_ms']}"
              f" max {lat['max_ms']} (n {lat['count']})"
              f"  lost {r['lost']} duplicates {r['duplicates']} early {r['early']}"
              f"  hung requests {r['hung_requests']} (at once at most {r['hung_peak_at_once']})")
    out = {"benchmark": "fanout", "command": "python -m bench.fanout " + " ".join(argv or []),
           "started_at": f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}", "machine": facts,
           "config": vars(args), **res}
    path = BENCH_DIR / "results" / f"{out['started_at']}-fanout.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"written: {path}")
    bad = any(res[n][k] for n in ("control", "hung") for k in ("lost", "duplicates", "early"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
