"""Recurring schedules at scale: 10,000 schedules with ``every: 60``.

    python -m bench.schedules                       # both parts, ~4 minutes
    python -m bench.schedules --part materializer   # in-process, ~30 s
    python -m bench.schedules --part service        # a real `timewheel serve`, ~3 minutes

``every`` counts from the epoch, so all 10,000 schedules fall due at the same second of every
minute: the worst case for the materializer (10,000 occurrences in one tick, at most two ticks
ahead of their time).

- ``materializer``: the Materializer against a real (embedded) redis-server, driven by hand
  at a fixed "now" (the clock is injected): CPU and wall time of the tick that materializes a
  minute's 10,000 occurrences, of the pass that settles them, and of an idle tick. No HTTP.
- ``service``: one real `timewheel serve` (embedded Redis) and the bench receiver; the
  schedules are PUT over HTTP, then two minutes of occurrences are delivered. Lateness is
  arrival minus the occurrence (from the callback's ``webhook-id``), CPU is the service's and
  its redis-server's over the delivery window (materializing, claiming, sending, settling).

Fails (exit 1) only on correctness: an occurrence early, twice, or missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    free_port,
    machine_facts,
    percentile,
    print_machine,
    proc_children,
    proc_cpu_seconds,
    run,
    start_receiver,
    stop_process,
)

URL_PATH = "/s"


# -- part 1: the materializer alone -----------------------------------------------------------

async def bench_materializer(n: int, every: int, minutes: int) -> dict[str, Any]:
    from redis.asyncio import Redis

    from timewheel.engine.materializer import Materializer
    from timewheel.models import ScheduleCreate
    from timewheel.operations.schedules import schedule_store, spec_of
    from timewheel.store import Store
    from timewheel.store.embedded import EmbeddedRedis
    from timewheel.store.schedule_store import spec_json

    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp), appendfsync="everysec")
        embedded.start()
        redis = Redis.from_url(embedded.url)
        try:
            store = Store(redis, "tw", retention_ms=7 * 86_400_000, lease_margin_ms=5000)
            await store.init()
            schedules = schedule_store(store, default_timeout=10.0)
            now = (int(time.time()) // 60 + 1) * 60_000  # a minute boundary ahead
            text = spec_json(spec_of(ScheduleCreate.model_validate(
                {"every": every, "task": {"callback_url": "http://127.0.0.1:9/s"}})))
            script = schedules.scripts["sched_put"]
            t0 = time.perf_counter()
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(n):
                    sid = f"s{i}"
                    await script(keys=[schedules.prefix(schedules.bucket_of(sid))],
                                 args=[sid, "", text, "0", now + every * 1000, now, f"r{i}"],
                                 client=pipe)
                await pipe.execute()
            seeded_s = time.perf_counter() - t0
            m = Materializer(store, schedules, clock=None,  # type: ignore[arg-type]
                             tick_ms=1000)
            redis_pid = _pid_of(embedded)
            rows: list[dict[str, Any]] = []
            for minute in range(1, minutes + 1):
                due = now + minute * every * 1000
                idle = await _measure(m.tick, due - 30_000, redis_pid)  # nothing due
                created_before = m.created
                made = await _measure(m.tick, due - m.ahead_ms, redis_pid)
                made["occurrences"] = m.created - created_before
                settle = await _measure(m.tick, due + m.settle_ms, redis_pid)  # looks at each
                rows.append({"minute": minute, "idle_tick": idle, "materialize_tick": made,
                             "settle_tick": settle})
            per_k = [1000 * (r["materialize_tick"]["cpu_s"] + r["settle_tick"]["cpu_s"])
                     / max(1, r["materialize_tick"]["occurrences"]) for r in rows]
            per_k_redis = [1000 * (r["materialize_tick"]["redis_cpu_s"]
                                   + r["settle_tick"]["redis_cpu_s"])
                           / max(1, r["materialize_tick"]["occurrences"]) for r in rows]
            ok = all(r["materialize_tick"]["occurrences"] == n for r in rows)
            return {"schedules": n, "every": every, "seed_s": round(seeded_s, 2),
                    "minutes": rows, "process_cpu_s_per_1000": [round(x, 3) for x in per_k],
                    "redis_cpu_s_per_1000": [round(x, 3) for x in per_k_redis],
                    "correct": ok}
        finally:
            await redis.aclose()
            embedded.stop()


def _pid_of(embedded: Any) -> int | None:
    process = getattr(embedded, "_process", None)
    return process.pid if process is not None else None


async def _measure(tick: Any, now: int, redis_pid: int | None) -> dict[str, Any]:
    redis0 = proc_cpu_seconds(redis_pid) if redis_pid else None
    c0, w0 = time.process_time(), time.perf_counter()
    await tick(now)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    redis1 = proc_cpu_seconds(redis_pid) if redis_pid else None
    return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "redis_cpu_s": round(redis1 - redis0, 3) if redis0 is not None and redis1 else None}


# -- part 2: a real service -------------------------------------------------------------------

async def bench_service(n: int, every: int, minutes: int, tmp: Path,
                        flow_parallelism: int) -> dict[str, Any]:
    receiver, rport = start_receiver(["--out", str(tmp / "arrivals.jsonl")],
                                     log_path=tmp / "receiver.log")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEWHEEL_")}
    env.update({"TIMEWHEEL_ALLOW_PRIVATE_NETWORKS": "true",
                "TIMEWHEEL_DATA_DIR": str(tmp / "data"),
                "TIMEWHEEL_EMBEDDED_APPENDFSYNC": "everysec",
                # Every occurrence goes to the one receiver, one flow: lift its default
                # parallelism (100) so the figures measure schedules, not the flow limit.
                "TIMEWHEEL_FLOW_PARALLELISM": str(flow_parallelism)})
    command = [sys.executable, "-c", "from timewheel.cli import main; main()", "serve",
               "--host", "127.0.0.1", "--port", str(port)]
    with (tmp / "service.log").open("ab") as log:
        service = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    callback = f"http://127.0.0.1:{rport}{URL_PATH}"
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_healthy(session, base)
            t0 = time.perf_counter()
            await _put_all(session, base, n, every, callback)
            put_s = time.perf_counter() - t0
            pids = {"service": service.pid, **{f"child:{p}": p
                                               for p in proc_children(service.pid)}}
            # Occurrences from the next full period on, after every PUT is in.
            first = (int(time.time()) // every + 2) * every
            await _sleep_until(first - 5)
            cpu0 = {k: proc_cpu_seconds(p) for k, p in pids.items()}
            await _sleep_until(first + (minutes - 1) * every + 12)
            cpu1 = {k: proc_cpu_seconds(p) for k, p in pids.items()}
            deadline = time.monotonic() + 60  # stragglers: wait for them, but not forever
            while True:
                async with session.get(f"http://127.0.0.1:{rport}/_bench/stats") as r:
                    count = (await r.json())["count"]
                if count >= n * minutes or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            async with session.get(f"http://127.0.0.1:{rport}/_bench/records") as r:
                records = (await r.json())["records"]
    finally:
        stop_process(service, 60)
        stop_process(receiver, 10)
    expected = {f"s{i}.{(first + k * every) * 1000}" for i in range(n) for k in range(minutes)}
    late, early, seen = [], 0, Counter[str]()
    for arrival, webhook_id, *_ in records:
        seen[webhook_id] += 1
        if webhook_id in expected:
            lateness = arrival * 1000 - int(webhook_id.rpartition(".")[2])
            late.append(lateness)
            early += lateness < 0
    late.sort()
    cpu = {k: round((cpu1[k] or 0) - (cpu0[k] or 0), 2) for k in pids}
    delivered = sum(1 for k in expected if seen[k])
    return {
        "schedules": n, "every": every, "minutes": minutes, "put_s": round(put_s, 1),
        "put_per_s": round(n / put_s), "expected": len(expected), "delivered": delivered,
        "duplicates": sum(1 for k in expected if seen[k] > 1), "early": early,
        "lateness_ms": {"p50": _r(percentile(late, 50)), "p90": _r(percentile(late, 90)),
                        "p99": _r(percentile(late, 99)), "max": _r(late[-1] if late else None)},
        "cpu_s": cpu,
        "service_cpu_s_per_1000": round(1000 * cpu["service"] / max(1, delivered), 3),
        "redis_cpu_s_per_1000": round(1000 * sum(v for k, v in cpu.items() if k != "service")
                                      / max(1, delivered), 3),
        "correct": delivered == len(expected) and early == 0
        and all(seen[k] == 1 for k in expected),
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


async def _wait_healthy(session: aiohttp.ClientSession, base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            async with session.get(base + "/healthz") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit("bench: the service did not become healthy")


async def _put_all(session: aiohttp.ClientSession, base: str, n: int, every: int,
                   callback: str) -> None:
    queue = iter(range(n))

    async def worker() -> None:
        for i in queue:
            body = {"every": every, "task": {"callback_url": callback}}
            async with session.put(f"{base}/schedules/s{i}", json=body) as r:
                if r.status != 201:
                    raise SystemExit(f"bench: PUT /schedules/s{i} -> {r.status} "
                                     f"{await r.text()}")

    await asyncio.gather(*(worker() for _ in range(32)))


async def _sleep_until(epoch_s: float) -> None:
    await asyncio.sleep(max(0.0, epoch_s - time.time()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["materializer", "service", "both"], default="both")
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=60)
    parser.add_argument("--minutes", type=int, default=2)
    parser.add_argument("--flow-parallelism", type=int, default=10_000,
                        help="TIMEWHEEL_FLOW_PARALLELISM of the service (its default is 100)")
    args = parser.parse_args(argv)
    facts = machine_facts()
    print_machine(facts)
    results: dict[str, Any] = {"machine": facts, "command": " ".join(sys.argv)}
    if args.part in ("materializer", "both"):
        results["materializer"] = run(bench_materializer(args.schedules, args.every,
                                                         args.minutes))
        print(json.dumps(results["materializer"], indent=2))
    if args.part in ("service", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            results["service"] = run(bench_service(args.schedules, args.every, args.minutes,
                                                   Path(tmp), args.flow_parallelism))
        print(json.dumps(results["service"], indent=2))
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (out / f"{stamp}-schedules.json").write_text(json.dumps(results, indent=2))
    correct = all(part.get("correct", True) for key, part in results.items()
                  if key in ("materializer", "service"))
    return 0 if correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
