"""Contact policy: who may ring this agent, read from a small JSON file on every ring.

File: ``{"contact_policy": "open"|"ask"|"allowlist"|"closed" or 1..4, "allowlist": [64-hex],
"offers": [str]}``; 1 = open, 2 = ask, 3 = allowlist, 4 = closed (the seed README's order).

Invariants:
- ``load_policy`` never raises: a missing file is ``ask`` with no error; an unreadable or
  malformed file is ``ask`` with *every* problem in ``PolicyState.error``, so a typo never makes
  an agent silently unringable or silently open. Valid allowlist entries of a malformed file
  are kept (they can only turn a deferral into an acceptance for a node the operator listed).
- The ``MACULA_MCP_CONTACT_POLICY`` override (passed in) replaces the mode for this process,
  even over a malformed file; an invalid override is reported and means ``closed`` (fails
  closed: the person meant to choose, so neither open nor a silent ``ask``).
- ``decide`` is pure. The allowlist holds node ids only (lowercase hex), never petnames.
- ``trust`` adds one node id (no duplicates) and flips an unset or ``ask`` mode to
  ``allowlist``; ``open`` and ``closed`` stay. ``untrust`` never touches the mode. Both keep
  every other key of the file, refuse to rewrite a file they cannot parse (``PolicyFileError``),
  and write atomically: temporary file, fsync, rename; file 0600, new directory 0700.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Final

from macula.config import CONTACT_POLICY_ENV, CONTACT_POLICY_FILE_ENV
from macula.errors import MaculaError

ENV_OVERRIDE: Final = CONTACT_POLICY_ENV
ENV_FILE: Final = CONTACT_POLICY_FILE_ENV
MAX_FILE_BYTES: Final = 1 << 20

_HEX64: Final = re.compile(r"[0-9a-fA-F]{64}")


class Mode(IntEnum):
    OPEN = 1
    ASK = 2
    ALLOWLIST = 3
    CLOSED = 4

    @property
    def label(self) -> str:
        return self.name.lower()


class Answer(IntEnum):
    """The answer to a ring, as it travels: 1 accepted, 2 declined, 3 deferred."""

    ACCEPTED = 1
    DECLINED = 2
    DEFERRED = 3


class PolicyFileError(MaculaError):
    """``trust``/``untrust`` will not rewrite a policy file they cannot parse; says why."""


@dataclass(frozen=True, slots=True)
class PolicyState:
    """The policy in force for one decision.

    ``mode`` is what ``decide`` uses; ``file_mode`` is the file's own valid ``contact_policy``
    (None when unset, invalid or unreadable), even if a problem elsewhere forced ``ask``;
    ``mode_source`` is ``"file"``, ``"default"``, ``"override"`` or ``"invalid_override"``
    (then ``closed``); ``error`` joins
    every problem found (file and override), or is None.
    """

    mode: Mode
    allowlist: tuple[str, ...] = ()
    offers: tuple[str, ...] = ()
    error: str | None = None
    file_mode: Mode | None = None
    mode_source: str = "default"

    def allows(self, node_id: bytes) -> bool:
        return node_id.hex() in self.allowlist


@dataclass(frozen=True, slots=True)
class Decision:
    answer: Answer
    reason: str | None = None


def parse_mode(value: object) -> Mode | None:
    """A mode from a file value: one of the four names or the int 1..4 (never a bool)."""
    if type(value) is int and 1 <= value <= 4:
        return Mode(value)
    if type(value) is str:
        for mode in Mode:
            if value == mode.label:
                return mode
    return None


def parse_override(value: str) -> Mode | None:
    """A mode from the environment: a name (any case) or ``1``..``4``, blanks ignored."""
    text = value.strip().lower()
    if text in {"1", "2", "3", "4"}:
        return Mode(int(text))
    return parse_mode(text)


# -- reading ------------------------------------------------------------------------------------


def load_policy(path: str | os.PathLike[str], env_override: str | None) -> PolicyState:
    """The policy in force now: ``path`` is re-read on every call; never raises."""
    problems: list[str] = []
    file_mode, allowlist, offers = _read_policy_file(Path(path), problems)
    mode, source = (file_mode, "file") if file_mode is not None else (Mode.ASK, "default")
    if problems:
        mode, source = Mode.ASK, "default"
    if env_override is not None and env_override.strip():
        override = parse_override(env_override)
        if override is None:
            problems.append(
                f"{ENV_OVERRIDE}={env_override!r} is not open, ask, allowlist, closed or 1..4 "
                "(closed: every ring is refused until it is fixed)"
            )
            mode, source = Mode.CLOSED, "invalid_override"
        else:
            mode, source = override, "override"
    return PolicyState(
        mode=mode,
        allowlist=allowlist,
        offers=offers,
        error="; ".join(problems) if problems else None,
        file_mode=file_mode,
        mode_source=source,
    )


def _read_policy_file(
    path: Path, problems: list[str]
) -> tuple[Mode | None, tuple[str, ...], tuple[str, ...]]:
    """Mode (None if unset), allowlist and offers of the file; problems appended, never raised."""
    try:
        data = _read_json_object(path)
    except FileNotFoundError:
        return None, (), ()
    except PolicyFileError as exc:
        problems.append(str(exc))
        return None, (), ()
    mode: Mode | None = None
    if "contact_policy" in data:
        mode = parse_mode(data["contact_policy"])
        if mode is None:
            problems.append(
                f"{path}: contact_policy {data['contact_policy']!r} is not open, ask, "
                "allowlist, closed or 1..4"
            )
    allowlist = _read_allowlist(path, data.get("allowlist", []), problems)
    offers = _read_offers(path, data.get("offers", []), problems)
    return mode, allowlist, offers


def _read_allowlist(path: Path, value: object, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list):
        problems.append(f"{path}: allowlist is not a list of 64-hex node ids")
        return ()
    entries: list[str] = []
    for i, entry in enumerate(value):
        if type(entry) is str and _HEX64.fullmatch(entry.strip()):
            node = entry.strip().lower()
            if node not in entries:
                entries.append(node)
        else:
            problems.append(f"{path}: allowlist[{i}] {entry!r} is not a 64-hex node id")
    return tuple(entries)


def _read_offers(path: Path, value: object, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list):
        problems.append(f"{path}: offers is not a list of strings")
        return ()
    offers: list[str] = []
    for i, offer in enumerate(value):
        if type(offer) is str:
            offers.append(offer)
        else:
            problems.append(f"{path}: offers[{i}] {offer!r} is not a string")
    return tuple(offers)


def _read_json_object(path: Path) -> dict[str, object]:
    """The file's JSON object. ``FileNotFoundError`` if absent; ``PolicyFileError`` otherwise."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: e.g. a NUL byte in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PolicyFileError(f"{path}: cannot be read ({why})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise PolicyFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise PolicyFileError(f"{path}: is not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise PolicyFileError(f"{path}: is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PolicyFileError(f"{path}: is not a JSON object")
    return data


