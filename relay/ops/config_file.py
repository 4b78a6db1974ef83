"""``macula-relay --config station.toml``: every command-line option as a key of a TOML file.

The keys are derived from the argument parser itself, so none is forgotten: each long option
without its ``--`` (``--publish-rate 50`` is ``publish-rate = 50``, ``--no-memory`` is
``no-memory = true``, a repeatable ``--peer`` is ``peer = ["...", "..."]``). Values go through
the option's own type and choices, so a file is checked exactly as the command line is. Options
given on the command line override the file (a repeatable one given there replaces the file's
list). An unknown key, a table, or a bad value is refused at start naming the file, the line and
the key. ``render`` writes the effective configuration back as TOML (``--print-config``).
"""

from __future__ import annotations

import argparse
import difflib
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

# dests with no key in the file (``worker_role``: set by ``--workers``' parent only)
NOT_KEYS = frozenset({"help", "config", "print_config", "worker_role"})
NUMBERS: dict[object, str] = {int: "a whole number", float: "a number"}


class ConfigFileError(Exception):
    """A config file that cannot be used; the message names file, line and key."""


@dataclass
class Loaded:
    """What a config file set: ``dest -> value`` (already typed) and where each was set."""

    path: Path | None = None
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, tuple[str, int]] = field(default_factory=dict)  # dest -> (key, line)

    def blame(self, message: str) -> str:
        """``message`` (naming ``--flag``) plus where the file set that flag, if it did."""
        for key, line in self.lines.values():
            if re.search(rf"--{re.escape(key)}(?![\w-])", message):
                return f"{message} (set in {self.path} line {line}, key {key!r})"
        return message


def option_keys(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """``key -> action`` for every long option of ``parser`` (help and --config aside)."""
    keys: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.dest in NOT_KEYS:
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs:
            keys[longs[0][2:]] = action
    return keys


def config_path(argv: Sequence[str]) -> Path | None:
    """The ``--config FILE`` among ``argv`` (parsed alone, everything else ignored)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config", type=Path)
    known, _ = early.parse_known_args(list(argv))
    path: Path | None = known.config
    return path


def _line_of(text: str, key: str) -> int:
    pattern = re.compile(rf"""^\s*(["']?){re.escape(key)}\1\s*=""")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.match(line):
            return number
    return 0


def _table_line(text: str, key: str) -> int:
    pattern = re.compile(rf"""^\s*\[+\s*(["']?){re.escape(key)}\1\s*[\].]""")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.match(line):
            return number
    return _line_of(text, key)


def _convert_one(action: argparse.Action, value: object) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a {'string' if action.type is None else 'value'}, got "
                         f"{type(value).__name__}")  # fmt: skip
    if callable(action.type):
        try:
            converted = action.type(str(value))
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            if action.type in NUMBERS:  # Python's own wording ("invalid literal ...") says less
                raise ValueError(f"{value!r} is not {NUMBERS[action.type]}") from None
            raise ValueError(str(exc) or f"{value!r} is not valid") from None
    else:
        converted = str(value)
    if action.choices is not None and converted not in action.choices:
        shown = ", ".join(str(c) for c in action.choices)
        raise ValueError(f"{value!r} is not one of {shown}")
    return converted


def convert(action: argparse.Action, value: object) -> Any:
    """A TOML value for ``action``, typed as the command line would type it."""
    if action.nargs == 0:  # store_true / store_false
        if not isinstance(value, bool):
            raise ValueError("expected true or false")
        return value if action.const is True else not value
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_convert_one(action, item) for item in items]
    return _convert_one(action, value)


def load(path: Path, parser: argparse.ArgumentParser) -> Loaded:
    """Read and check ``path`` against ``parser``'s options; ``ConfigFileError`` if bad."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: not TOML: {exc}") from None
    keys = option_keys(parser)
    loaded = Loaded(path)
    for key, value in document.items():
        if isinstance(value, dict):
            where = _table_line(text, key)
            raise ConfigFileError(
                f"{path} line {where}: [{key}]: tables are not options; every key is top-level"
            )
        line = _line_of(text, key)
        action = keys.get(key)
        if action is None:
            close = difflib.get_close_matches(key, list(keys), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigFileError(f"{path} line {line}: unknown key {key!r}{hint}")
        try:
            loaded.values[action.dest] = convert(action, value)
        except ValueError as exc:
            raise ConfigFileError(f"{path} line {line}: key {key!r}: {exc}") from None
        loaded.lines[action.dest] = (key, line)
    return loaded


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    return any(
        token == option or token.startswith(f"{option}=")
        for token in argv
        for option in action.option_strings
    )


def parse(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, Loaded]:
    """``argv`` over the ``--config`` file it names (if any): the effective options."""
    path = config_path(argv)
    loaded = Loaded() if path is None else load(path, parser)
    keys = {action.dest: action for action in option_keys(parser).values()}
    defaults = {}
    for dest, value in loaded.values.items():
        action = keys[dest]
        if isinstance(action, argparse._AppendAction) and _given(action, argv):
            continue  # the command line's list replaces the file's
        defaults[dest] = value
    parser.set_defaults(**defaults)
    return parser.parse_args(list(argv)), loaded


def _plain(value: Any) -> Any:
    """An option's value as TOML can hold it (what the command line would take)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple) and len(value) == 2:  # a HOST:PORT option (--monitor)
        host, port = value
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    node_id, host, port = (getattr(value, n, None) for n in ("node_id", "host", "quic_port"))
    if isinstance(node_id, bytes) and host is not None:
        return f"{node_id.hex()}@{host}:{port}"  # a --peer
    name, authority = getattr(value, "name", None), getattr(value, "authority", None)
    if isinstance(name, str) and isinstance(authority, bytes):
        return f"{name}={authority.hex()}"  # a --realm
    return str(value)


def render(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The effective configuration as a TOML file ``--config`` takes back unchanged."""
    document = tomlkit.document()
    document.add(tomlkit.comment("macula-relay: the effective configuration (--print-config)"))
    for key, action in option_keys(parser).items():
        value = getattr(args, action.dest, None)
        if action.nargs == 0 and isinstance(value, bool) and action.const is False:
            value = not value  # a store_false option: the key says what the flag says
        if value is None:
            document.add(tomlkit.comment(f"{key} =   (not set)"))
            continue
        document.add(key, _plain(value))
    return tomlkit.dumps(document)
