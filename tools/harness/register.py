"""``macula-mcp register`` / ``uninstall``: a ``macula`` server entry merged into (and taken back
out of) each MCP client's own configuration file; plus the registration lines of ``doctor``.

Invariants:
- a configuration file is changed only by an atomic replace (temp file in the same folder,
  fsync, rename) that keeps the file's mode; a symlinked file is written through to its target.
- before a file is changed, a byte-for-byte copy goes next to it
  (``<name>.macula-backup-<UTC time>``, same mode as the original, so 0600 stays 0600).
- a file that does not parse is never written; the error names the file and the parser's words,
  and the other harnesses still proceed (the exit code is 1).
- register is idempotent: when the entry is already what it would write, nothing is written and
  no backup is made. A ``macula`` entry that register did not write (see
  ``Harness.is_ours``) is replaced or removed only with ``--force``.
- uninstall gives back the exact bytes register started from when nothing else changed since:
  the newest backup without a ``macula`` entry from which register would produce today's file
  is restored (or the file is deleted when register would produce it from nothing); otherwise
  only the entry is removed.
- the command registered is ``tools.launch.server_command()``: the absolute path of the
  ``macula-mcp`` script of the environment it runs from (in a checkout, ``.venv/bin/macula-mcp``,
  which starts without ``uv``'s sync on every launch), else ``python -m tools.cli``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import stat
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from macula.config import STATIONS_ENV, configured_stations
from macula.errors import ConfigError
from tools.commands import parser_for
from tools.harness.config_formats import ConfigParseError
from tools.harness.harnesses import BY_NAME, ENTRY_NAME, HARNESSES, Harness
from tools.harness.http_register import HTTP_HARNESSES, HttpTarget, http_entry, is_our_http_entry
from tools.launch import server_command

BACKUP_INFIX = ".macula-backup-"
NEW_FILE_MODE = 0o600


@dataclass(frozen=True)
class RegistrationResult:
    """What registering or removing macula-mcp did in one harness's config."""

    harness: str
    status: str  # registered, unchanged, removed, not-registered, not-found, kept, failed
    detail: str
    failed: bool = False
    diff: str = ""


def macula_command(attach: bool) -> list[str]:
    return [*server_command(), *(["attach"] if attach else [])]


def entry_environment(env: Mapping[str, str]) -> dict[str, str]:
    stations = env.get(STATIONS_ENV)
    return {STATIONS_ENV: stations} if stations else {}


def _read(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigParseError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _target(path: Path) -> Path:
    """Where the bytes live: a symlinked configuration (dotfile managers) is written through."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


class ChangedMeanwhile(OSError):
    """The file changed between our read and our write (its harness rewrote it)."""


def write_atomic(path: Path, text: str, mode: int, expected: str | None) -> None:
    """Replace ``path`` by ``text`` only if it still holds exactly ``expected`` (``None``: still
    absent): a harness such as Claude Code rewrites its file while it runs; never undo that."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(text.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        try:
            now = path.read_bytes()
        except FileNotFoundError:
            now = None
        if now != (None if expected is None else expected.encode("utf-8")):
            raise ChangedMeanwhile(
                "it changed while being edited (by its harness?); nothing written, run again"
            )
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def backup(path: Path, now: float) -> Path:
    """A copy of ``path`` beside it, with its mode; never overwrites an earlier backup."""
    mode = stat.S_IMODE(path.stat().st_mode)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    data = path.read_bytes()
    for attempt in range(1000):
        suffix = "" if attempt == 0 else f"-{attempt}"
        copy = path.with_name(f"{path.name}{BACKUP_INFIX}{stamp}{suffix}")
        try:
            fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), mode)  # exactly the original's, whatever the umask
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        return copy
    raise FileExistsError(f"too many backups of {path} within one second")


def backups(path: Path) -> list[Path]:
    """This file's backups, newest first."""
    found = path.parent.glob(f"{path.name}{BACKUP_INFIX}*")
    return sorted(found, key=lambda p: p.name, reverse=True)


