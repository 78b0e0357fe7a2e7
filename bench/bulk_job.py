"""Bulk job: how late are another flow's callbacks while a job cancels many tasks?

    python -m bench.bulk_job [--matching 1000000] [--probes 3000] [--window 30]

One `timewheel serve` (embedded Redis). ``--matching`` tasks with keys ``bulk.<n>``, due in an
hour or more (never called), are created first through ``POST /tasks/batch``. Then two rounds
of ``--probes`` callbacks to the bench receiver (bench/receiver.py, another flow), due evenly
over ``--window`` seconds:

- control: no job;
- job: ``POST /tasks/cancel {"key_prefix": "bulk."}`` at the start of the window.

The report gives the probes' lateness (arrival minus execute_at) in both rounds, and in the job
round also for the probes due while the job ran (between its ``started_at`` and
``finished_at``); the job's duration and rate, its counts, and whether any probe was lost,
duplicated or early. Ratios between the rounds are what to read: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.analysis import epoch
from bench.common import summary_ms
from bench.receiver import Receiver
from bench.service import add_service_args, run_on_service

BENCH_DIR = Path(__file__).resolve().parent


async def _post(session: aiohttp.ClientSession, base: str, tasks: list[dict[str, Any]]) -> None:
    async with session.post(base + "/tasks/batch", json={"tasks": tasks}) as r:
        body = await r.json()
        if r.status != 200 or {x["status"] for x in body["results"]} != {201}:
            raise SystemExit(f"bench: batch create failed: {r.status} {str(body)[:300]}")


async def _create_matching(args: argparse.Namespace, session: aiohttp.ClientSession,
                           base: str) -> float:
    """The tasks the job will cancel, 1000 a request, two requests at a time; seconds taken."""
    t0 = time.perf_counter()
    now = time.time()
    queue = list(range(0, args.matching, 1000))

    async def worker() -> None:
        while queue:
            start = queue.pop(0)
            await _post(session, base, [
                {"key": f"bulk.{i}", "callback_url": "http://127.0.0.1:9/never",
                 "execute_at": round(now + 3600 + i / 1000, 3)}
                for i in range(start, min(start + 1000, args.matching))])

    await asyncio.gather(worker(), worker())
    return time.perf_counter() - t0


async def _round(args: argparse.Namespace, session: aiohttp.ClientSession, base: str,
                 receiver: Receiver, tag: str, with_job: bool) -> dict[str, Any]:
    start = time.time() + args.lead
    probes = [{"key": f"{tag}-p-{i}", "callback_url": f"http://127.0.0.1:{receiver.port}/p",
               "execute_at": round(start + i * args.window / args.probes, 3)}
              for i in range(args.probes)]
    for i in range(0, len(probes), 1000):
        await _post(session, base, probes[i:i + 1000])
    if time.time() > start:
        raise SystemExit("bench: creating the probes took longer than --lead; raise it")
    due = {t["key"]: float(t["execute_at"]) for t in probes}
    await asyncio.sleep(max(0.0, start - time.time()))
    job_id = None
    if with_job:
        async with session.post(base + "/tasks/cancel", json={"key_prefix": "bulk."}) as r:
            if r.status != 202:
                raise SystemExit(f"bench: POST /tasks/cancel answered {r.status}")
            job_id = (await r.json())["job"]
    give_up = start + args.window + args.grace
    seen: dict[str, list[float]] = {}
    job: dict[str, Any] = {}
    while time.time() < give_up:
        for rec in receiver.records[sum(len(v) for v in seen.values()):]:
            seen.setdefault(rec[1] or "", []).append(rec[0])
        if job_id is not None and job.get("state") != "done":
            async with session.get(f"{base}/jobs/{job_id}") as r:
                job = await r.json()
        if all(k in seen for k in due) and (job_id is None or job.get("state") == "done"):
            break
        await asyncio.sleep(0.2)
    return _summary(due, seen, job if job_id is not None else None)


def _summary(due: dict[str, float], seen: dict[str, list[float]],
             job: dict[str, Any] | None) -> dict[str, Any]:
    lateness = sorted(seen[k][0] - due[k] for k in due if k in seen)
    out: dict[str, Any] = {
        "lateness_ms": summary_ms(lateness),
        "lost": sum(1 for k in due if k not in seen),
        "duplicates": sum(len(v) - 1 for k, v in seen.items() if k in due),
        "early": sum(1 for x in lateness if x < 0),
    }
    if job is not None:
        began, ended = epoch(job.get("started_at")), epoch(job.get("finished_at"))
        out["job"] = job
        if began is not None and ended is None:  # still running when the round ended
            out["job_unfinished_after_s"] = round(time.time() - began, 1)
            out["job_tasks_per_s"] = round(job["done"] / max(time.time() - began, 1e-9))
        if began is not None and ended is not None:
            during = sorted(seen[k][0] - d for k, d in due.items()
                            if k in seen and began <= d <= ended)
            out["job_seconds"] = round(ended - began, 2)
            out["job_tasks_per_s"] = round(job["done"] / max(ended - began, 1e-9))
            out["lateness_during_job_ms"] = summary_ms(during)
    return out


async def _main(args: argparse.Namespace, base: str, svc_wait: Any) -> dict[str, Any]:
    receiver = Receiver()
    await receiver.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            await svc_wait(session)
            created_s = await _create_matching(args, session, base)
            print(f"created {args.matching} matching tasks in {created_s:.1f} s", flush=True)
            control = await _round(args, session, base, receiver, "control", False)
            await asyncio.sleep(args.pause)
            with_job = await _round(args, session, base, receiver, "job", True)
    finally:
        await receiver.stop()
    return {"create_seconds": round(created_s, 1), "control": control, "job": with_job}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bulk_job",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--matching", type=int, default=1_000_000, help="tasks the job cancels")
    p.add_argument("--probes", type=int, default=3000, help="callbacks of the other flow")
    p.add_argument("--window", type=float, default=30.0, help="seconds the probes span")
    p.add_argument("--lead", type=float, default=3.0, help="seconds from now to the window")
    p.add_argument("--grace", type=float, default=120.0, help="how long to wait for the job")
    add_service_args(p)
    args = p.parse_args(argv)
    print(f"load before: {os.getloadavg()}", flush=True)
    res, facts = run_on_service(args, "bulk",
                                lambda base, healthy: _main(args, base, healthy), stop_timeout=120)
    for name in ("control", "job"):
        r = res[name]
        lat = r["lateness_ms"]
        print(f"== {name}: probe lateness ms p50 {lat['p50_ms']} p99 {lat['p99_ms']}"
              f" max {lat['max_ms']}  lost {r['lost']} duplicates {r['duplicates']}"
              f" early {r['early']}")
    job = res["job"]
    if "lateness_during_job_ms" in job:
        lat = job["lateness_during_job_ms"]
        print(f"== while the job ran ({job['job_seconds']} s, {job['job_tasks_per_s']} "
              f"tasks/s, n={lat.get('count')}): p50 {lat['p50_ms']} p99 {lat['p99_ms']} "
              f"max {lat['max_ms']}")
    if "job_unfinished_after_s" in job:
        print(f"== the job was still running after {job['job_unfinished_after_s']} s "
              f"({job['job_tasks_per_s']} tasks/s): every probe was due while it ran")
    print(f"== job: {json.dumps(job.get('job'))}")
    print(f"load after: {os.getloadavg()}", flush=True)
    out = {"benchmark": "bulk_job", "command": "python -m bench.bulk_job " + " ".join(argv or []),
           "started_at": f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}", "machine": facts,
           "config": vars(args), **res}
    path = BENCH_DIR / "results" / f"{out['started_at']}-bulk_job.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"written: {path}")
    bad = any(res[n][k] for n in ("control", "job") for k in ("lost", "duplicates", "early"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
