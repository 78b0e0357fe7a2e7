"""Precision and throughput of `timewheel serve` on this machine (one process, or N on one Redis).

    python -m bench.run --workload all            # post, spread, burst, retry
    python -m bench.run --workload spread --tasks 10000
    python -m bench.run --workload sustained --rate 4000 # 4,000 a second for --window s
    python -m bench.run --workload sustained --rate 4000 --processes 2  # two on one Redis
    python -m bench.run --workload all --fake-service --tasks 2000   # harness self-test

Starts bench/receiver.py (subprocess) and one ``timewheel serve`` (subprocess,
free port, temporary data dir, embedded Redis unless TIMEWHEEL_REDIS_URL is
set), waits for ``GET /healthz``, runs the workloads and writes one JSON file
per workload to bench/results/. See bench/README.md for what each measures.
``--processes N`` starts N services on one shared Redis instead (bench/services.py).

Lateness is ``arrival - execute_at``: arrival is the receiver's ``time.time()``
once the callback is fully parsed, execute_at the epoch seconds (ms precision)
we asked for. Both clocks are this host's, so no skew enters; the figure
includes the HTTP send and the loopback hop, which is what a user sees.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import redis_commands
from bench.analysis import (
    FAIL_SUFFIX,
    analyse,
    analyse_retries,
    attribute_tail,
    epoch,
    print_result,
    verdict,
)
from bench.common import (
    RESULTS_DIR,
    end_leftover_children,
    machine_facts,
    print_machine,
    proc_children,
    require_loopback,
    run,
    start_receiver,
    stop_process,
    summary_ms,
)
from bench.service import (
    CpuMeter,
    RunProbe,
    Service,
    check_service_importable,
    start_service,
    wait_healthy,
)
from bench.services import Fleet, FleetProbe, start_fleet

WORKLOADS = ("post", "spread", "burst", "retry", "sustained")
DEFAULT_WORKLOADS = ("post", "spread", "burst", "retry")
# Redis-level benchmarks with their own sizes and a dedicated redis-server (no service).
STORE_WORKLOADS = {"memory": "bench.memory", "claim-cost": "bench.claim_cost"}


# --------------------------------------------------------------------------- the load


@dataclass
class Ctx:
    args: argparse.Namespace
    run_id: str
    base: str
    recv: str  # receiver base URL
    load: aiohttp.ClientSession  # many keep-alive connections for the load
    ctl: aiohttp.ClientSession  # a few for control calls
    pids: dict[str, int]
    headers: dict[str, str] = field(default_factory=dict)
    post_rate: float | None = None  # measured by the post workload, sizes the leads
    gc_log: Path | None = None  # the service's GC pauses (bench/gc_log.py)
    fleet: Fleet | None = None  # --processes N > 1: all of them (the load goes to the first)


@dataclass
class Submitted:
    status: Counter[int | str]
    latencies: list[float]  # seconds, successful requests
    done_at: dict[str, float]  # key -> time.time() when its POST answered 2xx
    ok_keys: set[str]
    wall: float
    first_error: str | None


async def submit(ctx: Ctx, bodies: list[tuple[str, bytes]], *, method: str = "POST",
                 ok: tuple[int, ...] = (200, 201)) -> Submitted:
    """Send ``bodies`` (key, JSON) in list order with --concurrency workers, no retries.
    With ``--submit batch``, POSTs go 1,000 at a time through POST /tasks/batch (quicker to
    set up a burst; the post workload always measures single POSTs)."""
    if method == "POST" and ctx.args.submit == "batch":
        return await _submit_batches(ctx, bodies, ok)
    status: Counter[int | str] = Counter()
    lat: list[float] = []
    done_at: dict[str, float] = {}
    ok_keys: set[str] = set()
    first_error: list[str] = []
    idx = 0
    headers = {"content-type": "application/json", **ctx.headers}
    timeout = aiohttp.ClientTimeout(total=ctx.args.request_timeout)
    deadline = time.perf_counter() + ctx.args.max_submit_seconds

    async def worker() -> None:
        nonlocal idx
        while idx < len(bodies) and time.perf_counter() < deadline:
            key, body = bodies[idx]
            idx += 1
            t0 = time.perf_counter()
            try:
                if method == "POST":
                    req = ctx.load.post(ctx.base + "/tasks", data=body, headers=headers,
                                        timeout=timeout)
                else:
                    req = ctx.load.request(method, f"{ctx.base}/tasks/{key}", headers=ctx.headers,
                                           timeout=timeout)
                async with req as r:
                    text = await r.read()
                    code: int | str = r.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                code, text = type(exc).__name__, repr(exc).encode()
            status[code] += 1
            if code in ok:
                lat.append(time.perf_counter() - t0)
                done_at[key] = time.time()
                ok_keys.add(key)
            elif not first_error:
                first_error.append(f"{code}: {text[:300].decode(errors='replace')}")

    w0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(ctx.args.concurrency)))
    wall = time.perf_counter() - w0
    skipped = len(bodies) - sum(status.values())
    if skipped:
        status["not_sent_time_limit"] = skipped
    return Submitted(status, lat, done_at, ok_keys, wall, first_error[0] if first_error else None)


async def recv_reset(ctx: Ctx) -> None:
    async with ctx.ctl.post(ctx.recv + "/_bench/reset") as r:
        r.raise_for_status()


async def recv_count(ctx: Ctx) -> int:
    async with ctx.ctl.get(ctx.recv + "/_bench/stats") as r:
        return int((await r.json())["count"])


async def recv_records(ctx: Ctx, since: int = 0) -> list[list[Any]]:
    async with ctx.ctl.get(f"{ctx.recv}/_bench/records?since={since}") as r:
        data = await r.json()
        recs: list[list[Any]] = data["records"]
        return recs


async def wait_arrivals(ctx: Ctx, expected: int, deadline: float) -> int:
    """Poll the receiver until ``expected`` requests arrived or time.time() passes deadline."""
    while True:
        n = await recv_count(ctx)
        if n >= expected or time.time() > deadline:
            return n
        await asyncio.sleep(0.25)


def task_body(ctx: Ctx, key: str, execute_at: float, workload: str, **extra: Any) -> bytes:
    return json.dumps({
        "key": key,
        "callback_url": f"{ctx.recv}/cb/{workload}",
        "execute_at": execute_at,
        "body": {"bench": workload, "key": key},
        **extra,
    }).encode()


# --------------------------------------------------------------------------- workloads


async def wl_post(ctx: Ctx) -> dict[str, Any]:
    a = ctx.args
    now = time.time()
    keys = [f"{ctx.run_id}-post-{i:06d}" for i in range(a.tasks)]
    bodies = [(k, task_body(ctx, k, round(now + 3600 + i * 0.001, 3), "post")) for i, k in
              enumerate(keys)]
    meter = CpuMeter(ctx.pids)
    meter.start()
    sub = await submit(ctx, bodies)
    cpu = meter.stop()
    ctx.post_rate = len(sub.latencies) / sub.wall if sub.wall > 0 else None
    res: dict[str, Any] = {
        "requests": sum(sub.status.values()),
        "ok": len(sub.latencies),
        "errors": sum(v for k, v in sub.status.items() if k not in (200, 201)),
        "status": {str(k): v for k, v in sub.status.items()},
        "first_error": sub.first_error,
        "wall_s": round(sub.wall, 3),
        "requests_per_s": round(sum(sub.status.values()) / sub.wall, 1),
        "ok_per_s": round(ctx.post_rate or 0.0, 1),
        "latency": summary_ms(sub.latencies),
        "cpu": cpu,
    }
    # cancel them again (they are due in an hour): a second measurement, of DELETE
    meter.start()
    dele = await submit(ctx, [(k, b"") for k in sorted(sub.ok_keys)], method="DELETE", ok=(204,))
    res["cancel"] = {
        "requests": sum(dele.status.values()),
        "ok": len(dele.latencies),
        "status": {str(k): v for k, v in dele.status.items()},
        "first_error": dele.first_error,
        "requests_per_s": round(sum(dele.status.values()) / dele.wall, 1) if dele.wall else None,
        "latency": summary_ms(dele.latencies),
        "cpu": meter.stop(),
    }
    return res


async def _submit_batches(ctx: Ctx, bodies: list[tuple[str, bytes]],
                          ok: tuple[int, ...]) -> Submitted:
    status: Counter[int | str] = Counter()
    lat: list[float] = []
    done_at: dict[str, float] = {}
    ok_keys: set[str] = set()
    first_error: list[str] = []
    headers = {"content-type": "application/json", **ctx.headers}
    timeout = aiohttp.ClientTimeout(total=ctx.args.request_timeout)
    chunks = [bodies[i:i + 1000] for i in range(0, len(bodies), 1000)]
    w0 = time.perf_counter()
    for chunk in chunks:  # one at a time: the order of due times is kept
        payload = b'{"tasks":[' + b",".join(body for _, body in chunk) + b"]}"
        t0 = time.perf_counter()
        async with ctx.load.post(ctx.base + "/tasks/batch", data=payload, headers=headers,
                                 timeout=timeout) as r:
            answer = await r.json() if r.status == 200 else {"results": []}
            if r.status != 200 and not first_error:
                first_error.append(f"{r.status}: {(await r.text())[:300]}")
        now = time.time()
        for (key, _), result in zip(chunk, answer["results"], strict=False):
            status[result["status"]] += 1
            if result["status"] in ok:
                lat.append(time.perf_counter() - t0)
                done_at[key] = now
                ok_keys.add(key)
            elif not first_error:
                first_error.append(f"{result['status']}: {str(result['detail'])[:300]}")
    return Submitted(status, lat, done_at, ok_keys, time.perf_counter() - w0,
                     first_error[0] if first_error else None)


async def calibrate_post_rate(ctx: Ctx) -> float:
    """POST a few hundred far-future tasks (then DELETE them) to learn the service's POST rate."""
    n = max(200, min(1000, ctx.args.tasks // 10))
    far = time.time() + 3600
    keys = [f"{ctx.run_id}-calib{secrets.token_hex(2)}-{i:05d}" for i in range(n)]
    sub = await submit(ctx, [(k, task_body(ctx, k, round(far + i * 0.001, 3), "calibrate"))
                             for i, k in enumerate(keys)])
    await submit(ctx, [(k, b"") for k in sorted(sub.ok_keys)], method="DELETE", ok=(204,))
    rate = len(sub.latencies) / sub.wall if sub.wall > 0 else 0.0
    print(f"  calibration: {len(sub.latencies)}/{n} POSTs at {rate:.0f}/s", flush=True)
    return rate


async def _lead(ctx: Ctx, wanted: float) -> float:
    """Seconds from submission start to the first due time.

    Submission should be over before the first task falls due, so that what is measured is the
    firing alone, not firing while ingesting: lead = 1.5 x N / (POST rate) + 2 s, at least
    ``wanted``. The rate is the post workload's, or a short calibration's. --lead overrides.
    """
    if ctx.args.lead is not None:
        return float(ctx.args.lead)
    tasks: int = ctx.args.tasks
    if ctx.args.submit == "batch":  # batches go in at several thousand tasks per second
        return round(max(wanted, tasks / 2000 + 2.0), 1)
    if not ctx.post_rate:
        ctx.post_rate = await calibrate_post_rate(ctx) or None
    if ctx.post_rate:
        return round(max(wanted, 1.5 * tasks / ctx.post_rate + 2.0), 1)
    return wanted


async def _fire_and_collect(ctx: Ctx, workload: str, bodies: list[tuple[str, bytes]],
                            due: dict[str, float], expected_extra: int, wait_until: float,
                            prober: RetryProber | None = None) -> tuple[
                                Submitted, dict[str, Any], list[list[Any]], dict[str, Any]]:
    await recv_reset(ctx)
    meter = CpuMeter(ctx.pids)
    meter.start()
    probe: RunProbe | FleetProbe = (
        ctx.fleet.probe(ctx.ctl) if ctx.fleet is not None
        else RunProbe(ctx.ctl, ctx.base, ctx.gc_log, ctx.pids.get("service")))
    await probe.start()
    poller = asyncio.get_running_loop().create_task(prober.run()) if prober else None
    # CPU while the callbacks are due, apart from the creates before: what a callback costs.
    window_meter = asyncio.get_running_loop().create_task(
        _meter_window(ctx, min(due.values()), max(due.values()) + 0.5)) if due else None
    try:
        sub = await submit(ctx, bodies)
        submit_done = time.time()
        due = {k: v for k, v in due.items() if k in sub.ok_keys}  # only what was accepted
        n = await wait_arrivals(ctx, len(due) + expected_extra, wait_until)
    finally:
        if prober is not None and poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
            await prober.drain()
    cpu = meter.stop()
    tail = await probe.stop()
    records = await recv_records(ctx)
    res = analyse(records, due, sub.done_at)
    if window_meter is not None:
        res["cpu_due_window"] = _per_callback(await window_meter, res.get("_first", {}))
    res["tail"] = attribute_tail(res["_first"], due, tail)
    res["submit"] = {
        "ok": len(sub.ok_keys), "errors": sum(v for k, v in sub.status.items()
                                               if k not in (200, 201)),
        "status": {str(k): v for k, v in sub.status.items()}, "first_error": sub.first_error,
        "wall_s": round(sub.wall, 3), "per_s": round(len(sub.ok_keys) / sub.wall, 1),
        "finished_before_first_due_s": round(min(due.values()) - submit_done, 3) if due else None,
    }
    res["receiver_requests"] = n
    res["cpu"] = cpu
    return sub, res, records, due


async def _meter_window(ctx: Ctx, start: float, end: float) -> dict[str, Any]:
    """CPU seconds of each process from ``start`` to ``end`` (epoch seconds)."""
    meter = CpuMeter(ctx.pids)
    await asyncio.sleep(max(0.0, start - time.time()))
    meter.start()
    began = time.time()
    redis_before = await redis_commands.snapshot()
    await asyncio.sleep(max(0.0, end - time.time()))
    out = meter.stop()
    out["from"], out["to"] = began, time.time()
    if redis_before is not None:
        out["_redis"] = (redis_before, await redis_commands.snapshot())
    return out


def _per_callback(cpu: dict[str, Any], first: dict[str, float]) -> dict[str, Any]:
    """The due window's CPU per callback that arrived in it, in microseconds."""
    arrived = sum(1 for t in first.values() if cpu["from"] <= t <= cpu["to"])
    redis: tuple[dict[str, Any], dict[str, Any]] | None = cpu.pop("_redis", None)
    out = dict(cpu, callbacks=arrived)
    if redis is not None:
        out["redis_commands"] = redis_commands.per_callback(*redis, arrived)
    for key, value in cpu.items():
        if key.endswith("_cpu_s") and value is not None and arrived:
            out[key.removesuffix("_cpu_s") + "_us_per_callback"] = round(
                value * 1e6 / arrived, 1)
    return out


async def wl_spread(ctx: Ctx, *, workload: str = "spread", fail_every: int = 0) -> dict[str, Any]:
    a = ctx.args
    n, window = a.tasks, a.window
    lead = await _lead(ctx, a.spread_lead)
    t0 = time.time()
    start = t0 + lead
    keys: list[str] = []
    due: dict[str, float] = {}
    bodies: list[tuple[str, bytes]] = []
    extra: dict[str, Any] = {}
    if fail_every:
        extra = {"retry_backoff": a.retry_backoff, "max_attempts": 5}
    for i in range(n):
        k = f"{ctx.run_id}-{workload}-{i:06d}"
        if fail_every and i % fail_every == fail_every - 1:
            k += FAIL_SUFFIX
        at = round(start + i * window / n, a.due_digits)
        keys.append(k)
        due[k] = at
        bodies.append((k, task_body(ctx, k, at, workload, **extra)))
    n_fail = sum(1 for k in keys if k.endswith(FAIL_SUFFIX))
    wait_until = start + window + a.grace + (4 * a.retry_backoff if fail_every else 0)

    prober = RetryProber(ctx) if fail_every else None
    _sub, res, records, due = await _fire_and_collect(ctx, workload, bodies, due, n_fail,
                                                      wait_until, prober)
    res["config"] = {"tasks": n, "window_s": window, "rate_per_s": n / window, "lead_s": lead,
                     "first_due_after_submit_start_s": round(start - t0, 3),
                     "grace_s": a.grace}
    if fail_every:
        assert prober is not None
        res["retry"] = analyse_retries(records, due, prober.probes, a.retry_backoff)
        res["config"].update(fail_every=fail_every, failing_tasks=n_fail,
                             retry_backoff_s=a.retry_backoff, max_attempts=5)
    res.pop("_first")
    return res


async def wl_burst(ctx: Ctx) -> dict[str, Any]:
    a = ctx.args
    n = a.tasks
    lead = await _lead(ctx, a.burst_lead)
    t0 = time.time()
    at = round(t0 + lead, 3)
    keys = [f"{ctx.run_id}-burst-{i:06d}" for i in range(n)]
    due = dict.fromkeys(keys, at)
    bodies = [(k, task_body(ctx, k, at, "burst")) for k in keys]
    _sub, res, _records, due = await _fire_and_collect(ctx, "burst", bodies, due, 0,
                                                       at + a.grace + n / 500.0)
    first: dict[str, float] = res.pop("_first")
    arrivals = sorted(first.values())
    if arrivals:
        last = arrivals[-1]
        res["burst"] = {
            "due_at": at,
            "first_arrival_after_due_ms": round((arrivals[0] - at) * 1000, 3),
            "last_arrival_after_due_ms": round((last - at) * 1000, 3),
            "drain_s": round(last - at, 3),
            "callbacks_per_s_from_due": round(len(arrivals) / max(last - at, 1e-9), 1),
            "callbacks_per_s_first_to_last": round(
                len(arrivals) / max(last - arrivals[0], 1e-9), 1),
        }
    res["config"] = {"tasks": n, "lead_s": lead}
    return res


class RetryProber:
    """While the retry workload runs (from the first POST on): for each 503 the receiver
    answered, read the task's view (GET /tasks/{key}) before its retry is due, to learn the
    next_attempt_at the service chose (backoff with jitter). Bounded by --retry-probes; each
    probe re-reads every 25 ms while the task still shows as delivering (the 503 not recorded
    yet), for at most 2 x the backoff after the 503."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.probes: dict[str, dict[str, Any]] = {}
        self.since = 0
        self.pending: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Poll the receiver's new records every 100 ms until cancelled."""
        while True:
            try:
                await self.poll()
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)

    async def poll(self) -> None:
        recs = await recv_records(self.ctx, self.since)
        self.since += len(recs)
        for t, wid, attempt, _s, status, _m, _p in recs:
            if status == 503 and attempt in (1, None) and wid not in self.probes \
                    and len(self.probes) < self.ctx.args.retry_probes:
                self.probes[wid] = {"next_attempt_at": None, "attempt1": t,
                                    "view_status": "probing"}
                task = asyncio.get_running_loop().create_task(self.probe(wid, t))
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)

    async def drain(self) -> None:
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)

    async def probe(self, key: str, a1: float) -> None:
        ctx = self.ctx
        give_up = a1 + 2 * ctx.args.retry_backoff
        view: dict[str, Any] = {}
        seen: list[str] = []
        for _ in range(200):
            try:
                async with ctx.ctl.get(f"{ctx.base}/tasks/{key}", headers=ctx.headers) as r:
                    view = await r.json() if r.status == 200 else {"status": f"http {r.status}"}
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                view = {"status": repr(exc)}
            if not seen or seen[-1] != str(view.get("status")):
                seen.append(str(view.get("status")))
            nxt = epoch(view.get("next_attempt_at"))
            if view.get("status") == "retrying" and nxt is not None:
                self.probes[key] = {"next_attempt_at": nxt, "attempt1": a1,
                                    "read_at": time.time(), "attempts": view.get("attempts")}
                return
            if view.get("status") not in ("delivering", "scheduled") or time.time() > give_up:
                break
            await asyncio.sleep(0.025)
        self.probes[key] = {"next_attempt_at": None, "attempt1": a1,
                            "view_status": "->".join(seen),
                            "last_next_attempt_at": view.get("next_attempt_at")}


