"""The ``pre-commit`` hook of the commit guard: installed beside whatever hook is there, never
over it, and taken out leaving that hook exactly as it was.

Invariants:
- Our hook is known by ``MARK`` on its second line; nothing without it is ever written over or
  removed.
- A hook already there is renamed to ``pre-commit.macula-chained`` (a rename: its bytes, mode
  and link-ness unchanged), and our hook runs it after the check (``exec``, same arguments,
  only when it is executable, as git itself would). ``uninstall`` renames it back.
- Installing over our own hook rewrites it (new options), leaving the chained one alone; a
  chained file already there beside a foreign hook is refused (two hooks, one place).
- The hook runs ``python -P -m tools.guard.command check`` with the interpreter that installed
  it: no MCP server, no shell interpolation of anything but that quoted path, and nothing of
  the repository's on ``sys.path`` (``-P``).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tools.guard.project import hooks_dir

__all__ = [
    "CHAINED",
    "HOOK",
    "MARK",
    "GuardError",
    "Installed",
    "hook_text",
    "install",
    "uninstall",
]

HOOK: Final = "pre-commit"
CHAINED: Final = "pre-commit.macula-chained"
MARK: Final = "# macula-guard: installed by `macula-mcp guard install`"


class GuardError(Exception):
    """The hook cannot be installed or removed here; the message says why and what to do."""


@dataclass(frozen=True)
class Installed:
    hook: Path
    chained: Path | None  # the hook that was there before, now run after ours


def hook_text(
    *, python: str = sys.executable, fail_closed: int = 0, project: str | None = None
) -> str:
    # -P: the repository's own folders are not on sys.path (git runs the hook in its root, and
    # a repository with a tools/ package would shadow ours, or run its tools/guard/command.py)
    check = [shlex.quote(python), "-P", "-m", "tools.guard.command", "check"]
    if fail_closed:
        check.append("--fail-closed")
    if project:
        check += ["--project", shlex.quote(project)]
    return "\n".join(
        [
            "#!/bin/sh",
            MARK,
            "# Refuses a commit touching paths another agent reserved exclusively on the mesh",
            "# (docs/reservations.md). Override for one commit: git commit --no-verify",
            f"{' '.join(check)} || exit $?",
            f'chained="$(dirname "$0")/{CHAINED}"',
            'if [ -x "$chained" ]; then exec "$chained" "$@"; fi',
            "exit 0",
            "",
        ]
    )


def _ours(path: Path) -> bool:
    try:
        return MARK in path.read_text(encoding="utf-8", errors="replace").splitlines()[:3]
    except (OSError, IndexError):
        return False


def install(root: Path, *, fail_closed: int = 0, project: str | None = None) -> Installed:
    """Install the hook in the repository at ``root`` (see the module's invariants)."""
    hooks = hooks_dir(root)
    hooks.mkdir(parents=True, exist_ok=True)
    hook, chained = hooks / HOOK, hooks / CHAINED
    exists = hook.exists() or hook.is_symlink()
    if exists and not _ours(hook):
        if chained.exists() or chained.is_symlink():
            raise GuardError(
                f"{hook} and {chained} both exist: move one of them away, then install again"
            )
        os.rename(hook, chained)
    text = hook_text(fail_closed=fail_closed, project=project)
    temporary = hooks / f".{HOOK}.macula-new"
    temporary.write_text(text, encoding="utf-8")
    temporary.chmod(0o755)
    os.replace(temporary, hook)
    return Installed(hook, chained if chained.exists() or chained.is_symlink() else None)


def uninstall(root: Path) -> Installed:
    """Take our hook out of ``root``'s repository and put back the one it chained, if any."""
    hooks = hooks_dir(root)
    hook, chained = hooks / HOOK, hooks / CHAINED
    if not hook.exists() or not _ours(hook):
        raise GuardError(f"no macula guard hook at {hook}: nothing to remove")
    hook.unlink()
    if chained.exists() or chained.is_symlink():
        os.rename(chained, hook)
        return Installed(hook, chained)
    return Installed(hook, None)
