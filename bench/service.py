"""Start, watch and stop the `timewheel serve` under test; CPU accounting from /proc."""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    BENCH_DIR,
    free_port,
    machine_facts,
    print_machine,
    proc_children,
    proc_cpu_seconds,
    proc_involuntary_switches,
    proc_name,
    proc_rss_mib,
    proc_stat_cpu,
    require_loopback,
    run,
)
from bench.gc_log import ENV as GC_LOG_ENV
from bench.gc_log import read as gc_read
from timewheel.store.embedded import _die_with_parent

# bench.gc_log first: it logs the service's GC pauses when TIMEWHEEL_BENCH_GC_LOG is set.
SERVE_CMD = ("{python} -c 'import sys; import bench.gc_log; from timewheel.cli import main; "
             "sys.argv[0] = \"timewheel\"; sys.exit(main())' serve --host {host} --port {port}")
FAKE_CMD = "{python} -m bench.fake_service serve --host {host} --port {port}"


# --------------------------------------------------------------------------- the service


def check_service_importable() -> None:
    """Fail early and clearly when the package is not there yet."""
    proc = subprocess.run(
        [sys.executable, "-c",
         "import timewheel.cli as c; assert callable(getattr(c, 'main', None)), 'no main()'"],
        cwd=str(BENCH_DIR.parent), capture_output=True, text=True, timeout=120, check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise SystemExit(
            "bench: `timewheel serve` is not runnable: `import timewheel.cli` (with a main()) "
            f"failed in {BENCH_DIR.parent}.\n"
            "Install the project (`pip install -e .`) once the service exists, or run the harness "
            "self-test with --fake-service.\n" + tail
        )


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    base: str
    log_path: Path
    data_dir: Path
    command: str
    env: dict[str, str]
    exit_code: int | None = None
    gc_log: Path | None = None  # the service's GC pauses (bench/gc_log.py), if it logs them

    def log_tail(self, n: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def pids(self) -> dict[str, int]:
        """The service and its children (the embedded redis-server)."""
        out = {"service": self.proc.pid}
        for child in proc_children(self.proc.pid):
            out[f"{proc_name(child)}:{child}"] = child
        return out


def start_service(args: argparse.Namespace, tmp: Path, run_id: str,
                  base_env: Mapping[str, str] | None = None) -> Service:
    """Start one service in ``tmp`` with ``base_env`` (default: this process's environment)
    and the bench's TIMEWHEEL_* settings."""
    port = args.service_port or free_port()
    data_dir = tmp / "data"
    data_dir.mkdir()
    env = dict(os.environ if base_env is None else base_env)
    env["TIMEWHEEL_ALLOW_PRIVATE_NETWORKS"] = "true"
    env["TIMEWHEEL_DATA_DIR"] = str(data_dir)
    if env.get("TIMEWHEEL_REDIS_URL") and not env.get("TIMEWHEEL_KEY_PREFIX"):
        # a shared Redis: keep this run's keys apart from anything else in it
        env["TIMEWHEEL_KEY_PREFIX"] = f"bench{run_id}"
    if args.sign:
        env["TIMEWHEEL_SIGNING_SECRET"] = "whsec_" + base64.b64encode(
            secrets.token_bytes(32)).decode()
    template = FAKE_CMD if args.fake_service else (args.service_cmd or SERVE_CMD)
    gc_log = tmp / "gc.log" if template == SERVE_CMD else None
    if gc_log is not None:
        env[GC_LOG_ENV] = str(gc_log)
    command = template.format(python=shlex.quote(sys.executable), host="127.0.0.1", port=port)
    log_path = tmp / "service.log"
    with log_path.open("ab") as log:
        # dies with the bench (PR_SET_PDEATHSIG), so a bench killed before its finally blocks
        # leaves no service firing its tasks into the next benchmark
        proc = subprocess.Popen(shlex.split(command), cwd=str(BENCH_DIR.parent), env=env,
                                stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent)
    shown_env = {k: ("<set>" if "SECRET" in k or "TOKEN" in k or "KEYS" in k else v)
                 for k, v in env.items() if k.startswith("TIMEWHEEL_")}
    return Service(proc, f"http://127.0.0.1:{port}", log_path, data_dir, command, shown_env,
                   gc_log=gc_log)


async def wait_healthy(svc: Service, session: aiohttp.ClientSession, timeout: float) -> float:
    t0 = time.perf_counter()
    last = "no answer"
    while time.perf_counter() - t0 < timeout:
        if svc.proc.poll() is not None:
            raise SystemExit(f"bench: the service exited with {svc.proc.returncode} while starting."
                             f"\n--- {svc.log_path} (tail) ---\n{svc.log_tail()}")
        try:
            async with session.get(svc.base + "/healthz",
                                   timeout=aiohttp.ClientTimeout(total=2)) as r:
                last = f"{r.status} {(await r.text())[:200]}"
                if r.status == 200:
                    return time.perf_counter() - t0
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = repr(exc)
        await asyncio.sleep(0.2)
    raise SystemExit(f"bench: GET /healthz not 200 after {timeout:.0f} s (last: {last})"
                     f"\n--- {svc.log_path} (tail) ---\n{svc.log_tail()}")


# --------------------------------------------------------------------------- CPU accounting


class CpuMeter:
    """CPU seconds used by each process of interest between start() and stop()."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.t0: dict[str, float | None] = {}
        self.w0 = 0.0

    def start(self) -> None:
        self.t0 = {k: proc_cpu_seconds(p) for k, p in self.pids.items()}
        self.t0["loadgen"] = time.process_time()
        self.w0 = time.perf_counter()

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.w0
        out: dict[str, Any] = {"wall_s": round(wall, 3)}
        for k, p in self.pids.items():
            a, b = self.t0.get(k), proc_cpu_seconds(p)
            out[f"{k}_cpu_s"] = None if a is None or b is None else round(b - a, 3)
        out["loadgen_cpu_s"] = round(time.process_time() - (self.t0["loadgen"] or 0.0), 3)
        if "service" in self.pids:
            out["service_rss_mib"] = proc_rss_mib(self.pids["service"])
        else:  # --processes N (bench/services.py): service1..serviceN, and their sums
            self._sum_services(out)
        return out

    def _sum_services(self, out: dict[str, Any]) -> None:
        names = [k for k in self.pids if re.fullmatch(r"service\d+", k)]
        cpu = [out[f"{k}_cpu_s"] for k in names]
        out["services_cpu_s"] = None if None in cpu else round(sum(cpu), 3)
        rss = {f"{k}_rss_mib": proc_rss_mib(self.pids[k]) for k in names}
        known = [v for v in rss.values() if v is not None]
        out["service_rss_mib"] = round(sum(known), 1) if len(known) == len(rss) else None
        out.update(rss)


# --------------------------------------------------------------------------- tail lateness


_LATENESS = re.compile(r'^timewheel_callback_lateness_seconds_bucket\{(?P<labels>[^}]*)\} '
                       r'(?P<value>\S+)$', re.MULTILINE)
# Counters that tell whether the service fell behind by itself: claims handed back (a start
# deadline missed), failed ticks.
_COUNTERS = ("timewheel_tasks_claimed_total", "timewheel_claims_dropped_total",
             "timewheel_ticks_total", "timewheel_tick_errors_total")


async def lateness_histogram(session: aiohttp.ClientSession, base: str
                             ) -> tuple[dict[float, float] | None, dict[str, float]]:
    """The service's own first-attempt lateness histogram (cumulative counts by upper bound,
    seconds) and the _COUNTERS, from GET /metrics; (None, {}) if it cannot be read."""
    try:
        async with session.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return None, {}
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None, {}
    counts: dict[float, float] = {}
    for m in _LATENESS.finditer(text):
        labels = dict(part.split("=", 1) for part in m["labels"].split(","))
        if labels.get("attempt") == '"first"':
            counts[float(labels["le"].strip('"'))] = float(m["value"])
    counters = {}
    for name in _COUNTERS:
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        if found:
            counters[name.removeprefix("timewheel_").removesuffix("_total")] = float(found[1])
    return counts or None, counters


def histogram_summary(before: dict[float, float] | None, after: dict[float, float] | None
                      ) -> dict[str, Any] | None:
    """The delta of two cumulative histograms: count, share within each bound, and upper
    bounds of p50 / p99 / p99.9 / max (the smallest bucket bound that holds them)."""
    if after is None:
        return None
    delta = {le: after[le] - (before or {}).get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return {"count": 0}

    def bound(q: float) -> float | None:
        for le, n in delta.items():
            if n >= q * total:
                return None if le == float("inf") else round(le * 1000, 3)
        return None

    return {
        "count": int(total),
        "share_within_ms": {f"{le * 1000:g}": round(n / total, 5)
                            for le, n in delta.items() if le != float("inf")},
        "p50_le_ms": bound(0.50), "p99_le_ms": bound(0.99), "p999_le_ms": bound(0.999),
        "max_le_ms": bound(1.0),
    }


class RunProbe:
    """Around one workload: the service's own lateness histogram (before/after), CPU steal and
    runnable threads from /proc/stat (sampled every 0.25 s), how often the service was
    preempted, and its GC pauses (bench/gc_log.py)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, gc_log: Path | None,
                 pid: int | None = None) -> None:
        self.session = session
        self.base = base
        self.gc_log = gc_log
        self.pid = pid
        self.hist: dict[float, float] | None = None
        self.counters: dict[str, float] = {}
        self.t0 = 0.0
        self.switches0: int | None = None
        self.steal: list[tuple[float, float]] = []  # (epoch s at the end of a sample, steal %)
        self.running: list[int] = []  # runnable threads at each sample
        self._sampler: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.hist, self.counters = await lateness_histogram(self.session, self.base)
        self.t0 = time.time()
        self.switches0 = proc_involuntary_switches(self.pid) if self.pid else None
        self._sampler = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        last = proc_stat_cpu()
        while last is not None:
            await asyncio.sleep(0.25)
            now = proc_stat_cpu()
            if now is None:
                return
            steal, total = now[0] - last[0], now[1] - last[1]
            if total > 0:
                self.steal.append((time.time(), 100.0 * steal / total))
            self.running.append(now[2])
            last = now

    async def stop(self) -> dict[str, Any]:
        t1 = time.time()
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
        after, counters = await lateness_histogram(self.session, self.base)
        switches = proc_involuntary_switches(self.pid) if self.pid else None
        pauses = gc_read(str(self.gc_log), self.t0, t1) if self.gc_log else None
        by_second: dict[int, list[float]] = {}
        for t, pct in self.steal:
            by_second.setdefault(int(t), []).append(pct)
        return {
            "service_lateness_first": histogram_summary(self.hist, after),
            "service_counters": {k: v - self.counters.get(k, 0.0) for k, v in counters.items()},
            "steal": {
                "mean_pct": round(sum(p for _, p in self.steal) / len(self.steal), 2)
                if self.steal else None,
                "max_1s_pct": round(max(sum(v) / len(v) for v in by_second.values()), 2)
                if by_second else None,
                "seconds_over_10pct": sum(1 for v in by_second.values() if sum(v) / len(v) > 10),
                "samples": [(round(t, 3), round(p, 2)) for t, p in self.steal],
            },
            # procs_running counts the sampling thread itself; more than nproc means waiting.
            "runnable_threads": {
                "mean": round(sum(self.running) / len(self.running), 2) if self.running else None,
                "max": max(self.running, default=None),
            },
            "service_preempted": None if switches is None or self.switches0 is None
            else switches - self.switches0,
            "gc": None if pauses is None else gc_summary(pauses),
        }


