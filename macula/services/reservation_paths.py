"""Path reservations, pure: what a reserved path or glob is, which paths it covers, whether two
of them can cover one path, and the project id a repository's origin URL stands for.

Used by the station (``relay.house.reservations``: conflicts between reservations) and by the
commit guard (``tools.guard``: the staged paths a reservation covers), so both read a glob the
same way.

Invariants:
- A reserved path is relative to the project's root, ``/``-separated, with no ``.`` or ``..``
  segment, no empty segment, no control or private-use character, at most
  ``MAX_RESERVATION_PATH_CHARS`` characters. An absolute path is refused (``PathRefused``);
  ``relative_to_root`` turns one inside a known root into a relative one first.
- Glob syntax: ``*`` any characters inside one segment, ``?`` one character, a segment ``**``
  any number of segments (none too). A trailing ``/`` means the whole tree below
  (``src/auth/`` is ``src/auth/**``). No character classes nor braces (refused). At most
  ``MAX_RESERVATION_WILDCARDS`` wildcards and ``MAX_RESERVATION_GLOBSTARS`` ``**`` a glob.
- ``overlaps(a, b)`` is exact: 1 if and only if some path matches both; its work is bounded by
  the product of the two globs' lengths (two automata walked together, no backtracking).
- No I/O, no clock.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Final
from urllib.parse import urlsplit

from macula.services.limits import (
    MAX_PROJECT_CHARS,
    MAX_RESERVATION_GLOBSTARS,
    MAX_RESERVATION_PATH_CHARS,
    MAX_RESERVATION_WILDCARDS,
)

__all__ = [
    "PathRefused",
    "matches",
    "normalise_origin",
    "normalise_path",
    "normalise_project",
    "overlaps",
    "relative_to_root",
]

# wildcards become private-use characters, which a normalised path never holds
_STAR: Final = "\ue000"
_ONE: Final = "\ue001"
_GLOBSTAR: Final = "\ue002"
_UNSUPPORTED: Final = frozenset("[]{}")
_SCP_LIKE: Final = re.compile(r"^(?:[^@/:]+@)?([^/:]+):(?!//)(.+)$")  # git@host:owner/repo


class PathRefused(ValueError):
    """A path, glob or project id the reservations do not take; the message says why."""


def normalise_path(raw: str) -> str:
    """``raw`` as a reserved path (see the module's invariants), or ``PathRefused``."""
    if not isinstance(raw, str):
        raise PathRefused("a path must be text")
    path = raw.strip().replace("\\", "/")
    if not path:
        raise PathRefused("a path must not be empty")
    if len(path) > MAX_RESERVATION_PATH_CHARS:
        raise PathRefused(f"a path is at most {MAX_RESERVATION_PATH_CHARS} characters")
    if path.startswith("/") or re.match(r"^[A-Za-z]:/", path):
        raise PathRefused(f"{raw!r} is absolute: give it relative to the project's root")
    bad = [c for c in path if unicodedata.category(c) in ("Cc", "Cf", "Co", "Cs", "Cn")]
    if bad:
        raise PathRefused(f"{raw!r} holds a control or unassigned character")
    if _UNSUPPORTED & set(path):
        raise PathRefused(f"{raw!r}: character classes and braces ([ ] {{ }}) are not supported")
    tree = path.endswith("/")
    segments = [s for s in path.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise PathRefused(f"{raw!r} climbs out with '..'")
    if tree:
        segments.append("**")
    if not segments:
        raise PathRefused(f"{raw!r} names the project's root: reserve '**' for all of it")
    _check_wildcards(raw, segments)
    return "/".join(segments)


def _check_wildcards(raw: str, segments: Sequence[str]) -> None:
    globstars = sum(1 for s in segments if s == "**")
    wildcards = globstars + sum(s.count("*") + s.count("?") for s in segments if s != "**")
    if any("**" in s and s != "**" for s in segments):
        raise PathRefused(f"{raw!r}: '**' must be a whole segment (a/**/b)")
    if globstars > MAX_RESERVATION_GLOBSTARS:
        raise PathRefused(f"{raw!r} has {globstars} '**'; at most {MAX_RESERVATION_GLOBSTARS}")
    if wildcards > MAX_RESERVATION_WILDCARDS:
        raise PathRefused(f"{raw!r} has {wildcards} wildcards; at most {MAX_RESERVATION_WILDCARDS}")


def relative_to_root(raw: str, root: str) -> str:
    """``raw`` relative to ``root`` (an absolute ``/`` path) when it is absolute and inside it;
    a relative ``raw`` as it is. An absolute path outside ``root`` is ``PathRefused``."""
    path = raw.strip().replace("\\", "/")
    base = root.replace("\\", "/").rstrip("/")
    if not path.startswith("/") and not re.match(r"^[A-Za-z]:/", path):
        return raw
    if path == base or path == base + "/":
        return "**"
    if not path.startswith(base + "/"):
        raise PathRefused(f"{raw!r} is outside the project ({root})")
    return path[len(base) + 1 :]


# -- matching ------------------------------------------------------------------------------


def _glob_segments(glob: str) -> list[str]:
    return [
        _GLOBSTAR if s == "**" else s.replace("*", _STAR).replace("?", _ONE)
        for s in glob.split("/")
    ]


def _walk_together(
    a: Sequence[str], b: Sequence[str], star: str, meet: Callable[[str, str], bool]
) -> bool:
    """Whether some word is spelled by both ``a`` and ``b``: items equal to ``star`` stand for
    any run of items, two other items meet when ``meet`` says so. Breadth first over the
    pairs of positions, each visited once."""
    n, m = len(a), len(b)
    seen = {(0, 0)}
    todo = [(0, 0)]
    while todo:
        i, j = todo.pop()
        if i == n and j == m:
            return True
        steps = []
        if i < n and a[i] == star:
            steps.append((i + 1, j))  # a's star ends
            if j < m and b[j] != star:
                steps.append((i, j + 1))  # a's star takes b's item
        if j < m and b[j] == star:
            steps.append((i, j + 1))
            if i < n and a[i] != star:
                steps.append((i + 1, j))
        if i < n and j < m and a[i] != star and b[j] != star and meet(a[i], b[j]):
            steps.append((i + 1, j + 1))
        for step in steps:
            if step not in seen:
                seen.add(step)
                todo.append(step)
    return False


def _chars_meet(x: str, y: str) -> bool:
    return x in (y, _ONE) or y == _ONE


def _segments_meet(x: str, y: str) -> bool:
    if _STAR not in x and _ONE not in x and _STAR not in y and _ONE not in y:
        return x == y
    return _walk_together(x, y, _STAR, _chars_meet)


def overlaps(a: str, b: str) -> int:
    """1 if some path matches both normalised globs ``a`` and ``b``, else 0."""
    return int(_walk_together(_glob_segments(a), _glob_segments(b), _GLOBSTAR, _segments_meet))


def matches(glob: str, path: str) -> int:
    """1 if the repository path ``path`` (``/``-separated, relative; taken literally: a ``*``
    in it is a character) is covered by the normalised glob ``glob``, else 0."""
    literal = [s for s in path.replace("\\", "/").split("/") if s not in ("", ".")]
    return int(_walk_together(_glob_segments(glob), literal, _GLOBSTAR, _segments_meet))


# -- projects ------------------------------------------------------------------------------


def normalise_origin(url: str) -> str:
    """The project id of a git origin URL: ``host/path``, host lowercased, no user, port,
    scheme, trailing ``/`` nor ``.git``; ssh, scp-like and https forms of one repository
    give one id (``git@github.com:Org/Repo.git`` and ``https://github.com/Org/Repo`` are
    ``github.com/Org/Repo``). A local path stays a path (``file:`` dropped)."""
    text = url.strip()
    if not text:
        raise PathRefused("the origin URL is empty")
    scp = _SCP_LIKE.match(text) if "://" not in text else None
    if scp is not None:
        host, path = scp.group(1), scp.group(2)
    elif "://" in text:
        parts = urlsplit(text)
        if parts.scheme == "file":
            host, path = "", parts.path
        else:
            host, path = (parts.hostname or ""), parts.path
    else:
        host, path = "", text
    path = path.strip("/")
    path = path.removesuffix(".git").rstrip("/")
    project = f"{host.lower()}/{path}" if host else path
    return normalise_project(project)


def normalise_project(project: str) -> str:
    """A project id (a normalised origin or a name) as the station keys it, or ``PathRefused``."""
    name = project.strip() if isinstance(project, str) else ""
    if not name:
        raise PathRefused("a project id must not be empty")
    if len(name) > MAX_PROJECT_CHARS:
        raise PathRefused(f"a project id is at most {MAX_PROJECT_CHARS} characters")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Co", "Cs", "Cn") for c in name):
        raise PathRefused("a project id holds a control or unassigned character")
    return name