def _diff(path: Path, before: str | None, after: str | None) -> str:
    lines = difflib.unified_diff(
        (before or "").splitlines(keepends=True),
        (after or "").splitlines(keepends=True),
        fromfile=str(path) if before is not None else "/dev/null",
        tofile=str(path) if after is not None else "/dev/null",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@dataclass(frozen=True)
class Options:
    env: Mapping[str, str]
    platform: str
    dry_run: bool = False
    force: bool = False
    now: float = 0.0
    http: HttpTarget | None = None  # register the daemon's /mcp (tools.harness.http_register)


def register_one(harness: Harness, command: list[str], options: Options) -> RegistrationResult:
    path = harness.config_path(options.env, options.platform)
    target = _target(path)
    try:
        if options.http is not None:
            entry = http_entry(harness.name, options.http)
        else:
            entry = harness.build(command, entry_environment(options.env))
    except ConfigError as exc:
        return RegistrationResult(harness.name, "failed", str(exc), failed=True)
    try:
        before = _read(target)
        existing = harness.format.read_entry(before, ENTRY_NAME) if before is not None else None
        if existing == entry:
            return RegistrationResult(harness.name, "unchanged", f"{path}: already registered")
        if existing is not None and not harness.is_ours(existing) and not options.force:
            return RegistrationResult(
                harness.name,
                "kept",
                f"{path}: its '{ENTRY_NAME}' entry was not written by register; left as it is "
                "(--force replaces it)",
                failed=True,
            )
        after = harness.format.with_entry(before, ENTRY_NAME, entry)
        if harness.format.read_entry(after, ENTRY_NAME) != entry:  # a bug guard, never expected
            raise ConfigParseError("the edited text does not read back as the entry written")
    except (ConfigParseError, OSError) as exc:
        return RegistrationResult(
            harness.name, "failed", f"{path}: {exc}; left untouched", failed=True
        )
    if after == before:
        return RegistrationResult(harness.name, "unchanged", f"{path}: already registered")
    diff = _diff(path, before, after)
    if options.dry_run:
        return RegistrationResult(harness.name, "would-register", f"{path} (dry run)", diff=diff)
    try:
        copy = backup(target, options.now) if before is not None else None
        mode = stat.S_IMODE(target.stat().st_mode) if before is not None else NEW_FILE_MODE
        if options.http is not None:
            mode &= ~0o077  # the entry holds a bearer token: the file is its owner's only
        write_atomic(target, after, mode, expected=before)
    except OSError as exc:
        return RegistrationResult(harness.name, "failed", f"{path}: {exc}", failed=True)
    saved = f" (backup {copy.name})" if copy else " (created)"
    return RegistrationResult(harness.name, "registered", f"{path}{saved}", diff=diff)


def _original(harness: Harness, target: Path, current: str, entry: Any) -> tuple[str | None] | None:
    """The text register started from, when it would turn that text into ``current`` exactly
    (``(None,)``: there was no file); ``None`` when something else changed since."""
    fmt = harness.format
    for copy in backups(target):
        try:
            text = _read(copy)
            if text is None or fmt.read_entry(text, ENTRY_NAME) is not None:
                continue
            if fmt.with_entry(text, ENTRY_NAME, entry) == current:
                return (text,)
        except (ConfigParseError, OSError):
            continue
    if fmt.with_entry(None, ENTRY_NAME, entry) == current:
        return (None,)
    return None


def uninstall_one(harness: Harness, options: Options) -> RegistrationResult:
    path = harness.config_path(options.env, options.platform)
    target = _target(path)
    try:
        current = _read(target)
        entry = harness.format.read_entry(current, ENTRY_NAME) if current is not None else None
        if current is None or entry is None:
            return RegistrationResult(
                harness.name, "not-registered", f"{path}: no '{ENTRY_NAME}' entry"
            )
        if not harness.is_ours(entry) and not options.force:
            return RegistrationResult(
                harness.name,
                "kept",
                f"{path}: its '{ENTRY_NAME}' entry was edited or written by hand; left as it is "
                "(--force removes it)",
                failed=True,
            )
        original = _original(harness, target, current, entry)
        if original is None:
            after: str | None = harness.format.without_entry(current, ENTRY_NAME)
        else:
            (after,) = original
    except (ConfigParseError, OSError) as exc:
        return RegistrationResult(
            harness.name, "failed", f"{path}: {exc}; left untouched", failed=True
        )
    diff = _diff(path, current, after)
    if options.dry_run:
        return RegistrationResult(harness.name, "would-remove", f"{path} (dry run)", diff=diff)
    try:
        if after is None:
            if _read(target) != current:
                raise ChangedMeanwhile("it changed while being edited; nothing removed, run again")
            target.unlink()
            how = "file removed: register had created it"
        elif original is not None:
            write_atomic(target, after, stat.S_IMODE(target.stat().st_mode), expected=current)
            how = "file restored byte for byte"
        else:
            copy = backup(target, options.now)
            write_atomic(target, after, stat.S_IMODE(target.stat().st_mode), expected=current)
            how = f"entry removed; other changes since register kept (backup {copy.name})"
    except (ConfigParseError, OSError) as exc:
        return RegistrationResult(harness.name, "failed", f"{path}: {exc}", failed=True)
    return RegistrationResult(harness.name, "removed", f"{path}: {how}", diff=diff)


def _selected(names: Sequence[str] | None, options: Options) -> list[tuple[Harness, str | None]]:
    """(harness, why it is present or None) for the harnesses asked for, or every one found."""
    chosen = [BY_NAME[name] for name in names] if names else list(HARNESSES)
    return [(h, h.present(options.env, options.platform)) for h in chosen]


def _parser(command: str) -> argparse.ArgumentParser:
    parser = parser_for(
        command,
        "Write a macula entry into each MCP client's own configuration file (Claude Code, "
        f"Codex, Cursor, ...), a backup beside it first; {STATIONS_ENV}, when set, is "
        "checked and copied into the entry."
        if command == "register"
        else "Take the macula entry back out of each MCP client's configuration file (the "
        "file as it was before register, when nothing else changed since).",
    )
    parser.add_argument(
        "--harness",
        action="append",
        choices=sorted(BY_NAME),
        help="only this harness (repeatable); default: every one found",
    )
    if command == "register":
        parser.add_argument(
            "--attach", action="store_true", help="register `macula-mcp attach` (the daemon form)"
        )
        parser.add_argument(
            "--http",
            action="store_true",
            help="register the daemon's http://127.0.0.1:PORT/mcp with a bearer token "
            "(Claude Code, Cursor, VS Code)",
        )
        parser.add_argument("--agent", help="--http: the token of this agent (default: home's)")
        parser.add_argument("--port", type=int, help="--http: this port (default: the daemon's)")
    parser.add_argument("--dry-run", action="store_true", help="show the change, write nothing")
    parser.add_argument(
        "--force", action="store_true", help="also replace/remove a hand-written macula entry"
    )
    return parser


def _http_target(args: argparse.Namespace, env: Mapping[str, str]) -> HttpTarget | None:
    """The ``--http`` target, or None without ``--http`` (ConfigError when it cannot be had)."""
    from macula.config import macula_home
    from tools.harness.http_register import http_target

    if not getattr(args, "http", False):
        if getattr(args, "agent", None) or getattr(args, "port", None):
            raise ConfigError("--agent and --port go with --http")
        return None
    if args.attach:
        raise ConfigError("--http and --attach are two forms: choose one")
    return http_target(macula_home(env), args.agent, args.port)


def run(command: str, argv: Sequence[str], out: TextIO = sys.stdout) -> int:
    """``register`` or ``uninstall`` as the CLI runs them; the exit code (0, or 1 on failure)."""
    args = _parser(command).parse_args(argv)
    if sys.platform not in ("linux", "darwin"):
        print(f"macula-mcp {command}: only Linux and macOS are supported", file=sys.stderr)
        return 1
    env = dict(os.environ)
    try:
        http = _http_target(args, env)
        stations = _checked_stations(env) if command == "register" and http is None else ""
    except (ConfigError, OSError) as exc:
        print(f"macula-mcp {command}: {exc}", file=sys.stderr)
        return 1
    options = Options(
        env, sys.platform, dry_run=args.dry_run, force=args.force, now=time.time(), http=http
    )
    try:
        selected = _selected(args.harness, options)
    except ValueError as exc:
        print(f"macula-mcp {command}: {exc}", file=sys.stderr)
        return 1
    outcomes: list[RegistrationResult] = []
    missing: list[str] = []
    stdio_only: list[str] = []
    for harness, present in selected:
        path = harness.config_path(options.env, options.platform)
        if present is None and args.harness:  # asked for by name: say so, and fail
            where = f"no {path} nor its folder"
            outcomes.append(RegistrationResult(harness.name, "not-found", where, failed=True))
        elif present is None:
            missing.append(harness.name)
        elif http is not None and harness.name not in HTTP_HARNESSES and not args.harness:
            stdio_only.append(harness.name)  # named with --harness, it fails and says why
        elif command == "register":
            outcomes.append(register_one(harness, macula_command(args.attach), options))
        else:
            outcomes.append(uninstall_one(harness, options))
    shown = http.redact if http is not None else str  # the token is never printed
    for outcome in outcomes:
        stream = sys.stderr if outcome.failed else out
        print(shown(f"{outcome.harness}: {outcome.status}: {outcome.detail}"), file=stream)
        if outcome.diff and args.dry_run:
            print(shown(outcome.diff), end="", file=out)
    if missing:
        print(f"not found (skipped): {', '.join(missing)}", file=out)
    if stdio_only:
        print(f"no HTTP form (skipped; register without --http): {', '.join(stdio_only)}", file=out)
    if not outcomes and command == "register":
        print("macula-mcp register: no MCP client found", file=sys.stderr)
        return 1
    if stations and any(o.status in COPIED for o in outcomes):
        print(f"copied {STATIONS_ENV}={stations} into the entry's env", file=out)
    return 1 if any(o.failed for o in outcomes) else 0


COPIED = ("registered", "would-register", "unchanged")


def _checked_stations(env: Mapping[str, str]) -> str:
    """``MACULA_MESH_STATIONS`` as the entry will carry it, checked by the library's own parser
    first (``ConfigError`` naming the bad entry): register never writes a list macula-mcp
    would refuse at start."""
    stations = env.get(STATIONS_ENV, "")
    if stations:
        configured_stations(env)
    return stations


def registration_checks(env: Mapping[str, str], platform: str) -> list[tuple[str, bool, str]]:
    """``doctor``'s lines: where macula is registered, and whether each entry's command exists."""
    results: list[tuple[str, bool, str]] = []
    for harness in HARNESSES:
        path = harness.config_path(env, platform)
        try:
            text = _read(_target(path))
            entry = harness.format.read_entry(text, ENTRY_NAME) if text is not None else None
        except (ConfigParseError, OSError) as exc:
            results.append((f"registered in {harness.title}", False, f"{path}: {exc}"))
            continue
        if entry is None:
            continue
        name = f"registered in {harness.title}"
        if is_our_http_entry(harness.name, entry):  # the daemon's /mcp: no command to find
            results.append((name, True, f"{path}: {entry['url']} (HTTP)"))
            continue
        parsed = harness.command_of(entry) if isinstance(entry, Mapping) else None
        if parsed is None:
            results.append((name, False, f"{path}: the '{ENTRY_NAME}' entry has no command"))
            continue
        executable = Path(parsed[0][0])
        shown = " ".join(parsed[0])
        if not executable.is_absolute():
            found = os.path.exists(executable) or _on_path(str(executable), env)
            results.append((name, found, f"{path}: {shown} (looked up on PATH)"))
        elif executable.is_file() and os.access(executable, os.X_OK):
            results.append((name, True, f"{path}: {shown}"))
        else:
            results.append(
                (
                    name,
                    False,
                    f"{path}: {shown}: {executable} does not exist or is not executable "
                    "(run `macula-mcp register` again)",
                )
            )
    if not results:
        results.append(("registrations", True, "in no harness yet (`macula-mcp register`)"))
    return results


def _on_path(name: str, env: Mapping[str, str]) -> bool:
    import shutil

    return shutil.which(name, path=env.get("PATH", "")) is not None
