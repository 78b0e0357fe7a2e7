"""POST /tasks/batch throughput into one `timewheel serve` on this machine.

    python -m bench.batch                              # 100 batches of 1,000 tasks, 2 at a time
    python -m bench.batch --tasks 50000 --batch 1000 --concurrency 4
    python -m bench.batch --py-spy /tmp/batch.txt      # and profile the service meanwhile

Starts one ``timewheel serve`` (subprocess, free port, temporary data dir, embedded Redis unless
TIMEWHEEL_REDIS_URL is set; see bench/service.py), waits for ``GET /healthz``, sends a few warm-up
batches, then ``--tasks`` tasks in batches of ``--batch`` over ``--concurrency`` keep-alive
connections. Every task has its own key, a body and is due in an hour (nothing fires during
the run; the callback URL is a closed loopback port). Reports tasks/s (tasks answered 201 per
wall-clock second), request latency, the CPU seconds of the service and its redis-server, and
fails (exit 1) when any item is not 201 or a request fails. Writes
bench/results/<UTC date-time>-batch.json.

``--py-spy FILE`` attaches ``py-spy record`` (``pip install py-spy``) to the service for the
measured part only and writes its collapsed stacks to FILE (``--py-spy-format speedscope`` or
``flamegraph`` for the other formats); ``python -m bench.batch --summarise FILE`` prints the
share of samples per frame from a collapsed-stack file.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.common import (
    RESULTS_DIR,
    machine_facts,
    print_machine,
    proc_children,
    proc_name,
    require_loopback,
    run,
    stop_process,
    summary_ms,
)
from bench.service import CpuMeter, Service, check_service_importable, start_service, wait_healthy

HOOK = "http://127.0.0.1:9/hook"  # never called: every task is due in an hour


def due_field(due: str, n: int, now: float) -> dict[str, Any]:
    """When the n-th task is due, an hour from now, in the form ``--due`` names: ``delay``
    (seconds), ``execute-at`` (Unix seconds with milliseconds, what most clients send) or
    ``date-time`` (RFC 3339 with milliseconds)."""
    if due == "delay":
        return {"delay": 3600}
    at = round(now + 3600 + n / 1000, 3)
    if due == "execute-at":
        return {"execute_at": at}
    moment = dt.datetime.fromtimestamp(at, dt.UTC)
    return {"execute_at": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")}


def batch_bodies(run_id: str, prefix: str, count: int, size: int, due: str = "delay"
                 ) -> list[bytes]:
    """``count`` request bodies of ``size`` tasks each, encoded before the clock starts."""
    bodies = []
    now = time.time()
    for b in range(count):
        tasks = [{"key": f"{prefix}-{run_id}-{b}-{i}", "callback_url": HOOK,
                  **due_field(due, b * size + i, now),
                  "body": {"order": b * size + i, "note": "batch bench"},
                  "headers": {"X-Bench": run_id}} for i in range(size)]
        bodies.append(json.dumps({"tasks": tasks}).encode())
    return bodies


async def send(session: aiohttp.ClientSession, base: str, bodies: list[bytes],
               concurrency: int, headers: dict[str, str]) -> dict[str, Any]:
    """POST every body with ``concurrency`` requests in flight; item statuses and latencies."""
    statuses: Counter[int | str] = Counter()
    latencies: list[float] = []
    first_error: str | None = None
    queue = list(reversed(bodies))

    async def worker() -> None:
        nonlocal first_error
        while queue:
            body = queue.pop()
            t0 = time.perf_counter()
            try:
                async with session.post(base + "/tasks/batch", data=body, headers={
                        **headers, "content-type": "application/json"}) as reply:
                    data = await reply.read()
                    if reply.status != 200:
                        statuses[f"request {reply.status}"] += 1
                        first_error = first_error or f"{reply.status} {data[:300]!r}"
                        continue
                    latencies.append(time.perf_counter() - t0)
                    # orjson: the load generator shares the 2 cores, and since v3 each result
                    # carries the task's request (headers, body): json.loads took ~2.5 µs a task
                    statuses.update(r["status"] for r in orjson.loads(data)["results"])
            except (aiohttp.ClientError, TimeoutError) as exc:
                statuses["request error"] += 1
                first_error = first_error or repr(exc)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 3), "statuses": dict(statuses), "latency": summary_ms(latencies),
            "tasks_per_s": round(statuses[201] / wall, 1) if wall else None,
            "first_error": first_error}


async def _main(args: argparse.Namespace, svc: Service, run_id: str) -> dict[str, Any]:
    headers = {}
    tokens = os.environ.get("TIMEWHEEL_API_TOKENS", "")
    if tokens:
        headers["authorization"] = "Bearer " + tokens.split(",")[0].strip()
    connector = aiohttp.TCPConnector(limit=args.concurrency, limit_per_host=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = await wait_healthy(svc, session, args.startup_timeout)
        pids = svc.pids()
        print(f"service : {svc.base} up in {started:.1f} s; processes {', '.join(pids)}")
        count = -(-args.tasks // args.batch)
        warm = batch_bodies(run_id, "warm", args.warmup, args.batch, args.due)
        bodies = batch_bodies(run_id, "t", count, args.batch, args.due)
        print(f"warm-up : {args.warmup} batch(es) of {args.batch}", flush=True)
        warmup = await send(session, svc.base, warm, args.concurrency, headers)
        await asyncio.sleep(args.pause)
        print(f"run     : {count} batches of {args.batch} tasks, concurrency {args.concurrency}",
              flush=True)
        profiler = start_py_spy(args, svc.proc.pid)
        meter = CpuMeter(pids)
        meter.start()
        result = await send(session, svc.base, bodies, args.concurrency, headers)
        result["cpu"] = meter.stop()
        # CPU per stored task: steadier than tasks/s on a busy machine. The service is one
        # process on one core, so 1e6 / its figure is its ceiling in tasks/s.
        stored = result["statuses"].get(201, 0)
        if stored:
            result["cpu_us_per_task"] = {
                k.removesuffix("_cpu_s"): round(v * 1e6 / stored, 1)
                for k, v in result["cpu"].items() if k.endswith("_cpu_s") and v is not None}
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            profiler.wait(60)
            print(f"py-spy  : {args.py_spy}")
    result["warmup"] = warmup
    result["pids"] = pids
    return result


def start_py_spy(args: argparse.Namespace, pid: int) -> subprocess.Popen[bytes] | None:
    if not args.py_spy:
        return None
    proc = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", "200",
                             "--format", args.py_spy_format, "-o", args.py_spy],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the clock starts
    return proc


def summarise(path: str, top: int = 40) -> None:
    """Share of samples in which each frame appears (inclusive), from collapsed stacks."""
    total = 0
    inclusive: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        for frame in set(stack.split(";")):
            inclusive[frame] += n
    for frame, n in inclusive.most_common(top):
        print(f"{100 * n / total:5.1f}%  {frame}")


def print_result(res: dict[str, Any]) -> None:
    lat = res["latency"]
    print(f"\ntasks/s : {res['tasks_per_s']}  ({res['statuses']} in {res['wall_s']} s)")
    print(f"latency : per batch request p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, "
          f"max {lat['max_ms']} ms")
    cpu = res["cpu"]
    print("cpu     : " + ", ".join(f"{k} {v}" for k, v in cpu.items() if k.endswith("_cpu_s"))
          + f" over {cpu['wall_s']} s wall; service RSS {cpu['service_rss_mib']} MiB")
    per_task = res.get("cpu_us_per_task", {})
    print("cpu/task: " + ", ".join(f"{k} {v} us" for k, v in per_task.items()))
    if res["first_error"]:
        print(f"error   : {res['first_error']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batch",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1000, help="tasks per request (1-1000)")
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    p.add_argument("--due", default="delay", choices=["delay", "execute-at", "date-time"],
                   help="how each task says when it is due (an hour ahead): a delay, "
                   "execute_at as Unix seconds, or as an RFC 3339 date-time")
    p.add_argument("--warmup", type=int, default=3, help="batches sent before measuring")
    p.add_argument("--pause", type=float, default=1.0, help="idle seconds after the warm-up")
    p.add_argument("--request-timeout", type=float, default=60.0)
    p.add_argument("--startup-timeout", type=float, default=60.0)
    p.add_argument("--stop-timeout", type=float, default=45.0)
    p.add_argument("--service-port", type=int, default=0)
    p.add_argument("--service-cmd", default=None,
                   help="command template with {python} {host} {port} (e.g. under py-spy)")
    p.add_argument("--py-spy", default=None, metavar="FILE",
                   help="profile the service with py-spy during the measured part")
    p.add_argument("--py-spy-format", default="raw", choices=["raw", "speedscope", "flamegraph"])
    p.add_argument("--summarise", default=None, metavar="FILE",
                   help="only print the frames of a py-spy raw (collapsed) file, then exit")
    p.add_argument("--results-dir", default=None)
    p.add_argument("--keep-tmp", action="store_true", help="keep the data dir and service log")
    args = p.parse_args(argv)
    if args.summarise:
        summarise(args.summarise)
        return 0
    args.sign, args.fake_service = False, False  # what bench.service.start_service reads
    require_loopback("127.0.0.1")
    if args.tasks < 1 or args.concurrency < 1 or not 1 <= args.batch <= 1000:
        p.error("--tasks and --concurrency must be positive, --batch 1-1000")

    facts = machine_facts()
    print_machine(facts)
    check_service_importable()
    run_id = f"{int(time.time()) % 100000:05d}{secrets.token_hex(2)}"
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}"
    tmp = Path(tempfile.mkdtemp(prefix="timewheel-bench-batch-"))
    svc = start_service(args, tmp, run_id)
    rc = 1
    try:
        res = run(_main(args, svc, run_id))
        print_result(res)
        ok = set(res["statuses"]) == {201} and set(res["warmup"]["statuses"]) == {201}
        rc = 0 if ok else 1
        out = {"benchmark": "batch", "started_at": stamp,
               "command": "python -m bench.batch " + " ".join(sys.argv[1:]),
               "machine": facts, "service": {"command": svc.command, "env": svc.env},
               "config": {k: v for k, v in vars(args).items() if k != "fake_service"},
               "results": res}
        path = Path(args.results_dir or RESULTS_DIR) / f"{stamp}-batch.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2))
        print(f"written : {path}")
    finally:
        children = proc_children(svc.proc.pid)
        svc.exit_code = stop_process(svc.proc, args.stop_timeout)
        print(f"service stopped with exit code {svc.exit_code} after SIGTERM")
        for child in children:
            if Path(f"/proc/{child}").exists():
                print(f"WARNING: child {child} ({proc_name(child)}) outlived the service")
        if svc.exit_code != 0 or rc:
            print(f"--- {svc.log_path} (tail) ---\n{svc.log_tail()}")
        if args.keep_tmp or rc:
            print(f"kept: {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
