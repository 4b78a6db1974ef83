"""No import cycle among the modules of ``macula/``, ``relay/`` and ``tools/`` (issue 23).

The graph counts every ``import`` and ``from ... import`` anywhere in a module (inside
functions too: a lazy import hides a cycle, it does not break it), relative imports resolved,
``from package import name`` counted as an edge to ``package.name`` when that is a module.
A package's ``__init__`` is the node of the package's own name. Only edges between our own
modules count.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

from support.paths import REPO as ROOT

PACKAGES = ("macula", "relay", "tools")

# Cycles still there, each as its sorted set of modules, with the reason it stays.
ALLOWED: dict[frozenset[str], str] = {}


def module_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names (``from . import x``: the package)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def imported(module: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every module of ours that ``module`` imports, anywhere in its text."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _ours(alias.name, known)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path, node)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield from _ours(child if child in known else base, known)


def _ours(name: str, known: set[str]) -> Iterator[str]:
    """The longest known module ``name`` is, or is in (``import a.b.c`` imports ``a.b.c``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            yield candidate
            return
        parts.pop()


@functools.cache
def graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {m: {d for d in imported(m, p, known) if d != m} for m, p in files.items()}


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def a_cycle(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One concrete cycle through the component's first module, for the message."""
    members = set(component)
    start = component[0]
    paths: dict[str, list[str]] = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(edges[node] & members):
            if child == start:
                return [*paths[node], start]
            if child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    return component


def test_the_graph_sees_lazy_relative_and_from_package_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text(
        "def later():\n    from . import b\n    from .sub import c\n    import pkg.sub.c.x\n"
    )
    (package / "sub" / "__init__.py").write_text("from .. import b\nfrom .c import thing\n")
    known = {"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"}
    assert set(imported("pkg.a", package / "a.py", known)) == {"pkg.b", "pkg.sub.c"}
    assert set(imported("pkg.sub", package / "sub" / "__init__.py", known)) == {
        "pkg.b",
        "pkg.sub.c",
    }
    assert "tools.daemon.command" in graph()["tools.cli"]  # imported inside a function


def test_a_cycle_is_found_and_shown() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(edges) == [["a", "b", "c"]]
    assert a_cycle(["a", "b", "c"], edges) == ["a", "b", "c", "a"]


def test_no_import_cycle() -> None:
    edges = graph()
    cycles = [c for c in strongly_connected(edges) if frozenset(c) not in ALLOWED]
    shown = "\n".join(" -> ".join(a_cycle(c, edges)) + f"  (all: {c})" for c in cycles)
    assert not cycles, f"import cycles:\n{shown}"


def test_every_allowed_cycle_still_exists() -> None:
    present = {frozenset(c) for c in strongly_connected(graph())}
    assert not set(ALLOWED) - present, "an allowed cycle is gone: remove it from ALLOWED"
