"""``macula-mcp a2a-agent list|add|remove``: the owner edits the A2A allowlist (``[a2a]`` of
``$MACULA_HOME/owner.toml``) without opening the file.

Invariants:
- Only the ``[a2a]`` table's text is replaced; everything else in the file stays byte for byte.
  The result is parsed again before it is written: if the rest of the file would read
  differently (``[a2a]`` written as dotted keys, an inline table...), nothing is written and the
  owner is told to edit by hand.
- A malformed allowlist is never edited (its error is printed, exit 2); the file is written
  0600 through a temporary file and a rename; the home is made 0700 if missing. An edit holds
  the owner file's lock (``tools.owner.store.editing``) from reading to renaming, as the
  switches' editors do, so two editors at once keep each other's change.
- The model has no tool for this: it is the owner's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

from tools.a2a.allowlist import (
    MAX_AGENTS,
    NAME_PREFIX,
    TABLE,
    Agent,
    AllowlistError,
    load,
    normalise,
    owner_file,
)
from tools.commands import parser_for
from tools.owner.store import editing
from tools.settings import home_dir


def main(argv: Sequence[str]) -> None:
    parser = parser_for("a2a-agent")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("list", help="the A2A agents a mesh agent may hand tasks to")
    add = sub.add_parser("add", help="allow one (its base URL or Agent Card URL)")
    add.add_argument("url")
    add.add_argument("--name", help="a short name: mesh_task_send(to='a2a:NAME')")
    remove = sub.add_parser("remove", help="stop allowing one (URL or a2a:NAME)")
    remove.add_argument("url")
    args = parser.parse_args(list(argv))
    home = home_dir(os.environ)
    if args.action == "list":
        _act(args, home)
        return
    with editing(owner_file(home)):  # read to rename: another editor's change is kept
        _act(args, home)


def _act(args: argparse.Namespace, home: Path) -> None:
    try:
        agents = list(load(home).agents)
    except AllowlistError as exc:
        print(
            f"{exc}\nfix it by hand first: nothing is dialled while it is malformed",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    if args.action == "list":
        for agent in agents:
            print(agent.url if agent.name is None else f"{agent.url}  ({NAME_PREFIX}{agent.name})")
        if not agents:
            print(f"no A2A agents allowed ({owner_file(home)}, table [{TABLE}])")
        return
    if args.action == "add":
        agents = _added(agents, args.url, args.name)
    else:
        agents = _removed(agents, args.url)
    try:
        write(home, agents)
    except AllowlistError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
    print(f"{owner_file(home)}: {len(agents)} A2A agent(s) allowed")


def _added(agents: list[Agent], url: str, name: str | None) -> list[Agent]:
    from tools.a2a.allowlist import parse

    entry: object = url if name is None else {"url": url, "name": name}
    try:
        normalise(url)
        [agent] = parse({"agents": [entry]}, Path("--name"))
    except ValueError as exc:
        raise SystemExit(f"macula-mcp a2a-agent add: {url}: {exc}") from None
    except AllowlistError as exc:
        raise SystemExit(f"macula-mcp a2a-agent add: {exc}") from None
    if any(a.url == agent.url for a in agents):
        raise SystemExit(f"{agent.url} is already allowed")
    if agent.name is not None and any(a.name == agent.name for a in agents):
        raise SystemExit(f"the name {agent.name!r} is taken")
    if len(agents) >= MAX_AGENTS:
        raise SystemExit(f"at most {MAX_AGENTS} A2A agents")
    return [*agents, agent]


def _removed(agents: list[Agent], to: str) -> list[Agent]:
    from tools.a2a.allowlist import Allowlist

    found = Allowlist(Path(), tuple(agents)).find(to)
    if found is None:
        raise SystemExit(f"{to} is not allowed (macula-mcp a2a-agent list)")
    return [a for a in agents if a is not found]


def table_text(agents: Sequence[Agent]) -> str:
    lines = [f"[{TABLE}]", "agents = ["]
    for agent in agents:
        url = json.dumps(agent.url)  # a TOML basic string is a JSON string for these URLs
        lines.append(
            f"  {url},"
            if agent.name is None
            else f"  {{ url = {url}, name = {json.dumps(agent.name)} }},"
        )
    return "\n".join([*lines, "]"]) + "\n"


def replaced(text: str, agents: Sequence[Agent]) -> str:
    """``text`` with its ``[a2a]`` table (or none) replaced by one allowing ``agents``."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _header(line) == TABLE), None)
    if start is None:
        prefix = text if not text or text.endswith("\n") else text + "\n"
        return prefix + ("\n" if prefix else "") + table_text(agents)
    end = start + 1
    while end < len(lines) and (_header(lines[end]) is None or _header(lines[end]) == ""):
        end += 1
    return "".join(lines[:start]) + table_text(agents) + "".join(lines[end:])


def _header(line: str) -> str | None:
    """The table a ``[name]`` or ``[[name]]`` line opens (None: not a header line)."""
    stripped = line.split("#", 1)[0].strip()
    if not stripped.startswith("[") or not stripped.endswith("]"):
        return None
    return stripped.strip("[]").strip()


def write(home: Path, agents: Sequence[Agent]) -> None:
    path = owner_file(home)
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    new = replaced(old, agents)
    try:
        before, after = tomllib.loads(old), tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        raise AllowlistError(f"{path}: cannot edit it ({exc}); edit it by hand") from None
    before.pop(TABLE, None)
    wanted = [a.url if a.name is None else {"url": a.url, "name": a.name} for a in agents]
    if after.pop(TABLE, None) != {"agents": wanted} or before != after:
        raise AllowlistError(f"{path}: [{TABLE}] is not a plain table here; edit it by hand")
    if not home.exists():
        home.mkdir(mode=0o700, parents=True)
    fd, temporary = tempfile.mkstemp(dir=home, prefix=".owner.", suffix=".toml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(new)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
