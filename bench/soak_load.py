"""The soak's load: tasks created over the whole run, every operation written to the history.

Each second, on average: 5 single POSTs, a batch of 8 every 2 s, 0.3 PUTs of a new key, 0.5
PUT replaces and 0.5 DELETEs of tasks not yet due, due 1-12 s ahead (0.5-6 s in the short
mode); 80 % of callbacks answer 200, 10 % answer 503 twice first, 10 % hang past the timeout
once. Schedules with ``every`` (2 s and 3 s from the start, 5 s from the middle; the 3 s one is
deleted at two thirds, all at the end). Before each fault, a *burst* of 17 tasks in one
bucket, one due a ms within 8 ms of the fault's instant (bench/soak_faults.py).
A quarter of the tasks (by key) belong to a flow with a rate that never binds at this load
(``RATED_FLOW``), so their attempts take the rated path under the faults: every start logged
in Redis, a late attempt asking its flow again, the hold at the write. Requests go to a random
serve process that is not being faulted; each runs as its own asyncio task, so a hung answer
never slows the load.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from bench.soak_faults import BURST, Fault, burst_keys
from bench.soak_receiver import parse_rfc3339
from timewheel.store.keys import Keyspace

if TYPE_CHECKING:
    from bench.soak import Wheel

CLIENT_TIMEOUT_S = 15.0  # past the service's own Redis timeouts (5 s socket, 1 s WAIT)
BEHAVIOURS = (("ok", 0.8), ("fail", 0.1), ("hang", 0.1))
RATED_FLOW, RATED_RATE = "soak-rated", 50.0  # ~3 tasks a second and ~4 of a burst's 17 in it


class Load:
    def __init__(self, wheel: Wheel, seed: int, t0: float, seconds: float, faults: list[Fault],
                 *, short: bool) -> None:
        self.wheel = wheel
        self.history = wheel.history
        self.rng = random.Random(seed * 7919 + 1)
        self.t0 = t0
        self.seconds = seconds
        self.faults = faults
        self.delay = (0.5, 6.0) if short else (1.0, 12.0)
        self.timeout = wheel.task_timeout
        self.pending: set[asyncio.Task[None]] = set()
        self.n = 0
        # key -> due, for acknowledged tasks not cancelled: what must arrive
        self.expect: dict[str, float] = {}
        self.movable: dict[str, float] = {}  # acknowledged, not yet due: replace/cancel targets
        self.session: aiohttp.ClientSession | None = None
        self.keys = Keyspace(wheel.key_prefix)  # the wheel's 16 buckets (a new wheel's default)

    # -- plumbing --------------------------------------------------------------------------

    def _base(self) -> str:
        up = [s for s in self.wheel.slots if s.up]
        slot = self.rng.choice(up or self.wheel.slots)
        return slot.service.base_url

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _call(self, method: str, path: str, body: Any | None
                    ) -> tuple[float, float, int | None, Any, str | None]:
        assert self.session is not None
        t0 = time.time()
        try:
            async with self.session.request(method, self._base() + path, json=body) as resp:
                data = await resp.json(content_type=None) if resp.status != 204 else None
                return t0, time.time(), resp.status, data, None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return t0, time.time(), None, None, f"{type(exc).__name__}: {exc}"[:200]

    def _task_body(self, key: str, behaviour: str, at: float | None, delay: float | None
                   ) -> dict[str, Any]:
        body: dict[str, Any] = {"callback_url": self.wheel.callback_url(behaviour),
                                "timeout": self.timeout, "max_attempts": 8, "retry_backoff": 0.5,
                                "body": {"n": self.n}}
        # By key, not by the seeded draws: the same load. Not by crc32, whose low bits fix the
        # bucket: no burst task (all in bucket 5) was ever in the flow.
        if hashlib.blake2s(key.encode()).digest()[0] % 4 == 0:
            body["flow_key"] = RATED_FLOW
        if at is not None:
            body["execute_at"] = at
        else:
            body["delay"] = delay
        return body

    def _when(self) -> tuple[float | None, float | None]:
        """An execute_at with microseconds (the service rounds up to the ms) or a delay."""
        ahead = self.rng.uniform(*self.delay)
        if self.rng.random() < 0.1:
            return None, round(ahead, 3)
        return round(time.time() + ahead, 6), None

    def _behaviour(self) -> str:
        r, acc = self.rng.random(), 0.0
        for name, share in BEHAVIOURS:
            acc += share
            if r < acc:
                return name
        return "ok"

    def _note(self, op: str, key: str, t0: float, t1: float, status: int | None,
              view: Any, error: str | None, requested: float | None, **extra: Any) -> None:
        at = parse_rfc3339(view.get("execute_at")) if isinstance(view, dict) else None
        self.history.add("op", op=op, key=key, t0=t0, t1=t1, status=status, error=error,
                         requested_at=requested, execute_at=at, **extra)
        if op in ("create", "replace") and status in (200, 201) and at is not None:
            self.expect[key] = at
            self.movable[key] = at
        elif op in ("create", "replace") and (status is None or status >= 500) \
                and key in self.expect:
            self.expect[key] = max(self.expect[key], requested or 0.0)
        elif op == "cancel" and (status == 204 or status is None or status >= 500):
            self.expect.pop(key, None)

    # -- operations ------------------------------------------------------------------------

    def _new_key(self, prefix: str = "t") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    async def post(self) -> None:
        key, behaviour = self._new_key(), self._behaviour()
        at, delay = self._when()
        body = {"key": key, **self._task_body(key, behaviour, at, delay)}
        t0, t1, status, data, err = await self._call("POST", "/tasks", body)
        self._note("create", key, t0, t1, status, data, err, at, via="post", behaviour=behaviour)

    async def batch(self, items: list[tuple[str, str, float | None, float | None]],
                    via: str = "batch") -> None:
        bodies = [{"key": k, **self._task_body(k, b, at, d)} for k, b, at, d in items]
        t0, t1, status, data, err = await self._call("POST", "/tasks/batch", {"tasks": bodies})
        results = data.get("results") if status == 200 and isinstance(data, dict) else None
        for i, (key, behaviour, at, _) in enumerate(items):
            item = results[i] if results else {"status": status, "task": None}
            self._note("create", key, t0, t1, item.get("status"), item.get("task"), err, at,
                       via=via, behaviour=behaviour)

    async def put_new(self) -> None:
        key, behaviour = self._new_key("p"), self._behaviour()
        at, delay = self._when()
        t0, t1, status, data, err = await self._call("PUT", f"/tasks/{key}",
                                                      self._task_body(key, behaviour, at, delay))
        self._note("create", key, t0, t1, status, data, err, at, via="put", behaviour=behaviour)

    def _target(self, lead: float) -> str | None:
        """An acknowledged task due at least ``lead`` s from now (not yet started)."""
        now = time.time()
        for key, due in list(self.movable.items())[:50]:
            if due < now + lead:
                self.movable.pop(key, None)
        ok = [k for k, due in self.movable.items() if due > now + lead]
        return self.rng.choice(ok) if ok else None

    async def replace(self) -> None:
        key = self._target(4.0)
        if key is None:
            return
        self.movable.pop(key)
        at = round(self.expect.get(key, time.time()) + self.rng.uniform(0.5, 6), 6)
        t0, t1, status, data, err = await self._call("PUT", f"/tasks/{key}",
                                                      self._task_body(key, "ok", at, None))
        self._note("replace", key, t0, t1, status, data, err, at, via="put", behaviour="ok")

    async def cancel(self) -> None:
        key = self._target(3.0)
        if key is None:
            return
        self.movable.pop(key)
        t0, t1, status, _, err = await self._call("DELETE", f"/tasks/{key}", None)
        self._note("cancel", key, t0, t1, status, None, err, None)

    async def schedule(self, sid: str, every: float | None) -> None:
        if every is None:
            t0, t1, status, _, err = await self._call("DELETE", f"/schedules/{sid}", None)
            self._note("schedule_delete", sid, t0, t1, status, None, err, None)
            return
        body = {"every": every, "task": {"callback_url": self.wheel.callback_url("ok"),
                                         "timeout": self.timeout}}
        t0, t1, status, _, err = await self._call("PUT", f"/schedules/{sid}", body)
        self._note("schedule_put", sid, t0, t1, status, None, err, None, every=every)

    async def _rate_flow(self) -> None:
        """Set RATED_FLOW's rate before the first task (no fault runs yet)."""
        for _ in range(10):
            _, _, status, _, err = await self._call("PUT", f"/flows/{RATED_FLOW}",
                                                    {"rate": RATED_RATE})
            if status == 200:
                return
            await asyncio.sleep(0.5)
        raise RuntimeError(f"PUT /flows/{RATED_FLOW}: {status} {err}")

    def burst(self, n: int, fault: Fault) -> None:
        at = self.t0 + fault.at
        items: list[tuple[str, str, float | None, float | None]] = [
            (key, "ok", round(at + offset, 3), None)
            for key, offset in zip(burst_keys(self.keys, n), BURST, strict=True)]
        self._spawn(self.batch(items, via="burst"))

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as self.session:
            await self._rate_flow()
            self._spawn(self.schedule("every2", 2))
            self._spawn(self.schedule("every3", 3))
            bursts = sorted(enumerate(self.faults), key=lambda f: f[1].at)
            step, tick, end = 0.1, 0, self.t0 + self.seconds
            rates = ((self.post, 5.0), (self.put_new, 0.3), (self.replace, 0.5),
                     (self.cancel, 0.5))
            while time.time() < end:
                elapsed = time.time() - self.t0
                while bursts and bursts[0][1].at - 5.0 <= elapsed:
                    n, fault = bursts.pop(0)
                    self.burst(n, fault)
                for op, rate in rates:
                    if self.rng.random() < rate * step:
                        self._spawn(op())
                if tick % 20 == 0:
                    items = [(self._new_key(), self._behaviour(), *self._when())
                             for _ in range(8)]
                    self._spawn(self.batch(items))
                if tick == int(self.seconds / step / 2):
                    self._spawn(self.schedule("every5", 5))
                if tick == int(self.seconds / step * 2 / 3):
                    self._spawn(self.schedule("every3", None))
                tick += 1
                await asyncio.sleep(max(0.0, self.t0 + tick * step - time.time()))
            for sid in ("every2", "every5"):
                self._spawn(self.schedule(sid, None))
            while self.pending:
                await asyncio.gather(*list(self.pending), return_exceptions=True)
