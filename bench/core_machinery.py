"""What the event-loop machinery of one attempt costs, apart from the work it carries:
the dispatcher's shape (a coroutine per attempt) against one callback per due millisecond.

    python -m bench.core_machinery                  # 3,000 and 10,000 a second, 3 rounds
    python -m bench.core_machinery --rates 4000 --rounds 5

Issue #20's next step was to be structural: one step of the loop starts, sends and records
every attempt of a due millisecond, instead of a coroutine per attempt. Before rebuilding the
core for it, this bounds what it could save. Both designs below do no real work (no Redis, no
HTTP: a start, an answer and a record are futures resolved ~0.3 ms later by a timer), so the
difference is the machinery alone, the most such a rebuild could take off a callback:

- ``coroutine``: as timewheel/engine/dispatcher.py runs an attempt. A timeline releases it on
  the 5 ms grid 20 ms before due into a queue; one of 512 workers takes it, sleeps until the
  start check (the grid, 5 ms before due), awaits its start (one batch future per grid point),
  sleeps until due, awaits its answer under a deadline timer, then records it with a future and
  a callback. Sleeps re-check the clock and sleep again, as ``RedisClock.sleep_until`` does.
- ``callback``: one timer per grid point starts its attempts with one call; one timer per due
  millisecond sends them all from one callback; each answer is a future with a done-callback
  that records it. No coroutine per attempt, no queue, no per-attempt sleep.

CPU is the process's own (``time.process_time()``) over all attempts, so it includes the
event loop and the clock re-checks of the last fraction of a millisecond (uvloop runs a delay
under 0.5 ms as ``call_soon``); both designs re-check alike.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
import time
from collections.abc import Callable
from typing import Any

from bench.common import machine_facts, print_machine, run

SECONDS = 5
GRID_MS = 5.0
START_LEAD_MS = 20.0
CHECK_LEAD_MS = 5.0
ANSWER_S = 0.0003  # a start call's and an answer's round trip, stood in for by a timer
WORKERS = 512  # TIMEWHEEL_MAX_CONCURRENCY's default: never short of workers here


def wall_ms() -> float:
    return time.time() * 1000.0


def on_grid(ms: float) -> float:
    return ms // GRID_MS * GRID_MS


async def sleep_until(when_ms: float) -> None:
    while (delay := when_ms - wall_ms()) > 0:
        await asyncio.sleep(delay / 1000.0)


def _answer_later(loop: asyncio.AbstractEventLoop, future: asyncio.Future[int]) -> None:
    def answer() -> None:
        if not future.done():
            future.set_result(200)

    loop.call_later(ANSWER_S, answer)


class Tally:
    """Counts recorded attempts; ``done`` once all are."""

    def __init__(self, attempts: int) -> None:
        self.left = attempts
        self.done = asyncio.Event()

    def recorded(self, _: asyncio.Future[bool]) -> None:
        self.left -= 1
        if not self.left:
            self.done.set()

    def record(self, loop: asyncio.AbstractEventLoop) -> None:
        """As Recorder.record_soon: a future of the batch and a callback."""
        record: asyncio.Future[bool] = loop.create_future()
        record.add_done_callback(self.recorded)
        loop.call_soon(record.set_result, True)


class CoroutineDesign:
    def __init__(self, loop: asyncio.AbstractEventLoop, tally: Tally) -> None:
        self.loop = loop
        self.tally = tally
        self.ready: asyncio.Queue[float] = asyncio.Queue()
        self.starting: list[asyncio.Future[int]] = []

    def start_batch(self) -> None:
        batch = self.starting[:]
        self.starting.clear()
        for future in batch:
            future.set_result(1)

    async def attempt(self, due: float) -> None:
        loop = self.loop
        await sleep_until(on_grid(due - CHECK_LEAD_MS))
        started: asyncio.Future[int] = loop.create_future()
        if not self.starting:
            loop.call_later(ANSWER_S, self.start_batch)
        self.starting.append(started)
        await started
        await sleep_until(due)
        answer: asyncio.Future[int] = loop.create_future()
        _answer_later(loop, answer)
        deadline = loop.call_later(30, lambda: None)
        await answer
        deadline.cancel()
        self.tally.record(loop)

    async def worker(self) -> None:
        while True:
            await self.attempt(await self.ready.get())

    async def run(self, dues: list[float]) -> None:
        workers = [asyncio.create_task(self.worker()) for _ in range(WORKERS)]
        heap = list(dues)
        heapq.heapify(heap)
        while heap:  # the timeline: one sleeper for all
            await sleep_until(on_grid(heap[0] - START_LEAD_MS))
            while heap and on_grid(heap[0] - START_LEAD_MS) <= wall_ms():
                self.ready.put_nowait(heapq.heappop(heap))
        await self.tally.done.wait()
        for task in workers:
            task.cancel()


class CallbackDesign:
    def __init__(self, loop: asyncio.AbstractEventLoop, tally: Tally) -> None:
        self.loop = loop
        self.tally = tally
        self.by_ms: dict[int, int] = {}

    def at(self, ms: float, callback: Callable[..., None], *args: Any) -> None:
        self.loop.call_later(max(0.0, ms - wall_ms()) / 1000.0, callback, *args)

    def answered(self, _: asyncio.Future[int], deadline: asyncio.TimerHandle) -> None:
        deadline.cancel()
        self.tally.record(self.loop)

    def send_all(self, ms: int) -> None:
        loop = self.loop
        if wall_ms() < ms:  # early: as the coroutines' sleeps, look again
            loop.call_soon(self.send_all, ms)
            return
        for _ in range(self.by_ms[ms]):
            answer: asyncio.Future[int] = loop.create_future()
            deadline = loop.call_later(30, lambda: None)
            def on_answer(f: asyncio.Future[int], d: asyncio.TimerHandle = deadline) -> None:
                self.answered(f, d)

            answer.add_done_callback(on_answer)
            _answer_later(loop, answer)

    def check(self, grid: float, due_ms: list[int]) -> None:
        if wall_ms() < grid:
            self.loop.call_soon(self.check, grid, due_ms)
            return
        # One start call for the grid point; its answer schedules each due millisecond.
        self.loop.call_later(ANSWER_S, self.started, due_ms)

    def started(self, due_ms: list[int]) -> None:
        for ms in due_ms:
            self.at(ms, self.send_all, ms)

    async def run(self, dues: list[float]) -> None:
        for due in dues:
            self.by_ms[int(due)] = self.by_ms.get(int(due), 0) + 1
        grids: dict[float, list[int]] = {}
        for ms in self.by_ms:
            grids.setdefault(on_grid(ms - CHECK_LEAD_MS), []).append(ms)
        for grid, due_ms in grids.items():
            self.at(grid, self.check, grid, due_ms)
        await self.tally.done.wait()


async def run_design(design: str, dues: list[float]) -> None:
    loop = asyncio.get_running_loop()
    await DESIGNS[design](loop, Tally(len(dues))).run(dues)


DESIGNS: dict[str, type[CoroutineDesign] | type[CallbackDesign]] = {
    "coroutine": CoroutineDesign, "callback": CallbackDesign}


def measure(design: str, rate: int, seed: int) -> float:
    """µs of CPU an attempt, ``rate`` attempts a second at random moments for SECONDS."""
    rng = random.Random(seed)
    first = wall_ms() + 300
    # Whole milliseconds, as tasks are stored: both designs send at the same instants.
    dues = sorted(float(int(first + rng.random() * SECONDS * 1000)) for _ in range(rate * SECONDS))
    start = time.process_time()
    run(run_design(design, dues))
    return (time.process_time() - start) / len(dues) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[3000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print_machine(machine_facts())
    for rate in args.rates:
        figures: dict[str, list[float]] = {name: [] for name in DESIGNS}
        for round_ in range(args.rounds):
            for name in DESIGNS:  # alternating, same due times
                figures[name].append(measure(name, rate, seed=round_))
        line = "  ".join(f"{name} {', '.join(f'{us:.1f}' for us in values)}"
                         for name, values in figures.items())
        print(f"{rate:6d}/s  µs of CPU an attempt: {line}")


if __name__ == "__main__":
    main()
