"""Garbage-collector pauses of the service under test, for the bench's tail-lateness report.

Imported first by the bench's service command (bench/service.py SERVE_CMD). With
``TIMEWHEEL_BENCH_GC_LOG=<path>`` in the environment it appends one line per collection:

    <epoch seconds at the end> <pause ms> <generation> <objects collected>

through ``gc.callbacks``; without it, it does nothing. The service itself has no such hook.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

ENV = "TIMEWHEEL_BENCH_GC_LOG"


def install(path: str) -> None:
    out = open(path, "a", buffering=1)  # open for the life of the process
    started = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - started) * 1000
        out.write(f"{time.time():.6f} {pause_ms:.3f} {info['generation']} {info['collected']}\n")

    gc.callbacks.append(callback)


def read(path: str, since: float, until: float) -> list[tuple[float, float, int, int]]:
    """(end epoch s, pause ms, generation, collected) of the collections that ended in
    [since, until]."""
    found = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 4 and since <= float(parts[0]) <= until:
                    found.append((float(parts[0]), float(parts[1]), int(parts[2]),
                                  int(parts[3])))
    except OSError:
        pass
    return found


if os.environ.get(ENV):
    install(os.environ[ENV])
