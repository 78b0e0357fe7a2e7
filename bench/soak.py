"""Fault-injection soak: N `timewheel serve` processes, a real Redis (or a replicated cluster),
a real receiver, a continuous load and a fault schedule from a seed; then the checker.

    python -m bench.soak --minutes 10 --processes 3 --seed 7 [--appendfsync always|everysec]
                         [--cluster] [--short] [--out DIR]

Writes DIR/history.jsonl (every operation, arrival, fault and process), DIR/summary.json and
prints the checker's table (bench/soak_check.py). Exit status 1 when anything was lost, early,
doubled without a fault to explain it, or delivered after its DELETE. bench/README.md, section
"Fault-injection soak", says what each figure means and what the soak cannot see.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import machine_facts, start_receiver, stop_process
from bench.soak_check import check, table
from bench.soak_faults import Injector, plan, stall_seconds, stop_seconds
from bench.soak_history import History, logged_late_writes, logged_timeouts, read
from bench.soak_load import Load
from tests.cluster.replicated import ReplicatedCluster
from tests.e2e.conftest import Service
from tests.support.partition_proxy import PartitionProxy
from tests.support.redis_server import RedisServer

TASK_TIMEOUT_S = 2.0  # every task's callback timeout: short, so leases are short
LEASE_MARGIN_S = 2.0
TICK_S = 1.0
EARLY_SLACK_S = 0.02  # tests/e2e/test_delivery.py's CLOCK_SLACK: same host clock
SHORT_LOAD_S = 75.0  # the five faults of the short mode, each with its burst, within the load


@dataclass
class Slot:
    name: str
    service: Service
    up: bool = True

    @property
    def pid(self) -> int:
        assert self.service.process is not None
        return self.service.process.pid


class Wheel:
    """The system under test: Redis, the serve processes, the receiver, the history."""

    def __init__(self, out: Path, history: History, args: argparse.Namespace) -> None:
        self.out = out
        self.history = history
        self.args = args
        self.task_timeout = TASK_TIMEOUT_S
        self.key_prefix = "tw"
        self.redis: RedisServer | ReplicatedCluster
        self.slots: list[Slot] = []
        # One Redis: each serve process reaches it through its own forwarder, which the
        # proc_partition fault cuts (tests/support/partition_proxy.py). Slot name -> forwarder.
        self.proxies: dict[str, PartitionProxy] = {}
        self.receiver_port = 0
        self.arrivals_path = out / "arrivals.jsonl"

    def start_redis(self) -> str:
        if self.args.cluster:
            cluster = ReplicatedCluster(self.out / "redis").start()
            self.redis = cluster
            for server in cluster.servers:
                self.apply_appendfsync(server)
            return cluster.seed_url
        self.redis = RedisServer(self.out / "redis", appendfsync=self.args.appendfsync).start()
        return self.redis.url

    def apply_appendfsync(self, server: RedisServer) -> None:
        """ReplicatedCluster starts its nodes with everysec; set the run's policy."""
        with server.client() as conn:
            conn.config_set("appendfsync", self.args.appendfsync)

    def _settings(self) -> dict[str, str]:
        settings = {"lease_margin_seconds": str(LEASE_MARGIN_S), "tick_seconds": str(TICK_S)}
        if self.args.cluster:
            # acknowledged = on a replica too, so a promotion loses nothing acknowledged
            settings |= {"redis_cluster": "true", "redis_wait_replicas": "1"}
        return settings

    def callback_url(self, behaviour: str) -> str:
        return f"http://127.0.0.1:{self.receiver_port}/soak/{behaviour}"

    def _start(self, name: str) -> Service:
        url = self.proxies[name].url if name in self.proxies else self.redis_url
        service = Service(self.out / "procs", url, **self._settings())
        # A reused port appends to an earlier process's log: this one's lines start here.
        offset = service.log_path.stat().st_size if service.log_path.exists() else 0
        service.start()
        assert service.process is not None
        self.history.add("proc", name=name, pid=service.process.pid, start=time.time(),
                         port=service.port, log=str(service.log_path), log_offset=offset)
        return service

    def start_processes(self, redis_url: str, n: int) -> None:
        self.redis_url = redis_url
        if isinstance(self.redis, RedisServer):
            self.proxies = {f"p{i}": PartitionProxy("127.0.0.1", self.redis.port).start()
                            for i in range(n)}
        self.slots = [Slot(f"p{i}", self._start(f"p{i}")) for i in range(n)]

    def restart(self, slot: Slot) -> None:
        slot.service = self._start(slot.name)
        slot.up = True

    def kill(self, slot: Slot, how: str) -> None:
        pid = slot.pid
        slot.service.kill()
        self.history.add("proc_end", name=slot.name, pid=pid, end=time.time(), how=how)

    def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for slot in self.slots:
            try:
                codes[slot.name] = slot.service.stop(timeout=60)
            except Exception:  # a hung shutdown is reported, then killed
                codes[slot.name] = None
                slot.service.kill()
            self.history.add("proc_end", name=slot.name, pid=slot.pid, end=time.time(),
                             how=f"SIGTERM exit {codes[slot.name]}")
        for proxy in self.proxies.values():
            proxy.stop()
        self.redis.stop()
        return codes


