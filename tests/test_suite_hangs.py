"""The suite cannot hang: a pytest of its own, with this project's settings and the hooks of
tests/conftest.py (uvloop), runs a test that awaits forever, one that leaves a connection
open, and one that fails and then hangs in its teardown.

- pytest-timeout's "signal" method never fires under uvloop while the loop waits (a test
  awaiting something that never comes, a loop's close waiting for a connection). The
  "thread" method ends the worker.
- uvloop closes a handle still open when the loop closes from a callback that first warns:
  with warnings as errors the warning raises there, the handle stays open, and the loop's
  close waits for it for ever. A flow gate test's late permits call did that, and held a CI
  run until CI's own limit. The warning is shown instead.
- pytest-timeout stops its timer when a test fails; tests/conftest.py starts it again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

AWAITS_FOREVER = """
import asyncio

import pytest


@pytest.mark.timeout(2)
async def test_awaits_forever() -> None:
    await asyncio.Event().wait()
"""

LEAVES_A_CONNECTION_OPEN = """
import asyncio
import socket

LEFT = []


async def test_leaves_a_connection_open() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    _, writer = await asyncio.open_connection(*server.getsockname())
    LEFT.extend([server, writer])  # never closed: open, and reading, when the loop closes
"""

FAILS_THEN_HANGS = """
import time

import pytest


@pytest.fixture
def hangs_at_teardown():
    yield
    time.sleep(3600)


@pytest.mark.timeout(2)
def test_fails_then_hangs(hangs_at_teardown) -> None:
    assert False
"""


def run_own_pytest(directory: Path, test: str, *options: str) -> subprocess.CompletedProcess[str]:
    (directory / "conftest.py").write_text(
        "from tests.conftest import (  # noqa: F401  the suite's hooks\n"
        "    pytest_asyncio_loop_factories, pytest_exception_interact)\n")
    (directory / "test_it.py").write_text(test)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(directory), "-p", "no:cacheprovider", *options,
         str(directory / "test_it.py")],
        cwd=directory, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=60, check=False)


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["in-process", "xdist"])
def test_a_hung_async_test_is_ended_by_the_time_limit(tmp_path: Path, workers: list[str]) -> None:
    result = run_own_pytest(tmp_path, AWAITS_FOREVER, *workers)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    said = "crashed while running 'test_it.py::test_awaits_forever'" if workers else "Timeout"
    assert said in output, output


def test_a_connection_left_open_is_reported_and_the_loop_closes(tmp_path: Path) -> None:
    result = run_own_pytest(tmp_path, LEAVES_A_CONNECTION_OPEN, "-o", "timeout=30")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "1 passed, 1 warning" in output and "unclosed resource <TCPTransport" in output, \
        output


def test_a_failed_test_that_hangs_in_teardown_is_ended_by_the_time_limit(
        tmp_path: Path) -> None:
    result = run_own_pytest(tmp_path, FAILS_THEN_HANGS)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Timeout" in output, output
