"""The house's layout (issue 38): a folder is a concern, not a prefix.

- No package folder of ``macula/``, ``relay/`` or ``tools/`` holds more than 20 modules directly
  (STYLE.md: a folder a reader takes in at a glance).
- No family of modules shares a name prefix in one folder (``station_*``, ``daemon_*``): four
  or more with one prefix are a package waiting to be made.
- Every folder holding Python modules is a package (``__init__.py`` with a docstring that says
  what lives there).
- The unit tests mirror the packages: a unit test sits in ``tests/unit/`` itself only when it
  checks the whole tree, else in the folder of the package it tests, which must exist.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from support.paths import REPO

LAYERS = ("macula", "relay", "tools")
MAX_MODULES = 20
MAX_PREFIX_FAMILY = 3
WHOLE_TREE_TESTS = {  # tests/unit/*.py: checks of the whole tree or of scripts/
    "test_code_shape.py",
    "test_relay_shape.py",
    "test_contract_shape.py",
    "test_settings_shape.py",
    "test_tests_shape.py",
    "test_package_shape.py",
    "test_import_cycles.py",
    "test_project.py",
    "test_bench_scripts.py",
    "test_bench_attach.py",
    "test_cli_help.py",
    "test_sim_federation.py",
}


def folders() -> list[Path]:
    found = {
        path.parent
        for layer in LAYERS
        for path in (REPO / layer).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    return sorted(found)


def modules_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")


def name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def prefix_families(folder: Path) -> dict[str, list[str]]:
    prefixes = Counter(p.stem.split("_")[0] for p in modules_in(folder) if "_" in p.stem)
    return {
        prefix: [p.stem for p in modules_in(folder) if p.stem.split("_")[0] == prefix]
        for prefix, count in prefixes.items()
        if count > MAX_PREFIX_FAMILY
    }


@pytest.mark.parametrize("folder", folders(), ids=name)
def test_no_package_holds_more_than_20_modules(folder: Path) -> None:
    assert len(modules_in(folder)) <= MAX_MODULES, [p.name for p in modules_in(folder)]


@pytest.mark.parametrize("folder", folders(), ids=name)
def test_no_prefix_stands_in_for_a_package(folder: Path) -> None:
    assert prefix_families(folder) == {}


@pytest.mark.parametrize("folder", folders(), ids=name)
def test_every_folder_is_a_package_that_says_what_it_holds(folder: Path) -> None:
    init = folder / "__init__.py"
    assert init.is_file(), f"{name(folder)} has modules but no __init__.py"
    if folder.name not in LAYERS:  # the three layers are described in the README
        assert ast.get_docstring(ast.parse(init.read_text())), f"{name(init)}: no docstring"


def test_unit_tests_mirror_the_packages() -> None:
    unit = REPO / "tests" / "unit"
    misplaced = [name(p) for p in unit.glob("test_*.py") if p.name not in WHOLE_TREE_TESTS]
    assert misplaced == [], "move them to tests/unit/<layer>/<package>/"
    packages = {name(f) for f in folders()}
    orphans = [
        name(folder)
        for folder in sorted({p.parent for p in unit.rglob("test_*.py")} - {unit})
        if folder.relative_to(unit).as_posix() not in packages
    ]
    assert orphans == [], "a unit test folder names no package"


def test_the_checks_see_what_they_are_for(tmp_path: Path) -> None:
    for stem in ("station_a", "station_b", "station_c", "station_d", "store", "cli"):
        (tmp_path / f"{stem}.py").write_text("")
    assert list(prefix_families(tmp_path)) == ["station"]
    for i in range(MAX_MODULES + 1):
        (tmp_path / f"m{i}.py").write_text("")
    assert len(modules_in(tmp_path)) > MAX_MODULES
    assert name(REPO / "relay" / "core") in {name(f) for f in folders()}