# --------------------------------------------------------------------------- main


async def _wait_up(args: argparse.Namespace, svc: Service, fleet: Fleet | None,
                   ctl: aiohttp.ClientSession) -> tuple[float, dict[str, int]]:
    """Wait for GET /healthz of the service (of every one of --processes); their pids."""
    if fleet is None:
        return await wait_healthy(svc, ctl, args.startup_timeout), svc.pids()
    return await fleet.wait_healthy(ctl, args.startup_timeout), fleet.pids()


def _exited(svc: Service, fleet: Fleet | None) -> str | None:
    if fleet is not None:
        return fleet.exited()
    return None if svc.proc.poll() is None else f"service exited ({svc.proc.returncode})"


async def _main(args: argparse.Namespace, svc: Service, rport: int, run_id: str,
                facts: dict[str, Any], stamp: str, fleet: Fleet | None = None) -> int:
    # one connector for the load: --concurrency keep-alive connections, no per-host cap below it
    load = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
        limit=args.concurrency, limit_per_host=args.concurrency, force_close=False))
    ctl = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32),
                                timeout=aiohttp.ClientTimeout(total=30))
    headers = {}
    tokens = os.environ.get("TIMEWHEEL_API_TOKENS", "")
    if tokens and not args.fake_service:
        headers["authorization"] = "Bearer " + tokens.split(",")[0].strip()
    failures: list[str] = []
    try:
        started, pids = await _wait_up(args, svc, fleet, ctl)
        print(f"service : {svc.base} up in {started:.1f} s; processes "
              + ", ".join(f"{k}" for k in pids) + f"; log {svc.log_path}")
        ctx = Ctx(args, run_id, svc.base, f"http://127.0.0.1:{rport}", load, ctl, pids, headers,
                  gc_log=svc.gc_log, fleet=fleet)
        names = list(DEFAULT_WORKLOADS) if args.workload == "all" else [args.workload]
        for name in names:
            await asyncio.sleep(args.pause)
            if dead := _exited(svc, fleet):
                failures.append(f"{dead} before {name}")
                break
            print(f"\n-- running {name} ({args.tasks} tasks) ...", flush=True)
            w_started = dt.datetime.now(dt.UTC)
            if name == "post":
                res = await wl_post(ctx)
            elif name == "spread":
                res = await wl_spread(ctx)
            elif name == "burst":
                res = await wl_burst(ctx)
            elif name == "sustained":
                res = await wl_spread(ctx, workload="sustained")
            else:
                res = await wl_spread(ctx, workload="retry", fail_every=args.fail_every)
            print_result(name, res)
            bad = verdict(name, res)
            failures.extend(bad)
            out = {
                "benchmark": name, "started_at": w_started.isoformat(timespec="seconds"),
                "command": "python -m bench.run " + " ".join(sys.argv[1:]),
                "fake_service": args.fake_service, "machine": facts,
                "service": {"command": svc.command, "env": svc.env, "pids": pids,
                            **(fleet.describe() if fleet is not None else {})},
                "loadgen": {"client": f"aiohttp {aiohttp.__version__}",
                            "concurrency": args.concurrency},
                "results": res, "failures": bad,
            }
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            path = Path(args.results_dir or RESULTS_DIR) / f"{stamp}-{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(out, indent=2))
            print(f"  written: {path}")
    finally:
        await load.close()
        await ctl.close()
    if failures:
        print("\nFAILURES (correctness, not speed):")
        for f in failures:
            print(f"  - {f}")
    return 1 if failures else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workload", choices=[*WORKLOADS, "all", *STORE_WORKLOADS], default="all",
                   help="all = post, spread, burst, retry; memory and claim-cost measure Redis "
                        "alone (their own options: python -m bench.memory --help)")
    p.add_argument("--tasks", type=int, default=10_000, help="tasks per workload")
    p.add_argument("--submit", choices=["post", "batch"], default="post",
                   help="spread/burst/retry: create tasks one POST each, or 1,000 per "
                        "POST /tasks/batch")
    p.add_argument("--concurrency", type=int, default=64,
                   help="concurrent keep-alive connections of the load client")
    p.add_argument("--window", type=float, default=10.0,
                   help="spread/retry/sustained: due window (s)")
    p.add_argument("--rate", type=float, default=4000.0,
                   help="sustained: callbacks due a second (tasks = rate x window, created "
                        "by POST /tasks/batch before the window; --tasks is ignored)")
    p.add_argument("--lead", type=float, default=None,
                   help="seconds from submission start to the first due time (default: "
                        "1.5 x tasks / POST rate + 2 s, the rate from the post workload or a "
                        "short calibration, at least --spread-lead / --burst-lead)")
    p.add_argument("--due-digits", type=int, choices=(3, 6), default=3,
                   help="spread/retry: decimals of execute_at (6: microsecond fractions, which "
                        "the service rounds up to its millisecond)")
    p.add_argument("--spread-lead", type=float, default=5.0, help="minimum lead, spread/retry")
    p.add_argument("--burst-lead", type=float, default=5.0, help="minimum lead, burst")
    p.add_argument("--grace", type=float, default=15.0,
                   help="wait this long after the last due time before calling a task lost")
    p.add_argument("--fail-every", type=int, default=10, help="retry: every Nth task answers 503")
    p.add_argument("--retry-backoff", type=float, default=1.0)
    p.add_argument("--retry-probes", type=int, default=300,
                   help="retry: at most this many GET /tasks/{key} probes of next_attempt_at")
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--max-submit-seconds", type=float, default=300.0,
                   help="stop submitting after this long (remaining tasks counted as not sent)")
    p.add_argument("--pause", type=float, default=2.0, help="idle seconds between workloads")
    p.add_argument("--startup-timeout", type=float, default=60.0)
    p.add_argument("--stop-timeout", type=float, default=45.0,
                   help="SIGTERM grace before SIGKILL (the batch deadline is 30 s)")
    p.add_argument("--sign", action="store_true", help="set a TIMEWHEEL_SIGNING_SECRET")
    p.add_argument("--service-port", type=int, default=0)
    p.add_argument("--processes", type=int, default=1,
                   help="run N services on one Redis (one the bench starts unless "
                        "TIMEWHEEL_REDIS_URL is set); the load goes to the first")
    p.add_argument("--service-cmd", default=None,
                   help="command template with {python} {host} {port} (default: timewheel.cli "
                        "main() with `serve`)")
    p.add_argument("--fake-service", action="store_true",
                   help="harness self-test against bench/fake_service.py (numbers mean nothing)")
    p.add_argument("--results-dir", default=None)
    p.add_argument("--keep-tmp", action="store_true", help="keep the data dir and service log")
    return p


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = _parser()
    args = p.parse_args(argv)
    if args.workload == "sustained":  # --rate a second for --window s, created beforehand
        args.tasks, args.submit = round(args.rate * args.window), "batch"
    if args.tasks < 1 or args.concurrency < 1 or args.processes < 1:
        p.error("--tasks, --concurrency and --processes must be positive")
    if args.processes > 1 and args.fake_service:
        p.error("--processes needs the real service (fake services share nothing)")
    return args


