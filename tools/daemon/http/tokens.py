"""Bearer tokens for MCP over HTTP: one token, one identity.

- the home token (``tools.daemon.http.home_token.home_token``) is the home's default agent: the key
file
  ``$MACULA_HOME/agents/default.key`` (as ``MACULA_MCP_AGENT=default``);
- an agent token (``macula-mcp http-token --agent NAME``) is agent NAME
  (``$MACULA_HOME/agents/NAME.key``): a second token per agent when the daemon hosts several.

Invariants:
- agent tokens live in ``$MACULA_HOME/http/agents/NAME.token``, 0600 files in 0700 folders,
  32 random bytes (URL-safe base64), created on first use; a file of the wrong mode or shape is
  refused (``TokenFileError``), never rewritten;
- every check reads the files again (a removed file revokes its token at once) and compares
  each token in constant time; nothing here logs a token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from macula.config import AGENT_ENV, HOME_ENV, IDENTITY_ENV, SESSION_ENV
from macula.errors import ConfigError
from tools.daemon.http.home_token import (
    TokenFileError,
    home_token,
    http_dir,
    matches,
    read_token,
    token_file,
)

AGENTS_DIR: Final = "agents"
SUFFIX: Final = ".token"
DEFAULT_AGENT: Final = "default"
_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_agent_name(name: str) -> str:
    """``name`` when it is a valid agent name (as ``MACULA_MCP_AGENT`` takes), else ConfigError."""
    if not _NAME.fullmatch(name):
        raise ConfigError(f"agent name {name!r}: use 1-64 letters, digits, '-' or '_'")
    return name


def agents_dir(home: Path) -> Path:
    folder = http_dir(home) / AGENTS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def agent_token_path(home: Path, name: str) -> Path:
    return home / "http" / AGENTS_DIR / f"{check_agent_name(name)}{SUFFIX}"


def agent_token(home: Path, name: str) -> str:
    """Agent ``name``'s token, made on first use (a race between two makers keeps the first)."""
    path = agent_token_path(home, name)
    if not path.exists():
        agents_dir(home)
    return token_file(path)


@dataclass(frozen=True)
class Bearer:
    """Whom a token stands for: an agent name (``default`` for the home token)."""

    agent: str

    def session_env(self, daemon_env: Mapping[str, str], home: Path) -> dict[str, str]:
        """The environment a session of this agent runs with: the daemon's, with this identity
        (whatever identity the daemon's own environment named is dropped)."""
        env = {k: v for k, v in daemon_env.items() if k not in (IDENTITY_ENV, SESSION_ENV)}
        env[HOME_ENV] = str(home)
        env[AGENT_ENV] = self.agent
        return env


class TokenBook:
    """The tokens of one home, read afresh at each check."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def identify(self, presented: str | None) -> Bearer | None:
        """The bearer ``presented`` stands for, or None (no token, or no such token)."""
        if not presented:
            return None
        found: Bearer | None = None
        if matches(presented, home_token(self.home)):
            found = Bearer(DEFAULT_AGENT)
        folder = self.home / "http" / AGENTS_DIR
        for path in sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []:
            try:
                expected = read_token(path)
            except (OSError, TokenFileError):
                continue  # a damaged file grants nothing
            name = path.name[: -len(SUFFIX)]
            if matches(presented, expected) and found is None and _NAME.fullmatch(name):
                found = Bearer(name)
        return found
