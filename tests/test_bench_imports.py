"""Every benchmark module imports: the benches import test helpers (tests/support,
tests/cluster), which the suite changes without running a bench. Session 23 removed a helper
the cluster soak imported, and the soak was the first to find out."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("module", sorted(
    path.stem for path in BENCH.glob("*.py") if path.stem != "__init__"))
def test_the_bench_module_imports(module: str) -> None:
    importlib.import_module(f"bench.{module}")
