"""CPU of one wake of the dispatcher's timeline (timewheel/engine/timeline.py): 1,000 items
2 ms apart, each its own wake, against a bare ``asyncio.sleep`` loop waking as often (what
any wake costs on this machine). CPU is the process's own (``time.process_time()``).

    python -m bench.timeline_wake
"""

from __future__ import annotations

import asyncio
import time

from bench.common import run
from timewheel.clock import SystemClock
from timewheel.engine.timeline import Timeline

ITEMS = 1000
APART_MS = 2.0


async def measure() -> dict[str, float]:
    clock = SystemClock()
    fired: list[int] = []
    line: Timeline[int] = Timeline(clock, fired.append)
    first = clock.wall_ms() + 20
    for i in range(ITEMS):
        line.add(first + i * APART_MS, i)
    start = time.process_time()
    while len(fired) < ITEMS:
        await asyncio.sleep(0.05)
    timeline_us = (time.process_time() - start) / ITEMS * 1e6
    await line.close()
    start, t0 = time.process_time(), time.monotonic() + 0.02
    for i in range(ITEMS):
        await asyncio.sleep(max(0.0, t0 + i * APART_MS / 1000 - time.monotonic()))
    bare_us = (time.process_time() - start) / ITEMS * 1e6
    return {"timeline": timeline_us, "bare asyncio.sleep": bare_us}


def main() -> None:
    for name, us in run(measure()).items():
        print(f"{name:20s} {us:7.1f} µs CPU a wake")


if __name__ == "__main__":
    main()
