"""What ``macula-mcp attach`` and the daemon say before MCP flows: one JSON line each way.

The client (``attach``, ``daemon status``, ``daemon stop``) sends a preamble line, the daemon
answers one reply line; after an ``attach`` reply with ``ok`` 1, the connection carries the MCP
session's newline-delimited JSON-RPC, byte for byte, both ways.

Invariants:
- light: this module imports only the standard library's cheap parts (``attach`` must start
  fast and never import the MCP SDK or the mesh library);
- a preamble is one line of at most ``MAX_PREAMBLE`` bytes: ``{"macula": op, "version": str,
  "ppid": int, "env": {str: str}}``; anything else is a ``PreambleError`` naming what is wrong;
- ``env`` carries only the variables ``forwardable`` accepts (``MACULA_*`` and the harness
  session id): those that choose the identity and settings plain ``macula-mcp`` would use;
- ``status`` and ``stop`` are answered whatever the client's version (an old daemon can always
  be stopped); ``attach`` from another version is refused with ``version_mismatch``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tools.settings import PREFIX

PACKAGE_VERSION: Final = "0.1.0"  # pyproject's version (a unit test keeps them equal)
PROTOCOL: Final = 1  # bumped when this preamble or the daemon's behaviour changes
VERSION: Final = f"{PACKAGE_VERSION}+daemon{PROTOCOL}"
OPS: Final = ("attach", "status", "stop")
MAX_PREAMBLE: Final = 256 * 1024  # bytes of one preamble or reply line
SESSION_VARIABLES: Final = ("CLAUDE_CODE_SESSION_ID",)


class PreambleError(ValueError):
    """A preamble or reply line that is not what this protocol says (message says why)."""


@dataclass(frozen=True)
class Preamble:
    op: str
    version: str
    ppid: int
    env: dict[str, str]


def forwardable(name: str) -> bool:
    return name.startswith(PREFIX) or name in SESSION_VARIABLES


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of the harness's environment that chooses identity and settings."""
    return {name: value for name, value in env.items() if forwardable(name)}


def encode_preamble(op: str, env: Mapping[str, str], ppid: int) -> bytes:
    body = {"macula": op, "version": VERSION, "ppid": ppid, "env": forwarded_env(env)}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def _json_line(line: bytes, what: str) -> dict[str, Any]:
    if len(line) > MAX_PREAMBLE:
        raise PreambleError(f"the {what} is longer than {MAX_PREAMBLE} bytes")
    try:
        body = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PreambleError(f"the {what} is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise PreambleError(f"the {what} is not a JSON object")
    return body


def parse_preamble(line: bytes) -> Preamble:
    """The preamble in ``line`` (its newline optional), or ``PreambleError``."""
    body = _json_line(line, "preamble")
    op, version, ppid, env = (body.get(k) for k in ("macula", "version", "ppid", "env"))
    if op not in OPS:
        raise PreambleError(f"the preamble's 'macula' must be one of {', '.join(OPS)}")
    if not isinstance(version, str) or not 0 < len(version) <= 64:
        raise PreambleError("the preamble's 'version' must be a string of 1-64 characters")
    if not isinstance(ppid, int) or isinstance(ppid, bool) or ppid < 0:
        raise PreambleError("the preamble's 'ppid' must be a non-negative integer")
    if not isinstance(env, dict):
        raise PreambleError("the preamble's 'env' must be an object of strings")
    for name, value in env.items():
        if not isinstance(value, str):
            raise PreambleError(f"the preamble's env {name!r} is not a string")
        if not forwardable(name):
            raise PreambleError(f"the preamble's env {name!r} is not a variable attach forwards")
        if "\x00" in name or "\x00" in value:
            raise PreambleError(f"the preamble's env {name!r} contains a NUL character")
    return Preamble(op, version, ppid, dict(env))


def encode_reply(body: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(body), separators=(",", ":")).encode() + b"\n"


def parse_reply(line: bytes) -> dict[str, Any]:
    """The daemon's reply; ``ok`` 1, or ``ok`` 0 with ``code`` and ``detail``."""
    body = _json_line(line, "daemon's reply")
    refused_without_detail = body.get("ok") == 0 and not isinstance(body.get("detail"), str)
    if type(body.get("ok")) is not int or body["ok"] not in (0, 1) or refused_without_detail:
        raise PreambleError("the daemon's reply has no 'ok' 0/1 (or no 'detail' with 0)")
    return body


def mismatch_detail(daemon_version: str, client_version: str, socket: str) -> str:
    return (
        f"the daemon on {socket} is version {daemon_version}, this macula-mcp is "
        f"{client_version}: stop it with `macula-mcp daemon stop` (attach then starts this one)"
    )