def _add_logged(history: History) -> None:
    """The writes each serve process logged as late (``late_write``) and the attempts it logged
    as timed out (``timed_out``), from its own lines of its log (a later process on the same
    port appends to the same file)."""
    procs = [e for e in history.events() if e["type"] == "proc"]
    for proc in procs:
        later = [p["log_offset"] for p in procs
                 if p["log"] == proc["log"] and p["log_offset"] > proc["log_offset"]]
        own = (Path(proc["log"]), proc["log_offset"], min(later, default=None))
        for key, attempt, late_ms in logged_late_writes(*own):
            history.add("late_write", pid=proc["pid"], key=key, attempt=attempt,
                        late_ms=late_ms)
        for key, attempt, at in logged_timeouts(*own):
            history.add("timed_out", pid=proc["pid"], key=key, attempt=attempt, t=at)


async def _drain(wheel: Wheel, load: Load, bound: float, quiet: float) -> float:
    """Wait until every acknowledged, uncancelled task arrived with a 2xx, or until the last
    due + bound; then ``quiet`` more seconds for late duplicates. Returns the end time."""
    deadline = max(load.expect.values(), default=time.time()) + bound
    while time.time() < deadline:
        delivered = {e["key"] for e in read(wheel.arrivals_path)
                     if e["type"] == "arrival" and 200 <= e["answered"] < 300}
        if not set(load.expect) - delivered:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(quiet)
    return time.time()


async def soak(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    history = History(out / "history.jsonl")
    wheel = Wheel(out, history, args)
    load_s = SHORT_LOAD_S if args.short else args.minutes * 60.0
    faults = plan(args.seed, load_s, args.processes, cluster=args.cluster, short=args.short,
                  timeout=TASK_TIMEOUT_S, margin=LEASE_MARGIN_S, tick=TICK_S)
    stop_s, stall_s = stop_seconds(TASK_TIMEOUT_S, LEASE_MARGIN_S, TICK_S), stall_seconds()
    # Latest a task may arrive: a lease run out after a fault, twice, behind retries.
    bound = 2 * (TASK_TIMEOUT_S + LEASE_MARGIN_S + TICK_S) + max(stop_s, stall_s) + 4 + 20
    quiet = TASK_TIMEOUT_S + LEASE_MARGIN_S + 2 * TICK_S + 2
    history.add("meta", seed=args.seed, processes=args.processes, cluster=args.cluster,
                appendfsync=args.appendfsync, short=args.short, load_s=load_s,
                task_timeout_s=TASK_TIMEOUT_S, lease_margin_s=LEASE_MARGIN_S, tick_s=TICK_S,
                early_slack_s=EARLY_SLACK_S, bound_s=bound, quiet_s=quiet,
                planned_faults=[f.__dict__ for f in faults], command=" ".join(sys.argv),
                machine=machine_facts(), started=time.time())
    url = wheel.start_redis()
    errors: list[str] = []
    receiver, wheel.receiver_port = start_receiver(
        ["--out", str(wheel.arrivals_path), "--hang", str(TASK_TIMEOUT_S + 1.0)],
        module="bench.soak_receiver", log_path=out / "receiver.log")
    try:
        wheel.start_processes(url, args.processes)
        t0 = time.time()
        load = Load(wheel, args.seed, t0, load_s, faults, short=args.short)
        injector = threading.Thread(target=Injector(wheel).run_all, args=(faults, t0, errors),
                                    daemon=True)
        injector.start()
        await load.run()
        await asyncio.to_thread(injector.join)
        end = await _drain(wheel, load, bound, quiet)
        history.add("end", t=end, fault_errors=errors)
    finally:
        codes = wheel.stop() if wheel.slots else {}
        stop_process(receiver, 10)
        _add_logged(history)
        history.close()
    summary = check(history.events() + read(wheel.arrivals_path))
    summary["exit_codes"] = codes
    summary["fault_errors"] = errors
    if errors:
        summary["failed"].append("fault_errors")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--appendfsync", choices=("always", "everysec"), default="always")
    p.add_argument("--cluster", action="store_true", help="3 masters + 3 replicas")
    p.add_argument("--short", action="store_true",
                   help=f"CI mode: {SHORT_LOAD_S:.0f} s of load, one fault of each kind")
    p.add_argument("--out", type=Path, help="history and summary here (default: a temp dir)")
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="soak-"))
    out.mkdir(parents=True, exist_ok=True)
    # The injector thread must wake on time for its 2 ms lead: hand the interpreter over
    # sooner than the default 5 ms when the load's thread holds it.
    sys.setswitchinterval(0.0005)
    summary = asyncio.run(soak(args, out))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(table(summary))
    print(f"history: {out / 'history.jsonl'}  summary: {out / 'summary.json'}")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
