"""Reading and editing ``$MACULA_HOME/owner.toml``: the owner's hand (CLI, console), never a tool.

Invariants:
- written whole (``macula.private_file.write_private``: a temporary file, fsync, rename): a
  reader sees the old file or the new one; the file is 0600 and a missing home 0700;
- edited with tomlkit, so comments, order and the tables of other features (``approvals``,
  ``a2a``) are kept byte for byte;
- a change is checked before it is written: an unknown name, a value other than 0/1, a preset
  that does not exist, or a file that is not TOML (fix it by hand: nothing guesses) is an
  ``OwnerFileError`` and nothing is written;
- every write is said to ``policy_changed_event`` (the audit trail), with digests, never
  contents;
- an edit holds ``editing``'s lock from reading the file to renaming the new one, so concurrent
  editors (CLI, console, ``a2a-agent``) never lose each other's change.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import tomlkit
from tomlkit.exceptions import TOMLKitError

from macula.private_file import write_private
from tools.owner.events import policy_changed_event
from tools.owner.policy import (
    AGENT_NAME,
    FILE_NAME,
    Policy,
    Problem,
    Switches,
    effective,
    parse,
)
from tools.owner.presets import ALL_TOOLS, GROUP_TOOLS, PRESETS

MAX_FILE_BYTES = 1 << 20  # a larger owner.toml is malformed, not read whole
LOCK_NAME: Final = ".owner.toml.lock"  # beside owner.toml: the edit lock (``editing``)


class OwnerFileError(Exception):
    """A change the owner asked for cannot be made; the message says why and what to do."""


def policy_path(home: Path) -> Path:
    return home / FILE_NAME


@dataclass(frozen=True, slots=True)
class Loaded:
    """What the file held when read: its bytes (None: no file) and what they mean."""

    data: bytes | None
    found: Policy | Problem | None

    def switches(self, agent: str | None) -> Switches:
        return effective(self.found, agent)


def load(path: Path) -> Loaded:
    """The file at ``path``; an unreadable or oversized one is a ``Problem`` (fails closed)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return Loaded(None, None)
    except OSError as exc:
        return Loaded(b"", Problem(str(path), 0, "", f"cannot be read: {exc.strerror or exc}"))
    if len(data) > MAX_FILE_BYTES:
        return Loaded(data, Problem(str(path), 0, "", f"larger than {MAX_FILE_BYTES} bytes"))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Loaded(data, Problem(str(path), 0, "", f"not UTF-8: {exc}"))
    return Loaded(data, parse(text, str(path)))


def digest(data: bytes | None) -> str:
    return "" if data is None else hashlib.sha256(data).hexdigest()[:16]


@contextlib.contextmanager
def editing(path: Path) -> Iterator[None]:
    """Hold the owner file's edit lock (``flock`` on a 0600 sibling) from read to rename: two
    writers at once (the CLI, the console, ``a2a-agent``) each keep the other's change."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path.with_name(LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _document(path: Path) -> tuple[bytes | None, Any]:
    loaded = load(path)
    if loaded.data is None:
        return None, tomlkit.document()
    if isinstance(loaded.found, Problem) and loaded.found.message.startswith(
        ("not valid TOML", "cannot be read", "larger than", "not UTF-8")
    ):
        raise OwnerFileError(
            f"{loaded.found.text()}: fix the file by hand first (nothing is changed)"
        )
    try:
        return loaded.data, tomlkit.parse(loaded.data.decode("utf-8"))
    except TOMLKitError as exc:  # checked above; kept for safety
        raise OwnerFileError(f"{path}: not valid TOML: {exc}") from None


def _table(document: Any, agent: str | None) -> Any:
    """The home's table, or agent ``agent``'s (made when missing)."""
    if agent is None:
        return document
    if not AGENT_NAME.fullmatch(agent):
        raise OwnerFileError(f"--agent {agent!r}: 1-64 letters, digits, '-' or '_'")
    agents = document.get("agents")
    if agents is None:
        agents = tomlkit.table(is_super_table=True)
        document["agents"] = agents
    mine = agents.get(agent)
    if mine is None:
        mine = tomlkit.table()
        agents[agent] = mine
    return mine


def _write(
    path: Path, before: bytes | None, document: Any, agent: str | None, change: str, by: str
) -> Switches:
    text = tomlkit.dumps(document)
    found = parse(text, str(path))
    after = text.encode("utf-8")
    write_private(path, after)
    policy_changed_event(
        by=by, path=str(path), agent=agent, change=change,
        before=digest(before), after=digest(after),
    )  # fmt: skip
    return effective(found, agent)


def set_switch(
    path: Path, name: str, value: int, agent: str | None = None, by: str = "cli"
) -> Switches:
    """Turn the group or tool ``name`` on (1) or off (0), for the home or for ``agent``."""
    if value not in (0, 1) or isinstance(value, bool):
        raise OwnerFileError(f"{name}: the value is 0 (off) or 1 (on)")
    if name in GROUP_TOOLS:
        kind = "groups"
    elif name in ALL_TOOLS:
        kind = "tools"
    else:
        raise OwnerFileError(
            f"{name}: no such tool or group (groups: {', '.join(GROUP_TOOLS)}; tools: "
            "`macula-mcp owner show`)"
        )
    with editing(path):
        before, document = _document(path)
        table = _table(document, agent)
        switches = table.get(kind)
        if switches is None:
            switches = tomlkit.table()
            table[kind] = switches
        switches[name] = value
        return _write(path, before, document, agent, f"{kind}.{name}={value}", by)


def set_preset(path: Path, preset: str, agent: str | None = None, by: str = "cli") -> Switches:
    """Choose ``preset`` for the home or for ``agent``; the switches of that table are cleared
    (a preset is a fresh start; the other features' tables are kept)."""
    if preset not in PRESETS:
        raise OwnerFileError(f"{preset}: no such preset (presets: {', '.join(PRESETS)})")
    with editing(path):
        before, document = _document(path)
        table = _table(document, agent)
        table["preset"] = preset
        for kind in ("groups", "tools"):
            if kind in table:
                del table[kind]
        return _write(path, before, document, agent, f"preset {preset}", by)
