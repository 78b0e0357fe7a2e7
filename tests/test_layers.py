"""The package's layers, read from the imports of its modules: the store speaks domain records
(it imports no API model, no HTTP framework and nothing above it), and no two store modules
import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import timewheel

PACKAGE = Path(timewheel.__file__).parent
# What the store must not import: the API's models and handlers, the service layer above it,
# the engine, and the libraries of HTTP and validation.
ABOVE_THE_STORE = ("timewheel.models", "timewheel.api", "timewheel.operations",
                   "timewheel.engine", "timewheel.service", "fastapi", "pydantic", "starlette")


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at run time or for type checking."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def store_modules() -> dict[str, set[str]]:
    return {f"timewheel.store.{path.stem}": imports(path)
            for path in (PACKAGE / "store").glob("*.py") if path.stem != "__init__"}


def test_the_store_imports_nothing_above_it() -> None:
    offending = {module: sorted(name for name in names
                                if name.startswith(ABOVE_THE_STORE))
                 for module, names in store_modules().items()}
    assert {module: names for module, names in offending.items() if names} == {}


def test_no_two_store_modules_import_each_other() -> None:
    modules = store_modules()
    pairs = {tuple(sorted((a, b))) for a, names in modules.items() for b in modules
             if a != b and b in names and a in modules[b]}
    assert pairs == set()


def test_the_checks_see_an_offending_import(tmp_path: Path) -> None:
    """Control: the reader finds both kinds of import, plain and under TYPE_CHECKING."""
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nimport pydantic\n"
                      "if TYPE_CHECKING:\n    from timewheel.models import TaskView\n")
    assert {"pydantic", "timewheel.models.TaskView"} <= imports(source)
