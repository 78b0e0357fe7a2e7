"""Lateness of what is made due before the next tick: tasks created with a delay under a
second, and schedules whose first occurrence comes within two seconds of their PUT. One
``timewheel serve`` (tick 1 s) on a redis-server of its own (tests/support), a threaded
receiver; the requests come at random moments (seeded), so they fall anywhere between two
ticks. Prints the first arrival of each minus its due time (bench/README.md, "Tasks made due
before the next tick").

    python -m bench.due_soon
    python -m bench.due_soon --tasks 60 --schedules 30 --seed 2
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def measure(tasks: int, schedules: int, seed: int) -> dict[str, list[float]]:
    draw = random.Random(seed)
    directory = Path(tempfile.mkdtemp(prefix="timewheel-due-soon-"))
    due: dict[str, tuple[str, float]] = {}  # path -> (kind, due time)
    with RedisServer(directory / "redis") as redis, ThreadedReceiver() as receiver:
        service = Service(directory / "service", redis.url, tick_seconds="1").start()
        try:
            with httpx.Client(base_url=service.base_url) as client:
                time.sleep(1.5)  # past the first ticks
                for n in range(tasks):
                    time.sleep(draw.uniform(0.05, 0.3))
                    r = client.post("/tasks", json={
                        "key": f"t{n}", "callback_url": receiver.url(f"/t{n}"),
                        "delay": draw.uniform(0.05, 0.95)})
                    assert r.status_code == 201, r.text
                    due[f"/t{n}"] = ("task", seconds(r.json()["execute_at"]))
                for n in range(schedules):
                    time.sleep(draw.uniform(0.05, 0.6))
                    r = client.put(f"/schedules/s{n}", json={
                        "every": 2, "task": {"callback_url": receiver.url(f"/s{n}")}})
                    assert r.status_code == 201, r.text
                    due[f"/s{n}"] = ("occurrence", seconds(r.json()["next_run_at"]))
                deadline = time.time() + 10
                while time.time() < deadline and not set(due) <= {
                        a.path for a in receiver.arrivals}:
                    time.sleep(0.1)
        finally:
            service.kill()
        first: dict[str, float] = {}
        for arrival in receiver.arrivals:
            first.setdefault(arrival.path, arrival.received_at)
    missing = sorted(set(due) - set(first))
    if missing:
        raise SystemExit(f"never arrived: {missing}")
    out: dict[str, list[float]] = {"task": [], "occurrence": []}
    for path, (kind, at) in due.items():
        out[kind].append((first[path] - at) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--schedules", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for kind, late in measure(args.tasks, args.schedules, args.seed).items():
        late.sort()
        print(f"{kind:10s} n={len(late)}: lateness p50 {late[len(late) // 2]:.1f} ms, "
              f"max {late[-1]:.1f} ms, {sum(1 for x in late if x > 100)} over 100 ms")


if __name__ == "__main__":
    main()
