"""Tool results: JSON text plus ``structuredContent``; failures shaped for a model to act on.

Invariants (every tool goes through here):
- no booleans anywhere in a result: they become 0/1 (the wire rule for what agents see);
- bytes become lowercase hex; results are bounded (about 24 KB of JSON): long lists are cut
  and the result carries ``truncated: 1`` with what was dropped;
- a failure is ``isError`` with ``{code, detail, retryable (0/1), next_action}`` — never a
  traceback. ``MaculaError`` subclasses map to codes in exactly one function, ``from_error``;
- ``invalid_argument`` comes only from argument checks: the schema boundary every call crosses
  first (``tools.server.arguments``) and a tool's own checks (``InvalidArgument``); any other
  exception that is not a ``MaculaError`` is a bug, logged with its traceback and answered as
  ``internal_error``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from mcp_types import CallToolResult, TextContent

from macula.errors import (
    BrokenError,
    CallTimeout,
    ClosedError,
    ConfigError,
    HandshakeError,
    MaculaError,
    MeshError,
)

log = logging.getLogger("macula.tools")

MAX_RESULT_BYTES = 24 * 1024
FIX_ARGUMENTS = "fix the arguments and call again"


class InvalidArgument(Exception):
    """A tool's own argument check failed; ``str(exc)`` names the argument and the problem."""

    code = "invalid_argument"
    next_action = FIX_ARGUMENTS


def plain(value: Any) -> Any:
    """``value`` with booleans as 0/1, bytes as hex, tuples/sets as lists."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    return value


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


def bounded(result: dict[str, Any], limit: int = MAX_RESULT_BYTES) -> dict[str, Any]:
    """Cut the longest lists (from the end) until the result fits; say so explicitly."""
    if _size(result) <= limit:
        return result
    result = dict(result)
    dropped: dict[str, int] = {}
    lists = sorted(
        (k for k, v in result.items() if isinstance(v, list)), key=lambda k: -_size(result[k])
    )
    for key in lists:
        items = list(result[key])
        while items and _size(result) > limit:
            items.pop()
            dropped[key] = dropped.get(key, 0) + 1
            result[key] = items
    if _size(result) > limit:  # one huge scalar: keep a prefix of its text form
        for key, value in result.items():
            if isinstance(value, str) and len(value) > limit // 2:
                result[key] = value[: limit // 2] + "…"
                dropped[key] = 1
    result["truncated"] = 1
    result["truncation"] = {"dropped": dropped, "limit_bytes": limit}
    return result


def ok(result: dict[str, Any]) -> CallToolResult:
    data = bounded(plain(result))
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False))],
        structured_content=data,
    )


def fail(
    code: str, detail: str, *, retryable: bool | int, next_action: str, **lists: Any
) -> CallToolResult:
    """The one shape of a tool error: ``{code, detail, retryable 0/1, next_action}``, then
    whatever of ``lists`` is given and not empty (``problems``, ``candidates``, a ``task``
    view), made plain and bounded like any result."""
    error: dict[str, Any] = {
        "code": code,
        "detail": detail,
        "retryable": int(retryable),
        "next_action": next_action,
    }
    error |= {key: value for key, value in lists.items() if not _empty(value)}
    error = bounded(plain(error))
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(error, ensure_ascii=False))],
        structured_content=error,
        is_error=True,
    )


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (list, tuple, dict)) and not value)


def bad_argument(name: str, problem: str) -> CallToolResult:
    return fail(
        "invalid_argument",
        f"{name}: {problem}",
        retryable=False,
        next_action=f"call again with a valid {name}",
    )


def from_error(exc: BaseException) -> CallToolResult:
    """The one place a library exception becomes a tool error."""
    if isinstance(exc, MeshError):
        action = "retry after a short backoff" if exc.retryable else "change the request"
        if exc.code == 0x01:
            action = (
                "nobody serves that procedure in that realm: check its name and realm "
                "(mesh_find_records_by_type); house services (macula.memory.*, "
                "macula.stations.*, macula.agents.*, macula.history.*) answer only in realm "
                "macula.house"
            )
        return fail(exc.name, str(exc), retryable=exc.retryable, next_action=action)
    if isinstance(exc, CallTimeout):
        return fail(
            "timeout",
            str(exc),
            retryable=True,
            next_action="retry with a longer timeout, or check that the other side is present",
        )
    if isinstance(exc, (BrokenError, HandshakeError)):
        return fail(
            "not_connected",
            str(exc),
            retryable=exc.retryable,
            next_action="the node is reconnecting to its station; retry in a few seconds",
        )
    if isinstance(exc, ClosedError):
        return fail("closed", str(exc), retryable=False, next_action="restart the MCP server")
    if isinstance(exc, ConfigError):
        return fail(
            "configuration",
            str(exc),
            retryable=False,
            next_action="fix the named setting and restart the server",
        )
    if isinstance(exc, MaculaError):
        return fail(
            "refused",
            str(exc),
            retryable=exc.retryable,
            next_action="read detail and adjust the call",
        )
    if isinstance(exc, InvalidArgument):
        return fail(exc.code, str(exc), retryable=False, next_action=exc.next_action)
    log.exception("tool failed unexpectedly", exc_info=exc)
    return fail(
        "internal_error",
        f"{type(exc).__name__}: {exc}",
        retryable=False,
        next_action="report this; the server logged the traceback on stderr",
    )
