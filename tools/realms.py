"""Argument parsing shared by tool groups: realms and hex ids."""

from __future__ import annotations

from mcp_types import CallToolResult

from macula.wire.identity import ZERO_REALM
from tools.results import bad_argument


def parse_realm(realm: str | None) -> bytes | CallToolResult:
    """64 hex characters (any case) or None for the all-zero realm."""
    if realm is None or realm == "":
        return ZERO_REALM
    try:
        tag = bytes.fromhex(realm)
    except ValueError:
        return bad_argument("realm", "must be 64 hex characters")
    if len(tag) != 32:
        return bad_argument("realm", "must be 64 hex characters (32 bytes)")
    return tag


def parse_hex(name: str, value: str, size: int) -> bytes | CallToolResult:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        return bad_argument(name, f"must be {size * 2} hex characters")
    if len(raw) != size:
        return bad_argument(name, f"must be {size * 2} hex characters ({size} bytes)")
    return raw
