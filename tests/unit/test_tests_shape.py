"""The tests' own shape (issue 38): a helper is written once, in ``tests/support/``.

- No two modules under ``tests/`` define a top-level function, fixture or class (other than a
  ``test_*`` function or ``Test*`` class) of the same name and the same code: the second one is a
  copy of the first, and belongs in ``tests/support/`` (a fixture: in the nearest shared
  ``conftest.py``). The code compared is the signature's names and defaults and the body, less
  the docstring, type annotations and decorators, as ``ast`` parses it: formatting and comments
  never hide a copy.
- A module under ``tests/`` is a test module (``test_*.py``), a ``conftest.py``, or a helper in
  ``tests/support/``: no helper beside the tests it serves.
- A test module imports helpers from ``support`` only: never another test module (``from
  test_router_core import ...``) nor anything through its own folder, so a test can move to
  another folder (``tests/unit/relay/core/``) and still import what it did.

Nothing is allowed to differ from these rules: there is no allow-list.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from support.paths import REPO

TESTS = REPO / "tests"
SUPPORT = TESTS / "support"
Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def is_test(node: Definition) -> bool:
    if isinstance(node, ast.ClassDef):
        return node.name.startswith("Test")
    return node.name.startswith("test_")


def normalised(node: Definition) -> str:
    """``node``'s code less its docstring, annotations and decorators."""
    copy = ast.parse(ast.unparse(node)).body[0]
    assert isinstance(copy, Definition)
    copy.decorator_list = []
    body = copy.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        copy.body = body[1:] or [ast.Pass()]
    for sub in ast.walk(copy):
        if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
            sub.returns = None
        elif isinstance(sub, ast.arg):
            sub.annotation = None
        elif isinstance(sub, ast.AnnAssign) and sub.value is None and sub.simple:
            sub.annotation = ast.Constant(None)  # a dataclass field: its name stays, not its type
    return ast.dump(copy)


def copies(sources: dict[str, str]) -> list[str]:
    """Each top-level definition found with the same name and code in two or more modules."""
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, source in sources.items():
        for node in ast.parse(source).body:
            if isinstance(node, Definition) and not is_test(node):
                where[(node.name, normalised(node))].append(f"{name}:{node.lineno}")
    return sorted(
        f"{definition} in {', '.join(places)}"
        for (definition, _), places in where.items()
        if len(places) > 1
    )


def test_no_helper_is_defined_twice() -> None:
    sources = {str(p.relative_to(TESTS)): p.read_text(encoding="utf-8") for p in modules()}
    found = copies(sources)
    assert not found, "defined again: keep one in tests/support/ and import it\n" + "\n".join(found)


def test_a_copy_is_found_however_it_is_written() -> None:
    first = 'def until(check):\n    """Poll."""\n    while not check():\n        pass\n'
    second = (
        "@deco\ndef until(check: object) -> None:\n    # the same\n"
        "    while not check():  # polled\n        pass\n"
    )
    other = "def until(check):\n    while check():\n        pass\n"
    assert copies({"a.py": first, "b.py": second}) == ["until in a.py:1, b.py:2"]
    assert copies({"a.py": first, "b.py": other}) == []
    assert copies({"a.py": "def test_x():\n    pass\n", "b.py": "def test_x():\n    pass\n"}) == []


def test_every_helper_module_is_in_support() -> None:
    stray = [
        str(p.relative_to(TESTS))
        for p in modules()
        if SUPPORT not in p.parents
        and not p.name.startswith("test_")
        and p.name not in ("conftest.py", "__init__.py")
    ]
    assert not stray, f"helper modules outside tests/support/: {stray}"


def imported(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            names.append("." * node.level + (node.module or ""))
    return names


def test_tests_import_helpers_from_support_only() -> None:
    """Nothing under tests/ but ``support`` is imported: not ``test_x``, not ``tests.unit.x``,
    not a relative import outside ``tests/support/``."""
    local = {p.stem for p in modules() if SUPPORT not in p.parents} | {
        "tests",
        "unit",
        "e2e",
        "integration",
    }
    bad = []
    for path in modules():
        for name in imported(ast.parse(path.read_text(encoding="utf-8"))):
            top = name.split(".")[0]
            relative = name.startswith(".") and SUPPORT not in path.parents
            if top in local or relative or name.startswith("tests."):
                bad.append(f"{path.relative_to(TESTS)}: {name}")
    assert not bad, "import helpers as support.<module>:\n" + "\n".join(bad)
