"""The fault-injection soak's short mode (bench/soak.py --short): three `timewheel serve`
processes on one Redis with AOF (appendfsync always), a real receiver, a continuous load, and
one fault of each kind while it runs: a SIGKILL and restart, a SIGSTOP longer than any lease,
a Redis SIGKILL and restart from its AOF, a Redis SIGSTOP longer than the socket timeout, and
one process cut from Redis (its connections held both ways) longer than any lease.

The checker (bench/soak_check.py, unit-tested in tests/test_soak_check.py) reads the history;
nothing here is timed: every bound comes from the settings (task timeout, lease margin, tick).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.soak_history import read

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"proc_kill", "proc_stop", "redis_restart", "redis_stall", "proc_partition"}


@pytest.mark.timeout(1100)
def test_short_soak_loses_nothing_fires_nothing_early_and_doubles_only_after_faults(
        tmp_path: Path) -> None:
    # The SIGSTOP proves most when it lands on the process that holds its burst (aimed), and
    # the aim can miss on a machine loaded past its cores (CI's, once: the process claimed the
    # burst later than the aim's window, the load's requests timing out meanwhile). Then the
    # run counts only for the invariants, and a second run has to aim.
    for run in (1, 2):
        aimed = short_soak(tmp_path / f"run{run}")
        if aimed:
            break
    assert aimed, "the proc_stop of two runs was not aimed at the process holding its burst"


def short_soak(out: Path) -> bool:
    """One short soak into `out`: its invariants asserted; whether its proc_stop was aimed."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--short", "--processes", "3", "--seed", "7",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)
    summary_path = out / "summary.json"
    assert summary_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    table = done.stdout[-4000:]

    # The run did what it is for: each fault injected (the process faults at the process that
    # held the burst due at that instant, when it could be seen), tasks created, cancelled
    # and delivered.
    assert summary["fault_errors"] == [], table
    assert set(summary["faults_by_kind"]) == KINDS, table
    history = read(out / "history.jsonl")
    aimed = [e["aimed"] for e in history if e["type"] == "fault" and e["kind"] == "proc_stop"]
    assert len(aimed) == 1, table
    assert summary["tasks_acknowledged"] > 300 and summary["tasks_cancelled"] > 0, table
    assert summary["occurrence_keys_delivered"] > 0, table

    counts = summary["counts"]
    details = summary["details"]
    assert counts["lost"] == 0, shown(details["lost"], table)
    assert counts["early"] == 0, shown(details["early"], table)
    assert counts["rounded_down"] == 0, shown(details["rounded_down"], table)
    assert counts["phantom"] == 0, shown(details["phantom"], table)
    assert counts["delivered_after_cancel"] == 0, shown(details["after_cancel"], table)
    assert counts["delivered_superseded"] == 0, shown(details["superseded"], table)
    assert summary["exit_codes"] == {"p0": 0, "p1": 0, "p2": 0}, table
    # The SIGSTOP lands while attempts wait between their start and their send, or for their
    # connection: the process must hand them back instead of sending them after SIGCONT, past
    # their lease, when another process may already have re-claimed and delivered them.
    assert counts["duplicates_unexplained"] == 0, shown(details["duplicates_unexplained"], table)
    return bool(aimed[0])


def shown(cases: list[dict[str, Any]], table: str) -> str:
    """The first five cases in full (pytest cuts a list's repr short) and the run's table: a
    CI machine keeps no history to re-check."""
    return json.dumps(cases[:5], indent=1) + "\n" + table