# -- deciding -----------------------------------------------------------------------------------


def decide(state: PolicyState, caller: bytes) -> Decision:
    """The answer to a ring from ``caller`` (a verified node id) under ``state``."""
    if state.mode is Mode.OPEN:
        return Decision(Answer.ACCEPTED)
    if state.mode is Mode.CLOSED:
        return Decision(Answer.DECLINED, "this agent is not taking rings (contact policy closed)")
    if state.allows(caller):
        return Decision(Answer.ACCEPTED)
    if state.mode is Mode.ALLOWLIST:
        return Decision(Answer.DECLINED, "this agent only takes rings from its allowlist")
    return Decision(Answer.DEFERRED, "this agent's model decides; the answer comes back later")


# -- editing ------------------------------------------------------------------------------------


def trust(
    path: str | os.PathLike[str], node_id: bytes, *, env_override: str | None = None
) -> PolicyState:
    """Add ``node_id`` to the allowlist; an unset or ``ask`` mode becomes ``allowlist``."""
    entry = _entry(node_id)
    target = Path(path)
    data = _load_for_edit(target)
    allowlist = _allowlist_for_edit(target, data)
    changed = False
    if not any(type(e) is str and e.strip().lower() == entry for e in allowlist):
        allowlist.append(entry)
        changed = True
    if "contact_policy" not in data or parse_mode(data["contact_policy"]) is Mode.ASK:
        data["contact_policy"] = Mode.ALLOWLIST.label
        changed = True
    if changed:
        data["allowlist"] = allowlist
        _write_atomically(target, data)
    return load_policy(target, env_override)


def untrust(
    path: str | os.PathLike[str], node_id: bytes, *, env_override: str | None = None
) -> PolicyState:
    """Remove ``node_id`` from the allowlist (every spelling of it); the mode stays as it is."""
    entry = _entry(node_id)
    target = Path(path)
    if not target.exists():
        return load_policy(target, env_override)
    data = _load_for_edit(target)
    allowlist = _allowlist_for_edit(target, data)
    kept = [e for e in allowlist if not (type(e) is str and e.strip().lower() == entry)]
    if len(kept) != len(allowlist):
        data["allowlist"] = kept
        _write_atomically(target, data)
    return load_policy(target, env_override)


def _entry(node_id: bytes) -> str:
    if type(node_id) is not bytes or len(node_id) != 32:
        raise ValueError("a node id is exactly 32 bytes")
    return node_id.hex()


def _load_for_edit(path: Path) -> dict[str, object]:
    try:
        return _read_json_object(path)
    except FileNotFoundError:
        return {}


def _allowlist_for_edit(path: Path, data: dict[str, object]) -> list[object]:
    value = data.get("allowlist", [])
    if not isinstance(value, list):
        raise PolicyFileError(f"{path}: allowlist is not a list; fix the file by hand first")
    return list(value)


def _write_atomically(path: Path, data: dict[str, object]) -> None:
    """Temporary file in the same directory, fsync, rename; 0600 file, 0700 new directory."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(parent, 0o700)  # mkdir's mode is filtered by the umask
    body = (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where we can
        dir_fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
