"""What the reservations need to know of a git repository, asked of ``git`` itself: its root,
its origin's project id, the paths a commit would touch, where its hooks live.

Invariants:
- ``git`` runs with an argument list (never a shell), in the repository given, with a timeout;
  a failure is ``GitError`` carrying git's own words, never a traceback.
- A project id is ``macula.services.reservation_paths.normalise_origin`` of ``origin``'s URL, or
  a name given instead (a URL given as a name is normalised like an origin).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Final

from macula.services.reservation_paths import PathRefused, normalise_origin, normalise_project

__all__ = ["GitError", "hooks_dir", "project_id", "project_of", "repo_root", "staged_paths"]

GIT_TIMEOUT_S: Final = 10.0


class GitError(Exception):
    """``git`` failed, or the repository has no origin to name its project by."""


def _git(where: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(where), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git {args[0]}: {exc}") from None
    if done.returncode != 0:
        raise GitError(f"git {args[0]}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def repo_root(where: Path) -> Path:
    """The top of the work tree ``where`` is in."""
    return Path(_git(where, "rev-parse", "--show-toplevel").strip())


def project_id(given: str) -> str:
    """The project id of a name or URL a person or model gave."""
    text = given.strip()
    looks_like_url = "://" in text or (text.count(":") == 1 and "@" in text.split(":")[0])
    return normalise_origin(text) if looks_like_url else normalise_project(text)


def project_of(root: Path) -> str:
    """The project id of the repository at ``root``: its origin's URL, normalised."""
    try:
        url = _git(root, "remote", "get-url", "origin").strip()
    except GitError:
        raise GitError(
            f"{root} has no remote 'origin' to name the project by: give a project name"
        ) from None
    try:
        return normalise_origin(url)
    except PathRefused as exc:
        raise GitError(f"origin of {root}: {exc}") from None


def staged_paths(root: Path) -> list[str]:
    """The paths the next commit touches (added, changed, deleted; a rename as both ends)."""
    out = _git(root, "diff", "--cached", "--name-only", "--no-renames", "-z")
    return [path for path in out.split("\0") if path]


def hooks_dir(root: Path) -> Path:
    """Where git looks for this repository's hooks (``core.hooksPath`` honoured)."""
    path = Path(_git(root, "rev-parse", "--git-path", "hooks").strip())
    return path if path.is_absolute() else root / path
