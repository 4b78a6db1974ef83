"""The owner's capability switches: ``$MACULA_HOME/owner.toml`` read, checked and applied (pure).

The file (TOML; written by ``tools.owner.store``, 0600):

    preset = "talk"              # full (default) | talk | read-only
    [groups]                     # a group of tools (tools.owner.presets.GROUP_TOOLS) on or off
    rpc = 0
    [tools]                      # one tool on or off
    mesh_recall = 1
    [agents.alice]               # the same keys, for the agent named alice (MACULA_MCP_AGENT)
    preset = "read-only"
    [agents.alice.tools]
    mesh_say = 1

Invariants:
- what decides a tool, later wins: the preset, then ``[groups]``, then ``[tools]``; then, for
  the session's agent, its table: its ``preset`` (when given) starts over from that preset
  (the home's groups and tools no longer count), then its ``[groups]``, then its ``[tools]``.
  The key that decided each tool is kept: it is the switch a refusal names;
- a malformed file (TOML syntax, an unknown key, a value that is not 0 or 1, a preset that does
  not exist, an unreadable file) turns every switchable tool off and is one ``Problem`` naming
  the file, the line (0: not known) and the key. Nothing here ever fails open;
- tables named ``approvals`` and ``a2a`` (top level or in an agent's table) belong to other
  features: passed through unchecked, and kept on write;
- no file is ``full``: today's behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import tomlkit
from tomlkit.exceptions import ParseError, TOMLKitError

from tools.owner.presets import ALL_TOOLS, DEFAULT_PRESET, GROUP_TOOLS, PRESETS, TOOL_GROUP

FILE_NAME: Final = "owner.toml"
PASSED_THROUGH: Final = frozenset({"approvals", "a2a"})  # other features' tables
SWITCH_KINDS: Final = ("groups", "tools")
AGENT_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
MALFORMED_SWITCH: Final = "owner.toml (malformed)"


@dataclass(frozen=True, slots=True)
class Problem:
    """Why the file cannot be used: every switchable tool is off until it is fixed."""

    file: str
    line: int  # 1-based; 0 when not known
    key: str
    message: str

    def text(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = f" key {self.key}:" if self.key else ""
        return f"{where}:{key} {self.message}"

    def view(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "key": self.key, "message": self.message}


@dataclass(frozen=True, slots=True)
class Layer:
    """One table's switches: the home's, or one agent's."""

    preset: str | None = None
    groups: Mapping[str, int] = field(default_factory=dict)
    tools: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Policy:
    home: Layer = field(default_factory=Layer)
    agents: Mapping[str, Layer] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Switches:
    """The effective switches of one session: each tool on (1) or off (0), and the key that
    decided it."""

    on: Mapping[str, int]
    decided_by: Mapping[str, str]
    preset: str
    agent: str | None = None
    problem: Problem | None = None

    def allows(self, tool: str) -> bool:
        """A tool outside the table (none today: a test keeps the table whole) is on only
        under a clean ``full``."""
        if tool in self.on:
            return bool(self.on[tool])
        return self.problem is None and self.preset == "full"

    def switch_of(self, tool: str) -> str:
        return self.decided_by.get(tool, MALFORMED_SWITCH if self.problem else self.preset)

    def view(self) -> dict[str, Any]:
        """For ``mesh://policy``, ``owner show`` and the console."""
        off = sorted(t for t, v in self.on.items() if not v)
        return {
            "preset": self.preset,
            "agent": self.agent,
            "malformed": 0 if self.problem is None else 1,
            "problem": None if self.problem is None else self.problem.view(),
            "on": sorted(t for t, v in self.on.items() if v),
            "off": {t: self.decided_by[t] for t in off},
            "groups": {
                g: sum(self.on.get(t, 0) for t in tools) for g, tools in GROUP_TOOLS.items()
            },
        }


def line_of(text: str, path: tuple[str, ...]) -> int:
    """The 1-based line that defines ``path`` (a table header or a key in one), 0 if not
    found (an inline table, say); falls back to the nearest enclosing table's header."""
    best = 0
    header: tuple[str, ...] = ()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line.startswith("[") and not line.startswith("[["):
            header = _parts(line.strip("[] \t"))
            if header == path:
                return number
            if path[: len(header)] == header and header:
                best = number
        elif "=" in line and header + _parts(line.split("=", 1)[0]) == path:
            return number
    return best


def _repeated_line(text: str, key: str) -> int:
    """The line of the second definition of ``key`` (0: not found)."""
    seen = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        head = line.strip("[] \t") if line.startswith("[") else line.split("=", 1)[0]
        if key and ("=" in line or line.startswith("[")) and _parts(head)[-1:] == (key,):
            seen += 1
            if seen == 2:
                return number
    return 0


def _parts(dotted: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in dotted.split("."))


