"""Client-side cost of sending callbacks: which HTTP client should the dispatcher use?

    python -m bench.senders [--requests 5000] [--concurrency 100] [--repeat 3]

One process, loopback, against bench/receiver.py in a subprocess; C concurrent
keep-alive connections (C workers sharing one client whose pool holds C
connections) send N POSTs shaped like a timewheel callback (JSON body,
webhook-* and timewheel-* headers). For each client it reports requests/s and
the CPU milliseconds per request of *this* process (``time.process_time()``),
which is what the dispatcher would spend inside the service:

  a. httpx.AsyncClient, default transport (httpcore)
  b. httpx.AsyncClient(transport=httpx_aiohttp.AiohttpTransport(...))
  c. aiohttp.ClientSession

A warm-up of ``--warmup`` requests (connections opened, code paths hot) is not
counted. Each client runs ``--repeat`` times; the median run is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import (
    RESULTS_DIR,
    machine_facts,
    print_machine,
    proc_cpu_seconds,
    run,
    start_receiver,
    stop_process,
)

Send = Callable[[int], Awaitable[int]]


def _payload(i: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"order": i, "event": "bench.callback", "data": {"n": i, "ok": True}})
    headers = {
        "content-type": "application/json",
        "webhook-id": f"senders-{i:06d}",
        "webhook-timestamp": str(int(time.time())),
        "timewheel-attempt": "1",
        "timewheel-scheduled-at": "2026-11-22T10:00:00.123Z",
        "user-agent": "timewheel/0.1.0",
    }
    return body.encode(), headers


async def _drive(send: Send, n: int, concurrency: int, first: int) -> tuple[int, int]:
    """Send requests first..first+n-1 through ``concurrency`` workers; (ok, errors)."""
    next_i = first
    end = first + n
    ok = err = 0

    async def worker() -> None:
        nonlocal next_i, ok, err
        while next_i < end:
            i = next_i
            next_i += 1
            try:
                status = await send(i)
            except Exception:  # a failed request is counted, never retried
                err += 1
                continue
            if status == 200:
                ok += 1
            else:
                err += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok, err


Close = Callable[[], Awaitable[None]]


def _make_httpx(url: str, concurrency: int, transport: str) -> tuple[Send, Close]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    if transport == "aiohttp":
        from httpx_aiohttp import AiohttpTransport  # type: ignore[import-not-found, unused-ignore]

        client = httpx.AsyncClient(transport=AiohttpTransport(limits=limits), timeout=10.0)
    else:
        client = httpx.AsyncClient(limits=limits, timeout=10.0)

    async def send(i: int) -> int:
        body, headers = _payload(i)
        r = await client.post(url, content=body, headers=headers)
        return r.status_code

    return send, client.aclose


def _make_aiohttp(url: str, concurrency: int) -> tuple[Send, Close]:
    import aiohttp

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency),
        timeout=aiohttp.ClientTimeout(total=10.0),
    )

    async def send(i: int) -> int:
        body, headers = _payload(i)
        async with session.post(url, data=body, headers=headers, allow_redirects=False) as r:
            await r.read()
            return r.status

    return send, session.close


def _make_timewheel(url: str, concurrency: int, kind: str) -> tuple[Send, Close]:
    """The service's own Sender (timewheel/delivery), as the dispatcher calls it: SSRF guard
    on (private networks allowed), the lease's last check asked, the answer's kept headers
    and body excerpt read."""
    from timewheel.delivery.netguard import NetworkPolicy
    from timewheel.delivery.senders import make_sender

    sender = make_sender(kind, NetworkPolicy(allow_private=True), max_connections=concurrency)

    async def send(i: int) -> int:
        body, headers = _payload(i)
        answer = await sender.send("POST", url, list(headers.items()), body, 10.0,
                                   ready=lambda: True)
        return answer.status

    return send, sender.aclose


CLIENTS = {
    "httpx": "a. httpx.AsyncClient (default httpcore transport)",
    "httpx+aiohttp": "b. httpx.AsyncClient + httpx_aiohttp.AiohttpTransport",
    "aiohttp": "c. aiohttp.ClientSession",
    "timewheel-aiohttp": "d. timewheel's AiohttpSender (guarded aiohttp)",
    "timewheel-wire": "e. timewheel's WireSender (delivery/wire.py)",
}


async def _one_run(name: str, url: str, args: argparse.Namespace, recv_pid: int,
                   first: int) -> dict[str, Any]:
    if name == "aiohttp":
        send, close = _make_aiohttp(url, args.concurrency)
    elif name.startswith("timewheel-"):
        send, close = _make_timewheel(url, args.concurrency, name.removeprefix("timewheel-"))
    else:
        send, close = _make_httpx(url, args.concurrency,
                                  "aiohttp" if name == "httpx+aiohttp" else "httpcore")
    try:
        await _drive(send, args.warmup, args.concurrency, first)
        r0 = proc_cpu_seconds(recv_pid)
        c0 = time.process_time()
        w0 = time.perf_counter()
        ok, err = await asyncio.wait_for(
            _drive(send, args.requests, args.concurrency, first + args.warmup),
            timeout=args.max_seconds,
        )
        wall = time.perf_counter() - w0
        cpu = time.process_time() - c0
        r1 = proc_cpu_seconds(recv_pid)
    finally:
        await close()
    n = ok + err
    recv_ms = None if r0 is None or r1 is None else (r1 - r0) * 1000.0 / max(n, 1)
    return {
        "client": name, "requests": n, "ok": ok, "errors": err,
        "wall_s": round(wall, 3), "rps": round(n / wall, 1),
        "cpu_s": round(cpu, 3), "cpu_ms_per_req": round(cpu * 1000.0 / max(n, 1), 4),
        "cpu_util": round(cpu / wall, 3),
        "receiver_cpu_ms_per_req": None if recv_ms is None else round(recv_ms, 4),
    }


async def _main(args: argparse.Namespace, recv_pid: int, port: int) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/callback"
    results: list[dict[str, Any]] = []
    first = 0
    names = [c.strip() for c in args.clients.split(",") if c.strip()]
    for name in names:
        if name not in CLIENTS:
            raise SystemExit(f"unknown client {name!r}; choose from {', '.join(CLIENTS)}")
        runs = []
        for rep in range(args.repeat):
            res = await _one_run(name, url, args, recv_pid, first)
            first += args.warmup + args.requests
            runs.append(res)
            print(f"  {name:14s} run {rep + 1}/{args.repeat}: {res['rps']:8.0f} req/s  "
                  f"{res['cpu_ms_per_req']:.3f} CPU ms/req  errors={res['errors']}", flush=True)
        med = sorted(runs, key=lambda r: r["cpu_ms_per_req"])[len(runs) // 2]
        results.append({**med, "description": CLIENTS[name], "runs": runs,
                        "rps_all": [r["rps"] for r in runs],
                        "cpu_ms_per_req_all": [r["cpu_ms_per_req"] for r in runs],
                        "rps_median": statistics.median(r["rps"] for r in runs)})
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.senders", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=5000, help="measured POSTs per run")
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--max-seconds", type=float, default=120.0, help="time limit of one run")
    p.add_argument("--no-uvloop", action="store_true", help="plain asyncio loop (default: uvloop)")
    p.add_argument("--out", help="JSON result path (default bench/results/<date>-senders.json)")
    args = p.parse_args(argv)

    facts = machine_facts()
    if args.no_uvloop:
        facts["event_loop"] = "asyncio"
    print_machine(facts)
    started = dt.datetime.now(dt.UTC)
    print(f"senders : {args.requests} POSTs x {args.repeat} runs per client, "
          f"{args.concurrency} keep-alive connections, loopback, {facts['event_loop']}")
    proc, port = start_receiver(["--max-seconds", "1800"])
    try:
        results = run(_main(args, proc.pid, port), use_uvloop=not args.no_uvloop)
    finally:
        stop_process(proc, 5.0)

    print()
    print(f"{'client':54s} {'req/s':>8s} {'CPU ms/req':>11s} {'CPU util':>9s} {'errors':>7s}"
          f" {'recv ms/req':>12s}")
    for r in results:
        print(f"{r['description']:54s} {r['rps']:8.0f} {r['cpu_ms_per_req']:11.3f} "
              f"{r['cpu_util']:9.2f} {r['errors']:7d} {r['receiver_cpu_ms_per_req']!s:>12s}")
    out = {
        "benchmark": "senders", "started_at": started.isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench.senders", *(argv or sys.argv[1:])]),
        "machine": facts, "config": vars(args), "results": results,
        "note": "median run by CPU ms/request; CPU is time.process_time() of the sending process",
    }
    path = args.out or str(RESULTS_DIR / f"{started:%Y-%m-%dT%H%M%SZ}-senders.json")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"\nwritten: {path}")
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
