"""The bench's children die with it (bench/common.py ``start_receiver``, bench/service.py
``start_service``: PR_SET_PDEATHSIG): a bench killed before its finally blocks ran must not
leave a service firing its tasks, or a receiver, into the next benchmark on the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from timewheel.store.embedded import _running

ROOT = Path(__file__).resolve().parents[1]
# A bench in miniature: start a receiver the bench's way, say its pid, then wait to be killed.
BENCH = """
import time
from bench.common import start_receiver
proc, port = start_receiver()
print(proc.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_benchs_receiver_goes_with_it() -> None:
    bench = subprocess.Popen([sys.executable, "-c", BENCH], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    child = 0
    try:
        assert bench.stdout is not None
        child = int(bench.stdout.readline())
        assert _running(child)
        os.kill(bench.pid, signal.SIGKILL)  # no finally block runs
        bench.wait(10)
        deadline = time.monotonic() + 10
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child), "the receiver outlived its bench"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        if bench.stdout is not None:
            bench.stdout.close()
        if child and _running(child):  # the failure above: do not leave it behind
            os.kill(child, signal.SIGKILL)
