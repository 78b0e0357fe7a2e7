"""Noisy neighbour: how late are a healthy destination's callbacks while another one hangs?

    python -m bench.noisy [--hung 1000] [--healthy 2000] [--window 10]

One `timewheel serve` (embedded Redis), two destinations on 127.0.0.1:

- a *hung* receiver that reads each request and never answers (every connection stays open
  until the run ends); ``--hung`` callbacks to it fall due at T, with a 20 s timeout;
- the bench receiver (bench/receiver.py), timestamping each arrival; ``--healthy`` callbacks
  to it fall due evenly over ``--window`` seconds from T + 0.5 s.

It runs twice in one invocation, first without the hung callbacks (control), then with them,
and reports the healthy destination's lateness (arrival minus execute_at) for both, the most
requests the hung receiver held at once (the flow's parallelism bounds it), and whether any
callback was lost, duplicated or early. Ratios between the two runs are what to read: the
machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import summary_ms
from bench.receiver import Receiver
from bench.service import add_service_args, run_on_service

BENCH_DIR = Path(__file__).resolve().parent


class HungReceiver:
    """Accepts connections, reads requests, answers none. Counts requests held at once."""

    def __init__(self) -> None:
        self.held = self.peak = self.requests = 0
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=2048)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counted = False
        self._writers.add(writer)
        try:
            while data := await reader.read(65536):
                if not counted and b"\r\n\r\n" in data:  # one request per connection: it hangs
                    counted = True
                    self.requests += 1
                    self.held += 1
                    self.peak = max(self.peak, self.held)
        finally:
            if counted:
                self.held -= 1
            self._writers.discard(writer)
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()


async def _post(session: aiohttp.ClientSession, base: str, tasks: list[dict[str, Any]]) -> None:
    for i in range(0, len(tasks), 1000):
        async with session.post(base + "/tasks/batch", json={"tasks": tasks[i:i + 1000]}) as r:
            body = await r.json()
            if r.status != 200 or {x["status"] for x in body["results"]} != {201}:
                raise SystemExit(f"bench: batch create failed: {r.status} {str(body)[:300]}")


async def _round(args: argparse.Namespace, session: aiohttp.ClientSession, base: str,
                 receiver: Receiver, hung: HungReceiver | None, tag: str) -> dict[str, Any]:
    start = time.time() + args.lead
    healthy = [{"key": f"{tag}-ok-{i}", "callback_url": f"http://127.0.0.1:{receiver.port}/ok",
                "execute_at": round(start + 0.5 + i * args.window / args.healthy, 3)}
               for i in range(args.healthy)]
    if hung is not None:
        await _post(session, base, [
            {"key": f"{tag}-hung-{i}", "callback_url": f"http://127.0.0.1:{hung.port}/hang",
             "execute_at": round(start, 3), "timeout": 20, "max_attempts": 1}
            for i in range(args.hung)])
    await _post(session, base, healthy)
    if time.time() > start:
        raise SystemExit("bench: creating the tasks took longer than --lead; raise it")
    due = {t["key"]: float(t["execute_at"]) for t in healthy}
    give_up = start + 0.5 + args.window + args.grace
    seen: dict[str, list[float]] = {}
    while time.time() < give_up:
        for rec in receiver.records[sum(len(v) for v in seen.values()):]:
            seen.setdefault(rec[1] or "", []).append(rec[0])
        if all(k in seen for k in due):
            break
        await asyncio.sleep(0.2)
    lateness = sorted(seen[k][0] - due[k] for k in due if k in seen)
    return {
        "healthy_lateness_ms": summary_ms(lateness),
        "lost": sum(1 for k in due if k not in seen),
        "duplicates": sum(len(v) - 1 for k, v in seen.items() if k in due),
        "early": sum(1 for x in lateness if x < 0),
        "hung_requests": hung.requests if hung else 0,
        "hung_peak_at_once": hung.peak if hung else 0,
    }


async def _main(args: argparse.Namespace, base: str, svc_wait: Any) -> dict[str, Any]:
    receiver = Receiver()
    await receiver.start()
    hung = HungReceiver()
    await hung.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await svc_wait(session)
            control = await _round(args, session, base, receiver, None, "control")
            await asyncio.sleep(args.pause)
            noisy = await _round(args, session, base, receiver, hung, "noisy")
    finally:
        await hung.stop()
        await receiver.stop()
    return {"control": control, "noisy": noisy}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.noisy", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hung", type=int, default=1000, help="callbacks to the hung receiver")
    p.add_argument("--healthy", type=int, default=2000, help="callbacks to the healthy one")
    p.add_argument("--window", type=float, default=10.0, help="seconds the healthy ones span")
    p.add_argument("--lead", type=float, default=5.0, help="seconds from now to T")
    p.add_argument("--grace", type=float, default=15.0)
    add_service_args(p)
    args = p.parse_args(argv)
    res, facts = run_on_service(args, "noisy",
                                lambda base, healthy: _main(args, base, healthy))
    for name in ("control", "noisy"):
        r = res[name]
        lat = r["healthy_lateness_ms"]
        print(f"== {name}: healthy lateness ms p50 {lat['p50_ms']} p99 {lat['p99_ms']}"
              f" max {lat['max_ms']}"
              f"  lost {r['lost']} duplicates {r['duplicates']} early {r['early']}"
              f"  hung requests {r['hung_requests']} (at once at most {r['hung_peak_at_once']})")
    out = {"benchmark": "noisy", "command": "python -m bench.noisy " + " ".join(argv or []),
           "started_at": f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}", "machine": facts,
           "config": vars(args), **res}
    path = BENCH_DIR / "results" / f"{out['started_at']}-noisy.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"written: {path}")
    bad = any(res[n][k] for n in res for k in ("lost", "duplicates", "early"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
