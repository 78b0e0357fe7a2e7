"""What one ``POST /tasks`` costs the app itself: CPU per request through the ASGI app in this
process, with no HTTP server and no load generator beside it (their share of a shared machine
is what makes ``--workload post`` noisy). Redis is a redis-server of its own, so its CPU is not
counted, only what the app does (bench/README.md, "``POST /tasks`` off FastAPI's routing").

    python -m bench.post_cost                   # 3,000 requests after 200 of warm-up
    python -m bench.post_cost --requests 10000
    python -m bench.post_cost --profile         # cProfile of the timed requests (slower)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import time
from typing import Any

from bench.common import run, scratch_redis
from timewheel.api.app import create_app
from timewheel.settings import Settings

HOST = "127.0.0.1"


async def measure(port: int, requests: int, profile: bool) -> float:
    """CPU µs per request, the task's key new each time, as a client would send it."""
    os.environ["TIMEWHEEL_LOG_LEVEL"] = "warning"
    app = create_app(Settings(redis_url=f"redis://{HOST}:{port}", allow_private_networks=True),
                     run_ticker=False)
    async with app.router.lifespan_context(app) as state:
        assert state is not None  # create_app's lifespan yields its state, {"wheel": ...}
        async def post(number: int) -> None:
            body = json.dumps({"key": f"bench-post-{number:012d}", "delay": 3600, "body": "hi",
                               "callback_url": "http://127.0.0.1:9/callback"}).encode()
            scope: dict[str, Any] = {
                "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "method": "POST", "scheme": "http", "path": "/tasks", "raw_path": b"/tasks",
                "root_path": "", "query_string": b"", "server": (HOST, 8080),
                "client": (HOST, 50000), "state": dict(state),
                "headers": [(b"host", b"timewheel"), (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]}
            messages = [{"type": "http.request", "body": body, "more_body": False}]
            answered: list[Any] = []

            async def receive() -> Any:
                if messages:
                    return messages.pop()
                await asyncio.Event().wait()  # the client never leaves

            async def send(message: Any) -> None:
                answered.append(message)

            await app(scope, receive, send)
            if answered[0]["status"] != 201:
                raise SystemExit(f"POST /tasks answered {answered}")

        for number in range(-200, 0):
            await post(number)
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        start = time.process_time()
        for number in range(requests):
            await post(number)
        spent = time.process_time() - start
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    return spent / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with scratch_redis("--zset-max-ziplist-entries", "512") as port:
        cost = run(measure(port, args.requests, args.profile))
    print(f"POST /tasks: {cost:.0f} µs of the app's CPU a request "
          f"({args.requests} requests, in process, Redis and HTTP excluded)")


if __name__ == "__main__":
    main()