def gc_summary(pauses: list[tuple[float, float, int, int]]) -> dict[str, Any]:
    """Count, generations, total and longest of GC pauses (bench/gc_log.py's read())."""
    return {
        "collections": len(pauses),
        "by_generation": {str(g): sum(1 for p in pauses if p[2] == g) for g in (0, 1, 2)},
        "total_ms": round(sum(p[1] for p in pauses), 3),
        "max_ms": round(max((p[1] for p in pauses), default=0.0), 3),
        "over_1ms": sum(1 for p in pauses if p[1] > 1),
        "pauses": [(round(t, 6), ms, g) for t, ms, g, _ in pauses if ms > 0.5],
    }


def add_service_args(p: argparse.ArgumentParser) -> None:
    """The options of a bench that runs one ``timewheel serve`` of its own (run_on_service)."""
    p.add_argument("--pause", type=float, default=2.0)
    p.add_argument("--service-port", type=int, default=0)
    p.add_argument("--service-cmd", default=None)


def run_on_service(args: argparse.Namespace, name: str,
                   main: Callable[[str, Callable[[aiohttp.ClientSession], Awaitable[float]]],
                                  Coroutine[Any, Any, dict[str, Any]]],
                   *, stop_timeout: float = 60.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """Print the machine, start one ``timewheel serve`` (embedded Redis, temporary dir), run
    ``main(base_url, wait_healthy)`` against it, stop it; (its result, the machine facts)."""
    args.sign, args.fake_service = False, False  # what start_service reads
    require_loopback("127.0.0.1")
    facts = machine_facts()
    print_machine(facts)
    check_service_importable()
    run_id = f"{int(time.time()) % 100000:05d}{secrets.token_hex(2)}"
    tmp = Path(tempfile.mkdtemp(prefix=f"timewheel-bench-{name}-"))
    svc = start_service(args, tmp, run_id)
    try:
        return run(main(svc.base, lambda s: wait_healthy(svc, s, 60))), facts
    finally:
        svc.proc.terminate()
        svc.exit_code = svc.proc.wait(stop_timeout)