def parse(text: str, file: str) -> Policy | Problem:
    """The policy in ``text`` (the contents of ``file``), or the first thing wrong with it."""
    try:
        document = tomlkit.parse(text).unwrap()
    except ParseError as exc:
        line = exc.line
        lines = text.splitlines()
        said = lines[line - 1] if 0 < line <= len(lines) else ""
        key = said.split("=", 1)[0].strip().strip("[]") if "=" in said or "[" in said else ""
        return Problem(file, line, key, f"not valid TOML: {exc}")
    except TOMLKitError as exc:  # a key given twice in one table: no line from tomlkit
        named = re.search(r'Key "([^"]+)" already exists', str(exc))
        key = named.group(1) if named else ""
        return Problem(file, _repeated_line(text, key), key, f"not valid TOML: {exc}")
    try:
        return _policy(document)
    except _Bad as bad:
        return Problem(file, line_of(text, bad.path), ".".join(bad.path), bad.message)


class _Bad(Exception):
    def __init__(self, path: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.path, self.message = path, message


def _policy(document: Mapping[str, Any]) -> Policy:
    agents: dict[str, Layer] = {}
    home = _layer(document, (), allow_agents=True)
    raw_agents = document.get("agents", {})
    if not isinstance(raw_agents, dict):
        raise _Bad(("agents",), "must be a table of [agents.NAME] tables")
    for name, table in raw_agents.items():
        where = ("agents", name)
        if not AGENT_NAME.fullmatch(name):
            raise _Bad(where, "an agent name is 1-64 letters, digits, '-' or '_'")
        if not isinstance(table, dict):
            raise _Bad(where, "must be a table ([agents.NAME])")
        agents[name] = _layer(table, where, allow_agents=False)
    return Policy(home, agents)


def _layer(table: Mapping[str, Any], where: tuple[str, ...], allow_agents: bool) -> Layer:
    known = {"preset", *SWITCH_KINDS, *PASSED_THROUGH} | ({"agents"} if allow_agents else set())
    for key in table:
        if key not in known:
            raise _Bad((*where, key), f"unknown key (known: {', '.join(sorted(known))})")
    preset = table.get("preset")
    if preset is not None and (not isinstance(preset, str) or preset not in PRESETS):
        raise _Bad((*where, "preset"), f"must be one of {', '.join(PRESETS)}")
    groups = _switches(table, where, "groups", frozenset(GROUP_TOOLS))
    tools = _switches(table, where, "tools", ALL_TOOLS)
    return Layer(preset, groups, tools)


def _switches(
    table: Mapping[str, Any], where: tuple[str, ...], kind: str, names: frozenset[str]
) -> dict[str, int]:
    raw = table.get(kind, {})
    if not isinstance(raw, dict):
        raise _Bad((*where, kind), f"must be a table ([{kind}]) of names = 0 or 1")
    out: dict[str, int] = {}
    for name, value in raw.items():
        if name not in names:
            raise _Bad((*where, kind, name), f"no such {kind[:-1]}")
        if isinstance(value, bool) or value not in (0, 1):
            raise _Bad((*where, kind, name), f"must be 0 (off) or 1 (on), not {value!r}")
        out[name] = int(value)
    return out


def effective(found: Policy | Problem | None, agent: str | None = None) -> Switches:
    """The switches of a session of ``agent`` (None: no agent name; the home's alone) under
    ``found`` (None: no file)."""
    if isinstance(found, Problem):
        return Switches(
            {t: 0 for t in ALL_TOOLS}, {t: MALFORMED_SWITCH for t in ALL_TOOLS},
            "malformed", agent, found,
        )  # fmt: skip
    policy = found or Policy()
    on: dict[str, int] = {}
    why: dict[str, str] = {}
    own = policy.agents.get(agent) if agent else None
    layers: list[tuple[str, Layer]] = [("", policy.home)]
    if own is not None:
        if own.preset is not None:
            layers = []  # the agent's preset starts over
        layers.append((f"agents.{agent}.", own))
    preset = policy.home.preset or DEFAULT_PRESET
    base = f"preset {preset}"
    if own is not None and own.preset is not None:
        preset, base = own.preset, f"agents.{agent}.preset {own.preset}"
    for tool in ALL_TOOLS:
        on[tool], why[tool] = int(tool in PRESETS[preset]), base
    for prefix, layer in layers:
        for group, value in layer.groups.items():
            for tool in GROUP_TOOLS[group]:
                on[tool], why[tool] = value, f"{prefix}groups.{group}"
        for tool, value in layer.tools.items():
            on[tool], why[tool] = value, f"{prefix}tools.{tool}"
    return Switches(on, why, preset, agent)


def group_of(tool: str) -> str | None:
    return TOOL_GROUP.get(tool)
