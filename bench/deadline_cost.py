"""What the request deadline (timewheel/api/deadline.py) costs a request: a trivial ASGI app
called directly, bare, under ``RequestDeadline`` (one watchdog timer for all requests) and
under ``asyncio.timeout`` per request (the first version), alternating, on uvloop
(bench/README.md, "The request deadline: what it costs").

    python -m bench.deadline_cost               # 100,000 calls a round, 3 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import uvloop

from timewheel.api.deadline import RequestDeadline

SCOPE = {"type": "http", "method": "GET", "path": "/"}


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def sink(message: Any) -> None:
    return None


class PerRequestTimeout:
    """The first version: ``asyncio.timeout`` around each request."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async with asyncio.timeout(self.seconds):
            await self.inner(scope, receive, send)


async def per_call_us(call: Any, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await call(SCOPE, None, sink)
    return (time.perf_counter() - started) / calls * 1e6


async def main(calls: int, rounds: int) -> None:
    ways = {"bare": app, "RequestDeadline": RequestDeadline(app, seconds=8),
            "asyncio.timeout": PerRequestTimeout(app, 8)}
    for n in range(rounds):
        figures = {name: await per_call_us(call, calls) for name, call in ways.items()}
        print(f"round {n + 1}: " + ", ".join(f"{name} {us:.2f} us" for name, us in
                                            figures.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    uvloop.run(main(args.calls, args.rounds))
