"""The A2A door's clients: one bearer token and one mesh identity per A2A client, made and revoked
by the owner (``macula-mcp a2a-token create|list|revoke``).

Layout (``$MACULA_HOME/a2a/clients/``, a 0700 folder in the 0700 ``$MACULA_HOME/a2a``):
- ``NAME.json`` (0600): ``{name, agent, node_id, token_sha256, created_ms}``: the token itself is
  never stored, only its SHA-256 (it is 32 random bytes: a plain hash is enough, nothing to
  brute-force);
- ``NAME.key`` (0600): the client's mesh identity, the requester of every task it hands over
  (so the agent's contact policy decides about it as about any mesh sender).

Invariants:
- a token reaches one agent (``agent``, a ``MACULA_MCP_AGENT`` name, ``default`` for the home's);
- every check reads the files again: a revoked client (its files removed) is refused at once;
  hashes are compared in constant time; nothing here logs a token;
- stdlib and ``macula`` only (the CLI imports it; the SDK is not loaded for it).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from macula.errors import ConfigError
from macula.keyfile import load_identity, load_or_create_identity
from macula.private_file import private_dir, write_private

PREFIX: Final = "a2a_"
_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOKEN: Final = re.compile(r"a2a_[A-Za-z0-9_-]{43}")


@dataclass(frozen=True, slots=True)
class Client:
    """One A2A client: its name, the agent its token reaches, its mesh node id (hex)."""

    name: str
    agent: str
    node_id: str
    created_ms: int


def check_name(what: str, name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{what} {name!r}: use 1-64 letters, digits, '-' or '_'")
    return name


def a2a_dir(home: Path) -> Path:
    """``$MACULA_HOME/a2a``, 0700 (made so, or tightened if an earlier version left it 0755)."""
    folder = private_dir(home / "a2a")
    if folder.stat().st_mode & 0o077:
        folder.chmod(0o700)
    return folder


def clients_dir(home: Path) -> Path:
    return private_dir(a2a_dir(home) / "clients")


def key_path(home: Path, name: str) -> Path:
    return home / "a2a" / "clients" / f"{check_name('client name', name)}.key"


def _record_path(home: Path, name: str) -> Path:
    return home / "a2a" / "clients" / f"{check_name('client name', name)}.json"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def create(home: Path, name: str, agent: str, now_ms: int) -> tuple[Client, str]:
    """A new client ``name`` for ``agent``: its record, identity, and the token (shown once)."""
    check_name("agent name", agent)
    record = _record_path(home, name)
    clients_dir(home)
    if record.exists():
        raise ConfigError(
            f"A2A client {name!r} exists: revoke it first (macula-mcp a2a-token revoke {name})"
        )
    identity = load_or_create_identity(key_path(home, name))
    token = PREFIX + secrets.token_urlsafe(32)
    body: dict[str, str | int] = {
        "name": name,
        "agent": agent,
        "node_id": identity.node_id.hex(),
        "token_sha256": token_digest(token),
        "created_ms": now_ms,
    }
    write_private(record, json.dumps(body, sort_keys=True).encode(), exclusive=True)
    return Client(name, agent, identity.node_id.hex(), now_ms), token


def _read(path: Path) -> tuple[Client, str] | None:
    """A record and its token hash, or None when it is damaged (a damaged one grants nothing)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if path.stat().st_mode & 0o077:
            return None
        body = json.loads(path.read_text(encoding="utf-8"))
        client = Client(
            str(body["name"]), str(body["agent"]), str(body["node_id"]), int(body["created_ms"])
        )
        if client.name == path.stem and _NAME.fullmatch(client.agent):
            return client, str(body["token_sha256"])
    return None


def clients(home: Path) -> list[Client]:
    """Every client of the home, by name."""
    folder = home / "a2a" / "clients"
    found = [_read(path) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return [entry[0] for entry in found if entry is not None]


def revoke(home: Path, name: str) -> bool:
    """Remove client ``name`` (its token stops working at once); False if there was none."""
    record = _record_path(home, name)
    existed = record.exists()
    record.unlink(missing_ok=True)
    key_path(home, name).unlink(missing_ok=True)
    return existed


def identify(home: Path, presented: str | None) -> Client | None:
    """The client ``presented`` (a bearer token) belongs to, or None."""
    if not presented or not _TOKEN.fullmatch(presented):
        return None
    wanted = token_digest(presented)
    folder = home / "a2a" / "clients"
    found: Client | None = None
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        entry = _read(path)
        if entry is not None and hmac.compare_digest(entry[1], wanted) and found is None:
            found = entry[0]
    return found


def client_identity_path(home: Path, client: Client) -> Path:
    """The key file of ``client`` (checked to be the node id its record names)."""
    path = key_path(home, client.name)
    if load_identity(path).node_id.hex() != client.node_id:
        raise ConfigError(f"A2A client {client.name!r}: its key is not the one it was made with")
    return path
