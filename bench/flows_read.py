"""What reading every configured flow costs: ``GET /flows`` and a ``/metrics`` scrape (which
sets the per-flow gauges the same way) with N flows configured, through the ASGI app in this
process against a redis-server of its own; wall time of each request (bench/README.md,
"Reading every flow: GET /flows and the scrape"). ``--parked N`` also lists N other flows in
each bucket's index of flows with parked tasks (as a wheel with N flows held back has) and
times ``GET /flows/{key}`` of one flow.

    python -m bench.flows_read                 # 300 flows, 5 rounds
    python -m bench.flows_read --flows 1000
    python -m bench.flows_read --flows 1 --parked 20000
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import httpx
from redis.asyncio import Redis

from bench.common import run, scratch_redis
from timewheel.api.app import create_app
from timewheel.settings import Settings
from timewheel.store.keys import Keyspace

HOST = "127.0.0.1"


async def measure(port: int, flows: int, rounds: int, parked: int) -> dict[str, list[float]]:
    """Milliseconds of each GET /flows and GET /metrics (and GET /flows/{key} with
    ``parked``), alternating, ``rounds`` of each."""
    os.environ["TIMEWHEEL_LOG_LEVEL"] = "warning"
    app = create_app(Settings(redis_url=f"redis://{HOST}:{port}", allow_private_networks=True),
                     run_ticker=False)
    async with app.router.lifespan_context(app) as state:
        assert state is not None  # create_app's lifespan yields its state, {"wheel": ...}

        async def with_state(scope: Any, receive: Any, send: Any) -> None:
            await app({**scope, "state": dict(state)}, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(transport=transport, base_url="http://timewheel") as client:
            for i in range(flows):
                answer = await client.put(f"/flows/bench-{i:05d}", json={"parallelism": 5})
                if answer.status_code not in (200, 201):
                    raise SystemExit(f"PUT /flows answered {answer.status_code}: {answer.text}")
            took: dict[str, list[float]] = {"/flows": [], "/metrics": []}
            if parked:
                await _list_parked(state["wheel"].store.keys, port, parked)
                took["/flows/bench-00000"] = []
            for _ in range(rounds):
                for path, times in took.items():
                    start = time.perf_counter()
                    answer = await client.get(path)
                    times.append((time.perf_counter() - start) * 1000)
                    if answer.status_code != 200:
                        raise SystemExit(f"GET {path} answered {answer.status_code}")
    return took


async def _list_parked(keys: Keyspace, port: int, parked: int) -> None:
    """List ``parked`` flows (none of them asked for) in every bucket's parked-flows index:
    only the index, which is what the loads read first (their tasks would be read only for a
    flow asked for)."""
    redis = Redis(host=HOST, port=port)
    try:
        for bucket in range(keys.buckets):
            members = {f"parked-{i:06d}": 1 for i in range(parked)}
            await redis.zadd(keys.waiting_flows(bucket), members)
    finally:
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--flows", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parked", type=int, default=0,
                        help="other flows listed as parked in every bucket")
    args = parser.parse_args()
    with scratch_redis() as port:
        took = run(measure(port, args.flows, args.rounds, args.parked))
    for path, times in took.items():
        ordered = sorted(times)
        print(f"GET {path} with {args.flows} flows, {args.parked} parked: "
              f"median {ordered[len(ordered) // 2]:.1f} ms (min {ordered[0]:.1f}, "
              f"max {ordered[-1]:.1f}, {len(times)} requests)")


if __name__ == "__main__":
    main()
