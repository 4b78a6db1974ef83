"""The house-service contract has one home (issue 38): no house procedure name, the house
realm's name, nor a refusal name is written as a string literal in ``macula/``, ``relay/`` or
``tools/`` outside ``macula/services/``; everyone else imports the constant. Docstrings and
comments may name them (they are read, not compared); ``ast`` tells them apart."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from macula.services import house, refusals

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
SERVICES = ROOT / "macula" / "services"
PACKAGES = ("macula", "relay", "tools")

HOUSE_NAMES = frozenset(house.HOUSE_PROCEDURES | {house.HOUSE_REALM_NAME})
REFUSAL_NAMES = frozenset(
    value for key, value in vars(refusals).items() if key.isupper() and isinstance(value, str)
)

# Known exception, to remove: none left (the relay core's modules take every refusal name from
# ``macula.services.refusals`` since issue 38). Keyed by file name, so an entry would survive a
# module's move into a package.
RELAY_CORE_LITERALS: dict[str, frozenset[str]] = {}

# The same word naming another counter, not a station's refusal: not this rule's concern.
HOMONYMS: frozenset[tuple[str, str]] = frozenset(
    {
        (
            "macula/client/core.py",
            "bad_publisher_sig",
        ),  # an EVENT the client drops (Session.dropped)
        (
            "macula/services/dht.py",
            "foreign_signer",
        ),  # a DHT record the client skips (DhtClient.stats)
        ("relay/house/history.py", "bad_publisher_sig"),  # a PUBLISH the room history does not keep
    }
)


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not path.is_relative_to(SERVICES):
                yield path


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of ``tree`` (module, classes, functions)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def literals(path: Path, names: frozenset[str]) -> Iterator[tuple[int, str]]:
    """Each string constant in ``path`` (docstrings aside) that is one of ``names``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = docstrings(tree)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in names
            and id(node) not in skip
        ):
            yield node.lineno, node.value


def where(path: Path, line: int, value: str) -> str:
    return f"{path.relative_to(ROOT).as_posix()}:{line}: {value!r}"


def test_the_contract_holds_the_names_it_is_checked_for() -> None:
    assert "macula.memory.query_v1" in HOUSE_NAMES
    assert {"foreign_publish", "publish_rate_limited", "advertise_taken"} <= REFUSAL_NAMES
    assert set(refusals.MEANING) <= REFUSAL_NAMES


def test_no_house_procedure_name_is_written_outside_macula_services() -> None:
    found = [where(p, line, v) for p in sources() for line, v in literals(p, HOUSE_NAMES)]
    assert found == [], "import it from macula.services.house:\n" + "\n".join(found)


def test_no_refusal_name_is_written_outside_macula_services() -> None:
    found = [
        where(path, line, value)
        for path in sources()
        for line, value in literals(path, REFUSAL_NAMES)
        if value not in RELAY_CORE_LITERALS.get(path.name, frozenset())
        and (path.relative_to(ROOT).as_posix(), value) not in HOMONYMS
    ]
    assert found == [], "import it from macula.services.refusals:\n" + "\n".join(found)


def test_the_checker_sees_literals_and_passes_docstrings_and_comments(tmp_path: Path) -> None:
    module = tmp_path / "sample.py"
    module.write_text(
        '"""Names advertise_taken in prose."""\n'
        "def f() -> str:\n"
        '    """Returns macula.memory.query_v1."""\n'
        "    # advertise_taken\n"
        '    return "advertise_taken" + f"{1}foreign_publish"\n',
        encoding="utf-8",
    )
    seen = list(literals(module, REFUSAL_NAMES))  # an f-string's text parts too
    assert seen == [(5, "advertise_taken"), (5, "foreign_publish")]
    assert list(literals(module, HOUSE_NAMES)) == []
