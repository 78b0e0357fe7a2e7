"""Start, watch and stop the `timewheel serve` under test; CPU accounting from /proc."""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import secrets
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    BENCH_DIR,
    free_port,
    proc_children,
    proc_cpu_seconds,
    proc_name,
    proc_rss_mib,
)

SERVE_CMD = ("{python} -c 'import sys; from timewheel.cli import main; "
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


def start_service(args: argparse.Namespace, tmp: Path, run_id: str) -> Service:
    port = args.service_port or free_port()
    data_dir = tmp / "data"
    data_dir.mkdir()
    env = dict(os.environ)
    env["TIMEWHEEL_ALLOW_PRIVATE_NETWORKS"] = "true"
    env["TIMEWHEEL_DATA_DIR"] = str(data_dir)
    if env.get("TIMEWHEEL_REDIS_URL") and not env.get("TIMEWHEEL_KEY_PREFIX"):
        # a shared Redis: keep this run's keys apart from anything else in it
        env["TIMEWHEEL_KEY_PREFIX"] = f"bench{run_id}"
    if args.sign:
        env["TIMEWHEEL_SIGNING_SECRET"] = "whsec_" + base64.b64encode(
            secrets.token_bytes(32)).decode()
    template = FAKE_CMD if args.fake_service else (args.service_cmd or SERVE_CMD)
    command = template.format(python=shlex.quote(sys.executable), host="127.0.0.1", port=port)
    log_path = tmp / "service.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(shlex.split(command), cwd=str(BENCH_DIR.parent), env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    shown_env = {k: ("<set>" if "SECRET" in k or "TOKEN" in k else v)
                 for k, v in env.items() if k.startswith("TIMEWHEEL_")}
    return Service(proc, f"http://127.0.0.1:{port}", log_path, data_dir, command, shown_env)


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
        out["service_rss_mib"] = proc_rss_mib(self.pids["service"])
        return out


