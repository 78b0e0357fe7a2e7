"""The suite's own time limit ends a hung test, async ones included: they run on uvloop
(tests/conftest.py), where pytest-timeout's "signal" method never fires while a test awaits
something that never comes, and one such test held a CI run until CI's own limit. Here a
pytest of its own, with this project's settings and loop, runs a test that awaits forever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HUNG = """
import asyncio

import pytest


@pytest.mark.timeout(2)
async def test_awaits_forever() -> None:
    await asyncio.Event().wait()
"""


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["in-process", "xdist"])
def test_a_hung_async_test_is_ended_by_the_time_limit(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_asyncio_loop_factories  # noqa: F401  uvloop\n")
    (tmp_path / "test_hung.py").write_text(HUNG)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", *workers,
         str(tmp_path / "test_hung.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    said = "crashed while running 'test_hung.py::test_awaits_forever'" if workers else \
        "Timeout"
    assert said in output, output
