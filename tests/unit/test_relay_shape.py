"""The router core's shape (issue 23): small modules, short functions, hooks through the
constructor.

``relay/core/router.py`` and the modules split out of it stay under ``MAX_MODULE_LINES`` lines and
no
function in them has more than ``MAX_FUNCTION_LINES`` lines of its own (a nested function's
lines are its own, not its parent's). Nothing assigns into a ``RouterCore`` (or a part of one)
after it is built: its hooks are constructor parameters.
"""

from __future__ import annotations

import ast

import pytest

from support.paths import REPO as ROOT

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
CORE_MODULES = (
    "relay/core/router.py",
    "relay/core/calls.py",
    "relay/core/connects.py",
    "relay/core/streams.py",
    "relay/realms/routing.py",
    "relay/federation/content_hops.py",
    "relay/station/realm_files.py",
)
# where a RouterCore is built and kept: the station's shell and the tests' in-memory mesh; and
# where it is reloaded (``RouterCore.reconfigure``, never an assignment into the core)
CORE_HOLDERS = (
    "relay/ops/reload.py",
    "relay/station/station.py",
    "relay/station/build.py",
    "relay/ops/cli.py",
    "tests/support/stationmesh.py",
)
CORE_NAMES = frozenset({"_core", "core", "router"})

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
Function = ast.FunctionDef | ast.AsyncFunctionDef


def span(node: ast.stmt) -> int:
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def own_lines(node: Function) -> int:
    """The lines of ``node`` less those of the functions and classes nested in it."""
    total = span(node)
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        if isinstance(child, (*FUNCTIONS, ast.ClassDef)):
            total -= span(child)  # its own children are in its span: not walked
        else:
            stack.extend(ast.iter_child_nodes(child))
    return total


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    tree = ast.parse(source)
    return [
        (node.name, own_lines(node))
        for node in ast.walk(tree)
        if isinstance(node, FUNCTIONS) and own_lines(node) > limit
    ]


def test_own_lines_leaves_out_nested_functions() -> None:
    inner = "\n".join(f"        x{i} = {i}" for i in range(10))
    source = f"def outer():\n    y = 1\n    def inner():\n{inner}\n    return inner\n"
    tree = ast.parse(source)
    outer = tree.body[0]
    assert isinstance(outer, ast.FunctionDef)
    assert own_lines(outer) == 3  # def, y = 1, return
    assert long_functions(source, 10) == [("inner", 11)]
    assert long_functions(source, 11) == []


@pytest.mark.parametrize("path", CORE_MODULES)
def test_core_modules_are_small(path: str) -> None:
    source = (ROOT / path).read_text("utf-8")
    assert len(source.splitlines()) < MAX_MODULE_LINES, f"{path} is too long"
    assert long_functions(source, MAX_FUNCTION_LINES) == [], f"{path} has long functions"


def assigned_into_a_core(source: str) -> list[str]:
    """``x._core.a = ...``, ``core.a = ...``, ``router.a.b = ...``: a part of a core set from
    outside (``self.core = RouterCore(...)`` itself is fine)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            chain: list[str] = []
            while isinstance(target, ast.Attribute):
                chain.append(target.attr)
                target = target.value
            # chain is outermost-first: a.b.c = ... -> ["c", "b"], and target is the Name "a"
            into_part = len(chain) >= 2 and chain[-1] in CORE_NAMES  # x._core.a = ...
            into_core = bool(chain) and isinstance(target, ast.Name) and target.id in CORE_NAMES
            if into_part or into_core:
                found.append(ast.unparse(node).splitlines()[0])
    return found


def test_assigned_into_a_core_sees_both_shapes() -> None:
    assert assigned_into_a_core("self._core.interest.published = f\n") != []
    assert assigned_into_a_core("core.frames.endorsements = []\n") != []
    assert assigned_into_a_core("router.stopping = True\n") != []
    assert assigned_into_a_core("x.router.interest.published = f\n") != []
    assert assigned_into_a_core("self._core = RouterCore(a)\nself.core_x.y = 1\n") == []


@pytest.mark.parametrize("path", CORE_HOLDERS)
def test_nothing_assigns_into_a_built_core(path: str) -> None:
    assert assigned_into_a_core((ROOT / path).read_text("utf-8")) == []


# the station's shell and its command line (issue 23): small, short functions, no fixed sleeps
SHELL_MODULES = (
    "relay/station/station.py",
    "relay/station/build.py",
    "relay/station/links.py",
    "relay/station/upkeep.py",
    "relay/station/waits.py",
    "relay/station/mesh.py",
    "relay/station/group.py",
    "relay/station/drain.py",
    "relay/builtins/calls.py",
    "relay/ops/cli.py",
    "relay/ops/options.py",
)


@pytest.mark.parametrize("path", SHELL_MODULES)
def test_shell_modules_are_small(path: str) -> None:
    source = (ROOT / path).read_text("utf-8")
    assert len(source.splitlines()) < MAX_MODULE_LINES, f"{path} is too long"
    assert long_functions(source, MAX_FUNCTION_LINES) == [], f"{path} has long functions"


def test_the_station_shell_neither_sleeps_nor_reaches_into_quic() -> None:
    source = (ROOT / "relay/station/station.py").read_text("utf-8")
    drain = (ROOT / "relay/station/drain.py").read_text("utf-8")
    assert (
        "sleep(" not in source + drain
    )  # draining waits on a condition, the ticker lives elsewhere
    assert "._quic" not in source  # the transport's public methods only
    # which procedure is answered how is relay.builtins.calls' business, not the shell's
    assert "_realm.present" not in source and "_relay.ping" not in source


def described_or_handed(source: str) -> list[str]:
    """A ``Protocol`` class, an import of ``relay.station.station`` (the ``Station`` itself), or a
    name ``Station`` used: what describes the station to one of its own parts (issue 38)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(base) for base in node.bases]
            found += [f"class {node.name}({b})" for b in bases if b.endswith("Protocol")]
        elif isinstance(node, ast.ImportFrom) and node.module == "relay.station.station":
            found.append(f"from relay.station.station import {node.names[0].name}")
        elif isinstance(node, ast.Name) and node.id in ("Station", "StationParts"):
            found.append(node.id)
    return found


def test_described_or_handed_sees_each_shape() -> None:
    assert described_or_handed("class Shell(Protocol):\n    x: int\n") != []
    assert described_or_handed("class Shell(typing.Protocol):\n    x: int\n") != []
    assert described_or_handed("from relay.station.station import Station\n") != []
    assert described_or_handed("def f(s: 'x') -> None:\n    Station(s)\n") != []
    assert described_or_handed("from relay.station.config import StationConfig\n") == []


@pytest.mark.parametrize("path", [m for m in SHELL_MODULES if m.startswith("relay/station_")])
def test_no_part_of_the_station_is_given_the_station(path: str) -> None:
    """Each part is made with the parts it uses (issue 38): no Protocol describing the
    station, no import of it, no base class of accessors (``StationParts``)."""
    assert described_or_handed((ROOT / path).read_text("utf-8")) == []
    assert not (ROOT / "relay/station_parts.py").exists()
