"""The shape of ``macula/`` and ``tools/`` (issue 23): no module over 600 lines, no function over
80 lines of its own (nested functions counted apart), and every MCP tool a module-level function
(none defined, decorated or registered inside another function), so each can be imported and
called. ``relay/`` is held to the same by ``test_relay_shape.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.paths import REPO as ROOT
from tools.server.server import build_server

TOOLS_DIR = ROOT / "tools"
PACKAGES = (ROOT / "macula", TOOLS_DIR)
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80  # for every function: none is let off

Function = ast.FunctionDef | ast.AsyncFunctionDef


def modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in package.rglob("*.py"))


def tool_modules() -> list[Path]:
    return sorted(TOOLS_DIR.rglob("*.py"))


def name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def functions(tree: ast.AST) -> Iterator[tuple[Function, Function | None]]:
    """Every function in ``tree`` with the function it is nested in (None at module or class
    level)."""

    def walk(node: ast.AST, outer: Function | None) -> Iterator[tuple[Function, Function | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield child, outer
                yield from walk(child, child)
            else:
                yield from walk(child, outer)

    yield from walk(tree, None)


def own_lines(function: Function) -> int:
    """Lines of ``function`` (decorators to last line), less those of functions and classes
    nested in it."""
    start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
    lines = set(range(start, (function.end_lineno or function.lineno) + 1))
    for node in ast.walk(function):
        if node is not function and isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        ):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines -= set(range(first, (node.end_lineno or node.lineno) + 1))
    return len(lines)


def registers_a_tool(function: Function) -> bool:
    """Decorated with ``<x>.tool(...)`` / ``<x>.add_tool``, or named as a tool (``mesh_*``)."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr in {"tool", "add_tool"}:
            return True
    return function.name.startswith("mesh_")


def long_functions(path: Path) -> list[tuple[str, int]]:
    """The functions of ``path`` over 80 lines of their own."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (function.name, own_lines(function))
        for function, _ in functions(tree)
        if own_lines(function) > MAX_FUNCTION_LINES
    ]


@pytest.mark.parametrize("path", modules(), ids=name)
def test_no_module_is_over_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, (name(path), lines)


@pytest.mark.parametrize("path", modules(), ids=name)
def test_no_function_is_over_80_lines_of_its_own(path: Path) -> None:
    assert not long_functions(path), (name(path), long_functions(path))


def test_both_packages_are_checked() -> None:
    checked = {name(path) for path in modules()}
    assert {"macula/node/node.py", "macula/client/core.py", "tools/server/server.py"} <= checked


@pytest.mark.parametrize("path", tool_modules(), ids=name)
def test_no_tool_is_defined_inside_another_function(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nested = [
        f"{outer.name}.{function.name}"
        for function, outer in functions(tree)
        if outer is not None and registers_a_tool(function)
    ]
    assert not nested, (name(path), nested)


def test_every_registered_tool_is_a_module_level_function() -> None:
    app = build_server({"MACULA_HOME": "/nonexistent"})
    tools = app._tool_manager.list_tools()
    assert len(tools) >= 41
    for tool in tools:
        assert tool.fn.__name__ == tool.name, tool.name
        assert tool.fn.__qualname__ == tool.name, (tool.name, tool.fn.__qualname__)
        module = __import__(tool.fn.__module__, fromlist=["_"])
        assert getattr(module, tool.name) is tool.fn, tool.name


def test_the_checks_catch_what_they_are_for() -> None:
    source = (
        "def register(app):\n"
        "    @app.tool(name='mesh_x')\n"
        "    async def mesh_x() -> None:\n"
        "        pass\n" + "    x = 1\n" * 90
    )
    tree = ast.parse(source)
    [(register, _), (inner, outer)] = list(functions(tree))
    assert outer is register and registers_a_tool(inner)
    assert own_lines(register) == 91 and own_lines(inner) == 3
