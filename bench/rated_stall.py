"""How soon after a Redis stall a rated flow's tasks go out, beside an unrated flow's: one
``timewheel serve`` on a redis-server of its own (tests/support), 24 tasks in each flow
(``rated``: ``rate: 50``, which never binds here; ``plain``: no limit) due 0.3 s apart from
2.5 s on; Redis is stopped (SIGSTOP) from 3 s to 11 s. Prints, per flow, the first arrival of
each task due during the stall minus the later of its due time and Redis's return
(bench/README.md, "Soak with a rated flow").

    python -m bench.rated_stall
    python -m bench.rated_stall --rounds 3
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisServer

TASKS, SPACING_S, FIRST_DUE_S, STALL_FROM_S, STALL_S = 24, 0.3, 2.5, 3.0, 8.0
FLOWS = ("rated", "plain")


def one_round() -> dict[str, list[float]]:
    directory = Path(tempfile.mkdtemp(prefix="timewheel-rated-stall-"))
    with RedisServer(directory / "redis") as redis, ThreadedReceiver() as receiver:
        service = Service(directory / "service", redis.url, lease_margin_seconds="2",
                          tick_seconds="1").start()
        try:
            with httpx.Client(base_url=service.base_url) as client:
                assert client.put("/flows/rated", json={"rate": 50}).status_code == 200
                t0 = time.time()
                due = {f"{flow}-{i}": t0 + FIRST_DUE_S + i * SPACING_S
                       for i in range(TASKS) for flow in FLOWS}
                items = [{"key": key, "callback_url": receiver.url("/" + key.split("-")[0]),
                          "execute_at": at, "timeout": 2,
                          **({"flow_key": "rated"} if key.startswith("rated") else {})}
                         for key, at in due.items()]
                created = client.post("/tasks/batch", json={"tasks": items})
                assert created.status_code == 200, created.text
            time.sleep(max(0.0, t0 + STALL_FROM_S - time.time()))
            assert redis._proc is not None
            pid = redis._proc.pid
            os.kill(pid, signal.SIGSTOP)
            stopped = time.time()
            time.sleep(STALL_S)
            os.kill(pid, signal.SIGCONT)
            back = time.time()
            deadline = back + 20
            while time.time() < deadline and len({a.headers.get("webhook-id")
                                                  for a in receiver.arrivals}) < len(due):
                time.sleep(0.2)
            first: dict[str, float] = {}
            for arrival in receiver.arrivals:
                first.setdefault(arrival.headers["webhook-id"], arrival.received_at)
        finally:
            service.kill()
    missing = sorted(set(due) - set(first))
    if missing:
        raise SystemExit(f"never arrived: {missing}")
    return {flow: sorted(first[k] - max(due[k], back) for k in due
                         if k.startswith(flow) and due[k] >= stopped) for flow in FLOWS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    for n in range(args.rounds):
        result = one_round()
        for flow, delays in result.items():
            late = sum(1 for d in delays if d > 0.5)
            print(f"round {n + 1} {flow:5s}: {len(delays)} due in the stall, after Redis was "
                  f"back p50 {delays[len(delays) // 2]:.3f} s, max {delays[-1]:.3f} s, "
                  f"{late} more than 0.5 s")


if __name__ == "__main__":
    main()
