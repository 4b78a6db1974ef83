"""Who may speak MCP over HTTP to the daemon: pure checks of one request's headers.

Invariants:
- the ``Host`` must name a loopback address (127.0.0.0/8, ``localhost``, ``[::1]``) and an
  ``Origin``, when sent, a loopback ``http``/``https`` origin: the transport spec's advice
  against DNS rebinding (a page elsewhere that resolves its name to 127.0.0.1 sends its own
  name); a request that fails gets 403 (Origin) or 421 (Host), before the token is looked at;
- a missing or unknown token gets 401 with ``WWW-Authenticate: Bearer`` (RFC 6750), and
  ``error="invalid_token"`` when one was presented; the token itself never appears in an
  answer or a log line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

from macula.stations import is_loopback_host

REALM: Final = 'Bearer realm="macula"'


def host_allowed(host: str | None) -> bool:
    """The ``Host`` header names a loopback address (with or without a port)."""
    if not host:
        return False
    try:
        parts = urlsplit(f"//{host}")
        name, _ = parts.hostname, parts.port  # .port raises on a bad port
    except ValueError:
        return False
    return name is not None and is_loopback_host(name)


def origin_allowed(origin: str | None) -> bool:
    """No ``Origin`` (not a browser), or a loopback one."""
    if origin is None:
        return True
    try:
        parts = urlsplit(origin)
        name, _ = parts.hostname, parts.port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and name is not None and is_loopback_host(name)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of ``Authorization: Bearer TOKEN`` (scheme case-insensitive), else None."""
    value = headers.get("authorization", "")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def refusal(
    status: int, message: str, presented: bool = False
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a refused request: a JSON-RPC error without an id."""
    headers = {"content-type": "application/json"}
    if status == 401:
        headers["www-authenticate"] = REALM + (', error="invalid_token"' if presented else "")
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    return status, headers, json.dumps(body).encode()
