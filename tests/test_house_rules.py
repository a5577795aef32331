"""House rules the code keeps as it grows (issue 33): no import cycle among the modules of ``edgekit`` and
``edgekit_runtime``, and no non-test module over 600 lines under edgekit/, runtime/ and scripts/.

Imports are read with ``ast``; nothing is imported. Every ``import`` statement counts: at module level, inside
functions and under ``TYPE_CHECKING`` alike (each is a dependency a reader has to follow). Relative imports
are resolved against the importing module's package. ``from package import name`` depends on
``package.name`` when that is one of our modules, on ``package`` otherwise; a module does not depend on the
``__init__`` of the packages above it (as import-linter and grimp count it)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE_ROOTS = {"edgekit": REPO / "edgekit", "edgekit_runtime": REPO / "runtime" / "edgekit_runtime"}
SIZE_CHECKED_DIRS = ("edgekit", "runtime", "scripts")
MAX_MODULE_LINES = 600

#: Modules allowed over MAX_MODULE_LINES (repository-relative path -> why); none today. An entry must say why
#: the module cannot be split along its own sections, and goes when it can.
EXCEPTIONS: dict[str, str] = {}

#: Import cycles allowed for now (the sorted modules of the cycle -> why); none today. Any other cycle fails,
#: and so does a listed one that grew.
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


# ---------------------------------------------------------------- the import graph


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages (a package is its __init__.py)."""
    modules: dict[str, Path] = {}
    for package, root in PACKAGE_ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def imported_names(tree: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> Iterator[str]:
    """The names each import statement in ``tree`` depends on, relative imports made absolute."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = (module if is_package else module.rpartition(".")[0]).split(".")
                kept = package[: len(package) - (node.level - 1)]
                base = ".".join(kept + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield submodule if submodule in modules else base


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names = imported_names(tree, module, path.name == "__init__.py", modules)
        graph[module] = {name for name in names if name in modules and name != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion),
    each as the sorted tuple of its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[tuple[str, ...]] = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in sorted(graph):
        if root in index:
            continue
        enter(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    enter(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(tuple(sorted(component)))
    return sorted(components)


def cycle_path(graph: dict[str, set[str]], component: tuple[str, ...]) -> list[str]:
    """The shortest closed path from the component's first module back to itself (a -> b -> ... -> a)."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    return [*component, start]


# ---------------------------------------------------------------- module sizes


def checked_modules() -> Iterator[Path]:
    """Every non-test .py file under SIZE_CHECKED_DIRS (build and cache folders left out)."""
    for folder in SIZE_CHECKED_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO).parts
            if any(part in ("tests", "__pycache__", "build") or part.endswith(".egg-info") for part in parts):
                continue
            if path.name.startswith("test_") or path.name == "conftest.py":
                continue
            yield path


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


# ---------------------------------------------------------------- the rules


def test_no_import_cycle_outside_the_known_ones() -> None:
    graph = import_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 500, "the walk found too few modules or imports"
    new = [component for component in import_cycles(graph) if component not in KNOWN_CYCLES]
    described = "\n".join("  " + " -> ".join(cycle_path(graph, component)) for component in new)
    assert not new, (f"import cycles (break each at its cause: move what both modules use to a lower module both "
                     f"import, or pass data in instead of calling up):\n{described}")  # fmt: skip


def test_known_cycles_are_still_there() -> None:
    """An allowance outlives its cycle: when a known cycle is gone (or has changed), its entry must go too."""
    cycles = set(import_cycles(import_graph()))
    stale = sorted(" <-> ".join(component) for component in KNOWN_CYCLES if component not in cycles)
    assert not stale, f"KNOWN_CYCLES in {Path(__file__).name} lists cycles that are gone; remove them: {stale}"


def test_no_module_over_the_line_limit_outside_the_exceptions() -> None:
    modules = list(checked_modules())
    assert len(modules) > 200, "the walk found too few modules"
    long = {str(path.relative_to(REPO)): line_count(path) for path in modules}
    over = sorted(f"{path} ({lines} lines)" for path, lines in long.items() if lines > MAX_MODULE_LINES and path not in EXCEPTIONS)
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split each along its own sections): {over}"


def test_every_exception_is_still_a_long_module() -> None:
    stale = sorted(path for path in EXCEPTIONS if not (REPO / path).is_file() or line_count(REPO / path) <= MAX_MODULE_LINES)
    assert not stale, (f"EXCEPTIONS in {Path(__file__).name} names modules now within {MAX_MODULE_LINES} lines (or gone); "
                       f"remove them: {stale}")


# ---------------------------------------------------------------- the checks themselves, on small trees


def _graph_of(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for name, text in files.items():
        path = tmp_path / "edgekit" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return import_graph()


def test_the_walk_counts_function_level_relative_and_type_checking_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "PACKAGE_ROOTS", {"edgekit": tmp_path / "edgekit"})
    graph = _graph_of(tmp_path, {
        "__init__.py": "",
        "a.py": "def f():\n    from edgekit.b import g\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import c\n",
        "sub/__init__.py": "from .. import a\n",
        "sub/c.py": "from ..a import f\nimport edgekit.sub\n",
        "lone.py": "import os\nfrom edgekit import sub\n",
    })  # fmt: skip
    assert graph["edgekit.a"] == {"edgekit.b"}
    assert graph["edgekit.b"] == {"edgekit.sub.c"}
    assert graph["edgekit.sub"] == {"edgekit.a"}
    assert graph["edgekit.sub.c"] == {"edgekit.a", "edgekit.sub"}
    assert graph["edgekit.lone"] == {"edgekit.sub"}
    [cycle] = import_cycles(graph)
    assert cycle == ("edgekit.a", "edgekit.b", "edgekit.sub", "edgekit.sub.c")
    assert cycle_path(graph, cycle) == ["edgekit.a", "edgekit.b", "edgekit.sub.c", "edgekit.a"]


def test_a_graph_without_cycles_has_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "PACKAGE_ROOTS", {"edgekit": tmp_path / "edgekit"})
    graph = _graph_of(tmp_path, {"__init__.py": "from edgekit.a import x\n", "a.py": "from edgekit.b import y\n", "b.py": "y = 1\n"})
    assert graph == {"edgekit": {"edgekit.a"}, "edgekit.a": {"edgekit.b"}, "edgekit.b": set()}
    assert import_cycles(graph) == []
