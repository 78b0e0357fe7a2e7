"""The fault-injection soak's short mode (bench/soak.py --short): three `timewheel serve`
processes on one Redis with AOF (appendfsync always), a real receiver, a continuous load, and
one fault of each kind while it runs: a SIGKILL and restart, a SIGSTOP longer than any lease,
a Redis SIGKILL and restart from its AOF, a Redis SIGSTOP longer than the socket timeout.

The checker (bench/soak_check.py, unit-tested in tests/test_soak_check.py) reads the history;
nothing here is timed: every bound comes from the settings (task timeout, lease margin, tick).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak_history import read

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"proc_kill", "proc_stop", "redis_restart", "redis_stall"}


class UnexplainedDuplicate(AssertionError):
    """The one failure the xfail below expects; any other failure fails the test."""


@pytest.mark.timeout(600)
# Not strict: the SIGSTOP must land in the few ms between an attempt's start in Redis and its
# send, which one aimed stop does in about half of the short runs on the 2-core machine
# (bench/README.md, "Fault-injection soak"); a strict marker would fail CI on the other half.
# Any other failure (lost, early, after cancel, a fault not injected) fails the test.
@pytest.mark.xfail(strict=False, raises=UnexplainedDuplicate, reason=(
    "issue #23 finding, reproduced by the soak: a process SIGSTOPped after it marked an "
    "attempt started sends it on SIGCONT, past its lease, after another process delivered "
    "the task (an unexplained duplicate). The delivery-core rebuild must fix it; remove this "
    "marker then."))
def test_short_soak_loses_nothing_fires_nothing_early_and_doubles_only_after_faults(
        tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--short", "--processes", "3", "--seed", "7",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)
    summary_path = tmp_path / "summary.json"
    assert summary_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    table = done.stdout[-4000:]

    # The run did what it is for: each fault injected (the process faults at the process that
    # held the burst due at that instant), tasks created, cancelled and delivered.
    assert summary["fault_errors"] == [], table
    assert set(summary["faults_by_kind"]) == KINDS, table
    history = read(tmp_path / "history.jsonl")
    aimed = [e["aimed"] for e in history if e["type"] == "fault" and e["kind"] == "proc_stop"]
    assert aimed == [True], table
    assert summary["tasks_acknowledged"] > 300 and summary["tasks_cancelled"] > 0, table
    assert summary["occurrence_keys_delivered"] > 0, table

    counts = summary["counts"]
    details = summary["details"]
    assert counts["lost"] == 0, details["lost"][:5]
    assert counts["early"] == 0, details["early"][:5]
    assert counts["rounded_down"] == 0, details["rounded_down"][:5]
    assert counts["phantom"] == 0, details["phantom"][:5]
    assert counts["delivered_after_cancel"] == 0, details["after_cancel"][:5]
    assert counts["delivered_superseded"] == 0, details["superseded"][:5]
    assert summary["exit_codes"] == {"p0": 0, "p1": 0, "p2": 0}, table
    if counts["duplicates_unexplained"]:
        raise UnexplainedDuplicate(details["duplicates_unexplained"][:5])
