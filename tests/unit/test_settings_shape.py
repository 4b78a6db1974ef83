"""One home for each environment variable: ``macula/config.py`` names and parses the library's
and the station's ``MACULA_*`` variables, ``tools/settings.py`` the MCP server's own; no other
module of ``macula/``, ``relay/`` or ``tools/`` writes a ``MACULA_`` name in its code.

Docstrings and comments may name a variable (they explain it); a string, an f-string's text or
a keyword argument's name may not (a message names it through the settings module's constant).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import macula.config
import tools.settings
from support.paths import REPO as ROOT

PACKAGES = ("macula", "relay", "tools")
HOMES = frozenset({Path("macula/config.py"), Path("tools/settings.py")})
MARK = "MACULA_"


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the module's, classes' and functions' docstring constants."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.add(id(first.value))
    return found


def literals_naming_a_variable(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant (f-string parts included) and keyword argument
    name in ``source`` holding ``MACULA_``, docstrings left out."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MARK in node.value
            and id(node) not in docstrings
        ):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.keyword) and node.arg and MARK in node.arg:
            found.append((node.lineno, node.arg))
    return found


def test_no_module_but_the_two_settings_modules_writes_a_variable_name() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) not in HOMES
        for line, text in literals_naming_a_variable(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "name these through macula.config or tools.settings:\n" + "\n".join(found)


def test_the_settings_modules_do_name_them() -> None:
    for home in HOMES:
        assert literals_naming_a_variable((ROOT / home).read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("source", "count"),
    [
        ('"""MACULA_HOME in a docstring."""\n', 0),
        ('def f():\n    """MACULA_X explained."""\n    return 1\n', 0),
        ("# MACULA_HOME in a comment\nx = 1\n", 0),
        ('x = "MACULA_HOME"\n', 1),
        ('x = f"{y} MACULA_HOME"\n', 1),
        ("x = dict(MACULA_HOME='/h')\n", 1),
        ('class C:\n    """doc"""\n    name = "MACULA_MCP_X"\n', 1),
        ('def f():\n    return "MACULA_X"\n', 1),
    ],
)
def test_the_check_sees_code_and_skips_prose(source: str, count: int) -> None:
    assert len(literals_naming_a_variable(source)) == count


def test_the_light_copies_agree_with_the_library() -> None:
    """``tools.settings`` restates a few library names so that ``attach`` stays light."""
    assert tools.settings.PREFIX == macula.config.PREFIX
    assert tools.settings.HOME_ENV == macula.config.HOME_ENV
    assert tools.settings.DEFAULT_HOME == macula.config.DEFAULT_HOME
    assert tools.settings.STATIONS_ENV == macula.config.STATIONS_ENV


def test_every_name_starts_with_the_prefix() -> None:
    for module in (macula.config, tools.settings):
        names = {k: v for k, v in vars(module).items() if k.endswith(("_ENV", "_PREFIX"))}
        assert names
        wrong = {k: v for k, v in names.items() if not v.startswith(macula.config.PREFIX)}
        expected = {"SESSION_ENV": "CLAUDE_CODE_SESSION_ID"} if module is macula.config else {}
        assert wrong == expected
