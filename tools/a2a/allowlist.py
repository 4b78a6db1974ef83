"""The owner's allowlist of A2A agents: table ``[a2a]`` of ``$MACULA_HOME/owner.toml``.

```toml
[a2a]
agents = [
  "http://127.0.0.1:9999/",                                  # an agent's base URL
  { url = "https://agents.example/reviewer/.well-known/agent-card.json", name = "reviewer" },
]
```

Invariants:
- Nothing else is dialled: a URL is allowed only if it equals (normalised) an entry here, and
  every request the outbound client makes must go to the origin (scheme, host, port) of the
  entry it serves (``tools.a2a.dial``).
- Fail closed: an unreadable file, bad TOML, an unknown key, a bad URL or name, or a file other
  users may write refuses every outbound A2A send; the error names the file and the key.
  No file, no table or no ``agents`` is an empty list (nothing allowed).
- The capability switches' loader owns the file and passes ``[a2a]`` through unvalidated; this
  module reads the table itself (stdlib only: no SDK import).
- An entry is a base URL (the Card at ``/.well-known/agent-card.json`` under it) or a Card URL
  (its path ends in ``.json``). http or https, a host, no user:password, no query or fragment.
"""

from __future__ import annotations

import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

OWNER_FILE: Final = "owner.toml"
TABLE: Final = "a2a"
A2A_URL_CHARS: Final = 512  # an allowlisted URL, and the mesh_task_send ``to`` that names one
MAX_AGENTS: Final = 64
NAME_PREFIX: Final = "a2a:"  # ``to="a2a:reviewer"`` names an entry by its name
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_ENTRY_KEYS: Final = frozenset({"url", "name"})


class AllowlistError(Exception):
    """The allowlist cannot be trusted: every outbound send is refused (fail closed)."""


@dataclass(frozen=True, slots=True)
class Agent:
    url: str  # normalised
    name: str | None = None

    @property
    def card_url(self) -> str:
        """Where its Agent Card is."""
        if is_card_url(self.url):
            return self.url
        return self.url.rstrip("/") + "/.well-known/agent-card.json"

    @property
    def origin(self) -> str:
        return origin_of(self.url)


@dataclass(frozen=True, slots=True)
class Allowlist:
    path: Path
    agents: tuple[Agent, ...] = ()

    def find(self, to: str) -> Agent | None:
        """The entry ``to`` names (a URL, or ``a2a:<name>``), or None."""
        if to.startswith(NAME_PREFIX):
            name = to[len(NAME_PREFIX) :]
            return next((a for a in self.agents if a.name == name), None)
        try:
            url = normalise(to)
        except ValueError:
            return None
        return next((a for a in self.agents if a.url == url), None)


def looks_like_a2a(to: str) -> bool:
    """``to`` addresses an A2A agent (a URL or ``a2a:<name>``), not a mesh peer."""
    lowered = to.strip().lower()
    return lowered.startswith(("http://", "https://", NAME_PREFIX))


def is_card_url(url: str) -> bool:
    return urlsplit(url).path.endswith(".json")


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def normalise(raw: str) -> str:
    """``raw`` as compared: lower-case scheme and host, a path (``/`` at least).
    ``ValueError`` says what is wrong with it."""
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("expected a URL")
    if len(raw) > A2A_URL_CHARS:
        raise ValueError(f"longer than {A2A_URL_CHARS} characters")
    if any(ord(c) < 0x21 or c == "\x7f" for c in raw):
        raise ValueError("spaces or control characters in the URL")
    parts = urlsplit(raw)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError("http:// or https:// only")
    if not parts.hostname:
        raise ValueError("no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("no user or password in the URL (secrets do not go in owner.toml)")
    if parts.query or parts.fragment:
        raise ValueError("no query or fragment")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("bad port") from None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme.lower(), netloc, parts.path or "/", "", ""))


def owner_file(home: Path) -> Path:
    return home / OWNER_FILE


def load(home: Path) -> Allowlist:
    """The allowlist of ``home``; ``AllowlistError`` (naming the file and key) if it is bad."""
    path = owner_file(home)
    try:
        info = path.stat()
    except FileNotFoundError:
        return Allowlist(path)
    except OSError as exc:
        raise AllowlistError(f"{path}: cannot read it: {exc.strerror}") from None
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise AllowlistError(
            f"{path}: other users may write it (mode {stat.S_IMODE(info.st_mode):o}); "
            f"chmod 600 {path}"
        )
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise AllowlistError(f"{path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise AllowlistError(f"{path}: not valid TOML: {exc}") from None
    return Allowlist(path, parse(document.get(TABLE), path))


def parse(table: Any, path: Path) -> tuple[Agent, ...]:
    """The entries of an ``[a2a]`` table (None: no table)."""
    if table is None:
        return ()
    if not isinstance(table, Mapping):
        raise AllowlistError(f"{path}: {TABLE}: expected a table")
    unknown = sorted(set(table) - {"agents"})
    if unknown:
        raise AllowlistError(f"{path}: {TABLE}.{unknown[0]}: unknown key (only agents)")
    raw = table.get("agents", [])
    if not isinstance(raw, list):
        raise AllowlistError(f"{path}: {TABLE}.agents: expected a list of URLs")
    if len(raw) > MAX_AGENTS:
        raise AllowlistError(f"{path}: {TABLE}.agents: at most {MAX_AGENTS} agents")
    agents: list[Agent] = []
    for index, item in enumerate(raw):
        agent = _entry(item, f"{path}: {TABLE}.agents[{index}]")
        if any(a.url == agent.url for a in agents):
            raise AllowlistError(f"{path}: {TABLE}.agents[{index}]: {agent.url} is listed twice")
        if agent.name is not None and any(a.name == agent.name for a in agents):
            raise AllowlistError(f"{path}: {TABLE}.agents[{index}].name: {agent.name!r} is taken")
        agents.append(agent)
    return tuple(agents)


def _entry(item: Any, where: str) -> Agent:
    name: Any = None
    if isinstance(item, Mapping):
        unknown = sorted(set(item) - _ENTRY_KEYS)
        if unknown:
            raise AllowlistError(f"{where}.{unknown[0]}: unknown key (url, name)")
        url, name = item.get("url"), item.get("name")
        if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
            raise AllowlistError(f"{where}.name: 1-32 of a-z 0-9 _ - (starting a-z 0-9)")
        where += ".url"
    else:
        url = item
    if not isinstance(url, str):
        raise AllowlistError(f"{where}: expected a URL (text)")
    try:
        return Agent(normalise(url), name)
    except ValueError as exc:
        raise AllowlistError(f"{where}: {exc}") from None