def _stop_service(args: argparse.Namespace, svc: Service,
                  recv_proc: subprocess.Popen[bytes], rc: int) -> int:
    """Stop the one service (SIGTERM), then the receiver; ``rc``, or 1 if the service did not
    exit 0."""
    children = proc_children(svc.proc.pid)
    t0 = time.perf_counter()
    svc.exit_code = stop_process(svc.proc, args.stop_timeout)
    print(f"\nservice stopped with exit code {svc.exit_code} after SIGTERM "
          f"({time.perf_counter() - t0:.1f} s)")
    end_leftover_children(children, "the service")
    stop_process(recv_proc, 10.0)
    if svc.exit_code != 0 and not args.fake_service:
        print(f"--- {svc.log_path} (tail) ---\n{svc.log_tail()}")
        rc = rc or 1
    return rc


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.workload in STORE_WORKLOADS:
        import importlib

        module = importlib.import_module(STORE_WORKLOADS[args.workload])
        return int(module.main(["--results-dir", args.results_dir] if args.results_dir else []))
    require_loopback("127.0.0.1")
    facts = machine_facts()
    print_machine(facts)
    if not args.fake_service:
        check_service_importable()
    run_id = f"{int(time.time()) % 100000:05d}{secrets.token_hex(2)}"
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}"
    tmp = Path(tempfile.mkdtemp(prefix="timewheel-bench-"))
    recv_proc, rport = start_receiver(
        [f"--fail-suffix={FAIL_SUFFIX}", "--max-seconds", "7200", "--out",
         str(tmp / "arrivals.jsonl")], log_path=tmp / "receiver.log")
    fleet = None
    if args.processes > 1:
        try:
            fleet = start_fleet(args, tmp, run_id)
        except BaseException:
            stop_process(recv_proc, 10.0)
            raise
    svc = fleet.services[0] if fleet is not None else start_service(args, tmp, run_id)
    print(f"receiver: 127.0.0.1:{rport} (pid {recv_proc.pid}); service pid {svc.proc.pid}: "
          f"{svc.command}")
    if fleet is not None:
        fleet.print()
    if os.environ.get("TIMEWHEEL_REDIS_URL"):
        print("redis   : external TIMEWHEEL_REDIS_URL, key prefix "
              f"{svc.env.get('TIMEWHEEL_KEY_PREFIX')}")
    rc = 1
    try:
        rc = run(_main(args, svc, rport, run_id, facts, stamp, fleet))
    finally:
        if fleet is not None:
            stop_process(recv_proc, 10.0)
            rc = rc if fleet.stop(args.stop_timeout) else rc or 1
        else:
            rc = _stop_service(args, svc, recv_proc, rc)
        if args.keep_tmp or rc:
            print(f"kept: {tmp} (service.log, receiver arrivals.jsonl, data/)")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
