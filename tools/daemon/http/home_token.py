"""The daemon's HTTP secret: one random token per ``MACULA_HOME``, for the console and ``/mcp``.

Invariants:
- the token lives in ``$MACULA_HOME/http/token``, a 0600 file in a 0700 folder, created on first
  use with 32 random bytes (URL-safe base64, 43 characters); an existing file of the wrong mode
  or shape is refused (``TokenFileError`` naming the file), never silently rewritten;
- comparison is constant-time (``hmac.compare_digest``); nothing here logs the token;
- ``port_path`` is where the daemon writes the loopback port it serves HTTP on (0600), while
  it does; ``last_port_path`` keeps that port across stops, so a restart takes it again.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Final

from macula.errors import ConfigError
from macula.private_file import write_private

DIR_NAME: Final = "http"
TOKEN_NAME: Final = "token"
PORT_NAME: Final = "port"
_SHAPE: Final = re.compile(r"[A-Za-z0-9_-]{43}")


class TokenFileError(ConfigError):
    """The token file exists but is not one this module wrote (mode or content)."""


def http_dir(home: Path) -> Path:
    """``$MACULA_HOME/http``, created 0700 if missing."""
    folder = home / DIR_NAME
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def token_path(home: Path) -> Path:
    return home / DIR_NAME / TOKEN_NAME


def port_path(home: Path) -> Path:
    return home / DIR_NAME / PORT_NAME


def last_port_path(home: Path) -> Path:
    """The port the listener had last (kept across stops: the next start asks for it again)."""
    return home / DIR_NAME / "last_port"


def read_token(path: Path) -> str:
    """The token in ``path``, refused (``TokenFileError``) when others can read the file or it
    does not hold one."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise TokenFileError(f"{path} is readable by others (mode {mode:o}): chmod 600 it")
    value = path.read_text(encoding="ascii", errors="replace").strip()
    if not _SHAPE.fullmatch(value):
        raise TokenFileError(f"{path} does not hold a token: remove it and a new one is made")
    return value


def token_file(path: Path) -> str:
    """The token in ``path`` (its folder made 0700 by the caller), made on first use with 32
    random bytes; a race between two makers keeps the first file."""
    if path.exists():
        return read_token(path)
    with contextlib.suppress(FileExistsError):  # another maker got there first: theirs wins
        write_private(path, secrets.token_urlsafe(32).encode("ascii") + b"\n", exclusive=True)
    return read_token(path)


def home_token(home: Path) -> str:
    """The home's token, made on first use."""
    path = token_path(home)
    if not path.exists():
        http_dir(home)
    return token_file(path)


def matches(presented: str | None, expected: str) -> bool:
    """Constant-time check of a presented token (``None`` or empty never matches)."""
    if not presented:
        return False
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode("ascii"))
