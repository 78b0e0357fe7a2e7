"""What payload encryption at rest (TIMEWHEEL_ENCRYPTION_KEYS) costs, with and without it
alternated in one sitting so that the machine's load falls on both alike.

    python -m bench.encryption                         # 3 rounds
    python -m bench.encryption --rounds 2 --batch-tasks 20000 --memory-tasks 100000

Each round runs, once without keys and once with one key (the order swapped every round):
``bench.batch`` (POST /tasks/batch, tasks/s and service CPU per task), ``bench.run --workload
post`` (single POST /tasks, ok/s) and ``bench.memory_api`` (Redis bytes per pending task). Each
is a fresh ``timewheel serve`` with its embedded Redis. Then the seal and open of one task in
this process (the cipher alone, µs per call) for three body sizes. Prints a table with the
ratio sealed / plain of the medians and writes bench/results/<date>-encryption.json.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, machine_facts, print_machine

KEY = "bench:" + base64.b64encode(bytes(range(32))).decode()


def one(kind: str, sealed: bool, args: argparse.Namespace) -> dict[str, float]:
    """Run one bench in a subprocess; its figures (a rate and the service's CPU µs per task,
    which a loaded machine distorts less than the rate; or bytes per task)."""
    env = {k: v for k, v in os.environ.items() if k != "TIMEWHEEL_ENCRYPTION_KEYS"}
    if sealed:
        env["TIMEWHEEL_ENCRYPTION_KEYS"] = KEY
    with tempfile.TemporaryDirectory(prefix="timewheel-bench-enc-") as out:
        if kind == "batch":
            cmd = ["-m", "bench.batch", "--tasks", str(args.batch_tasks), "--results-dir", out]
        elif kind == "post":
            cmd = ["-m", "bench.run", "--workload", "post", "--tasks", str(args.post_tasks),
                   "--results-dir", out]
        else:
            cmd = ["-m", "bench.memory_api", "--sizes", str(args.memory_tasks), "--cancelled",
                   "0", "--results-dir", out]
        done = subprocess.run([sys.executable, *cmd], env=env, capture_output=True, text=True,
                              timeout=1800, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{kind} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        [path] = Path(out).glob("*.json")
        result = json.loads(path.read_text())
    if kind == "batch":
        res = result["results"]
        return {"tasks_per_s": float(res["tasks_per_s"]),
                "service_cpu_us_per_task": float(res["cpu_us_per_task"]["service"])}
    if kind == "post":
        res = result["results"]
        return {"tasks_per_s": float(res["ok_per_s"]),
                "service_cpu_us_per_task": round(
                    res["cpu"]["service_cpu_s"] * 1e6 / max(1, res["ok"]), 1)}
    return {"bytes_per_task": float(result["pending"][0]["bytes_per_task"])}


def cipher_micro() -> dict[str, dict[str, float]]:
    from timewheel.store import layout
    from timewheel.store.encryption import Cipher, OpenedTask, parse_keys

    cipher = Cipher(parse_keys(KEY))
    headers = layout.encode_headers([("Authorization", "Bearer " + "x" * 40),
                                     ("Content-Type", "application/json")])
    h12 = bytes(12)
    out = {}
    for size in (100, 1024, 65_536):
        body = b"b" * size
        blob = cipher.seal_task("task-key-0001", h12, headers, body)
        n = 20_000 if size < 10_000 else 2000
        def seal_it(b: bytes = body) -> bytes:
            return cipher.seal_task("task-key-0001", h12, headers, b)

        def open_it(b: bytes = blob) -> OpenedTask:
            return cipher.open_task("task-key-0001", b)

        seal = min(timeit.repeat(seal_it, number=n, repeat=3)) / n
        opened = min(timeit.repeat(open_it, number=n, repeat=3)) / n
        out[f"{size} B body"] = {"seal_us": round(seal * 1e6, 2), "open_us": round(opened * 1e6, 2),
                                 "stored_bytes_more": len(blob) - len(headers) - size}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.encryption",
                                description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-tasks", type=int, default=20_000)
    p.add_argument("--post-tasks", type=int, default=3000)
    p.add_argument("--memory-tasks", type=int, default=100_000)
    p.add_argument("--results-dir", default=None)
    args = p.parse_args(argv)
    facts = machine_facts()
    print_machine(facts)
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%SZ}"
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        kind: {"plain": [], "sealed": []} for kind in ("batch", "post", "memory")}
    loads = []
    for r in range(args.rounds):
        for sealed in ((False, True) if r % 2 == 0 else (True, False)):
            for kind in runs:
                figure = one(kind, sealed, args)
                runs[kind]["sealed" if sealed else "plain"].append(figure)
                print(f"round {r + 1} {kind:6} {'sealed' if sealed else 'plain ':6} {figure}",
                      flush=True)
        loads.append(os.getloadavg()[0])
    summary: dict[str, Any] = {}
    names = {"batch": "POST /tasks/batch", "post": "POST /tasks", "memory": "Redis"}
    print(f"\n{'':58} {'plain':>9} {'sealed':>9} {'ratio':>6}")
    for kind, figures in runs.items():
        summary[kind] = {"runs": figures}
        for name in figures["plain"][0]:
            plain = statistics.median(f[name] for f in figures["plain"])
            sealed_ = statistics.median(f[name] for f in figures["sealed"])
            summary[kind][name] = {"plain_median": plain, "sealed_median": sealed_,
                                   "ratio": round(sealed_ / plain, 3)}
            print(f"{names[kind] + ', ' + name:58} {plain:>9.1f} {sealed_:>9.1f} "
                  f"{sealed_ / plain:>6.3f}")
    micro = cipher_micro()
    for size, row in micro.items():
        print(f"cipher, {size:14}: seal {row['seal_us']} µs, open {row['open_us']} µs, "
              f"+{row['stored_bytes_more']} bytes stored")
    out = {"benchmark": "encryption", "started_at": stamp,
           "command": "python -m bench.encryption " + " ".join(sys.argv[1:]),
           "machine": facts, "load_after_each_round": loads, "config": vars(args),
           "results": summary, "cipher": micro}
    directory = Path(args.results_dir) if args.results_dir else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stamp}-encryption.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"written : {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
