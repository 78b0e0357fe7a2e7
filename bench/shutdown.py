"""How long ``timewheel serve`` takes to exit on SIGTERM while its Redis does not answer: one
process on a redis-server of its own (tests/support); a schedule firing every second, so the
materializer has passes to make and the process holds claims of its occurrences (to a
closed port), or with ``--idle`` nothing at all. Redis is stopped (SIGSTOP) half a second
before the SIGTERM and continued after the exit. Prints each round's time from SIGTERM to
exit (bench/README.md, "A shutdown beside a silent Redis"). Run it from the checkout whose
code it should measure: the process is started with this directory first on its path.

    python -m bench.shutdown
    python -m bench.shutdown --idle --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.e2e.conftest import Service
from tests.support.redis_server import RedisServer


def one_round(idle: bool) -> float:
    directory = Path(tempfile.mkdtemp(prefix="timewheel-shutdown-"))
    with RedisServer(directory / "redis") as redis:
        service = Service(directory / "service", redis.url).start()
        try:
            if not idle:
                with service.client() as client:
                    created = client.put("/schedules/every-second", json={
                        "every": 1, "task": {"callback_url": "http://127.0.0.1:9/never"}})
                assert created.status_code == 201, created.text
            time.sleep(2)  # a few ticks and passes
            with redis.stopped():
                time.sleep(0.5)
                sent = time.monotonic()
                code = service.stop(timeout=120)
                took = time.monotonic() - sent
        finally:
            service.kill()
    if code != 0:
        raise SystemExit(f"timewheel serve exited {code}; its log: {service.log_path}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", action="store_true", help="no schedule: nothing in flight")
    args = parser.parse_args()
    times = []
    for n in range(args.rounds):
        times.append(one_round(args.idle))
        print(f"round {n + 1}: SIGTERM to exit {times[-1]:.2f} s")
    print(f"median {statistics.median(times):.2f} s, max {max(times):.2f} s "
          f"over {len(times)} rounds")


if __name__ == "__main__":
    main()
