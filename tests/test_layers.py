"""The package's layers, read from the imports of its modules: the store speaks domain records
(it imports no API model, no HTTP framework and nothing above it), the HTTP handlers reach it
only through the service layer (timewheel/operations/), no two store modules import each
other, and no module of the package imports itself back through others (a cycle)."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
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


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its ``__init__``)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _run_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements a module runs when imported: its top level, into ``if`` (except
    ``if TYPE_CHECKING:``) and ``try``, not into functions or classes."""
    for node in body:
        if isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from _run_time_statements(node.body)
            yield from _run_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(handler.body for handler in node.handlers)):
                yield from _run_time_statements(block)
        else:
            yield node


def run_time_imports(name: str, path: Path, known: Collection[str]) -> set[str]:
    """The modules of ``known`` that importing ``name`` (at ``path``) imports first:
    ``from x import y`` is module x.y when that is one, else x; relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _run_time_statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in known:
                    found.add(target)
                elif base in known:
                    found.add(base)
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    paths = modules()
    return {name: run_time_imports(name, path, paths) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle in each group of modules that import one another (a strongly connected
    component of more than one module), as ``[a, b, ..., a]``."""
    found = []
    seen: set[str] = set()
    for start in sorted(graph):
        if start in seen:
            continue
        reach = _reachable(graph, start)
        group = {name for name in reach if start in _reachable(graph, name)}
        seen |= group
        if len(group) > 1:
            found.append(_cycle_through(graph, start, group))
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    reached, stack = {start}, [start]
    while stack:
        for name in graph[stack.pop()]:
            if name not in reached:
                reached.add(name)
                stack.append(name)
    return reached


def _cycle_through(graph: dict[str, set[str]], start: str, group: set[str]) -> list[str]:
    """A shortest path from ``start`` back to itself within ``group`` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for target in sorted(graph[name] & group):
                if target == start:
                    path = [name]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if target not in came_from:
                    came_from[target] = name
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is in no cycle")


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


# The modules under timewheel/api/ that may import the store: those that build or start it
# (type-only wiring), not handlers. Neither needs it today (api/app.py opens the Wheel, which
# builds the store in timewheel/service.py; api/deps.py starts it lazily through ``wheel.store``),
# so the allowance only keeps wiring code there from having to go through the operations.
API_WIRING = {"timewheel.api.app": "builds the Wheel, and with it the store",
              "timewheel.api.deps": "starts the store when a request finds it not ready"}


def test_the_handlers_reach_the_store_only_through_the_operations() -> None:
    """The HTTP layer imports timewheel.operations and timewheel.models; the domain records it
    shows come through timewheel/operations/records.py."""
    offending = {}
    for name, path in modules().items():
        if name.startswith("timewheel.api.") and name not in API_WIRING:
            found = sorted(i for i in imports(path)
                           if i == "timewheel.store" or i.startswith("timewheel.store."))
            if found:
                offending[name] = found
    assert offending == {}


def test_no_import_cycle() -> None:
    """A cycle makes what a module finds at import time depend on which module of the cycle
    was imported first. Imports under ``if TYPE_CHECKING:`` and inside functions are not run
    at import time and are left out."""
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    """Control: a cycle of three modules through ``from . import``, ``from x import y`` and
    ``import x``, named in order; an import under TYPE_CHECKING or in a function makes none."""
    sources = {"pkg/__init__.py": "",
               "pkg/a.py": "from . import b\n",
               "pkg/b.py": "from pkg.c import thing\n",
               "pkg/c.py": "import pkg.a\nthing = 1\n",
               "pkg/d.py": "from typing import TYPE_CHECKING\nimport pkg.a\n"
                           "if TYPE_CHECKING:\n    import pkg.d2\n",
               "pkg/d2.py": "def f():\n    import pkg.d\n"}
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.d2"}
    graph = {name: run_time_imports(name, tmp_path / (name.replace(".", "/") + ".py")
                                    if name != "pkg" else tmp_path / "pkg/__init__.py", known)
             for name in known}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_the_checks_see_an_offending_import(tmp_path: Path) -> None:
    """Control: the reader finds both kinds of import, plain and under TYPE_CHECKING."""
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nimport pydantic\n"
                      "if TYPE_CHECKING:\n    from timewheel.models import TaskView\n")
    assert {"pydantic", "timewheel.models.TaskView"} <= imports(source)
