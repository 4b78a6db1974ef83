"""A depth guard in front of the MCP SDK's stdio reader.

The SDK's reader parses each incoming line; a line nested deeper than its parser takes (about
190 levels) fails to parse, and the request is never answered: the client waits forever. So
every line is measured first, with a cheap scan of bracket depth outside JSON strings (no
parse), and a line nested past ``MAX_REQUEST_DEPTH`` never reaches the SDK: it is answered
with a JSON-RPC error (-32600, invalid request) carrying the request's own id when one can be
read at its top level, and the session goes on.

Invariants:
- no legitimate request is refused: a frame's payload nests at most 99 levels
  (``macula.client.send_limits``) and a tool call wraps its arguments in four more;
- a line is scanned in C (``str.count``, regular expressions) unless it holds at least
  ``MAX_REQUEST_DEPTH`` opening brackets; only those are walked bracket by bracket;
- the refusal goes out through the SDK's own write stream, so it never tears another message.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, cast

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError

log = logging.getLogger("macula.tools")

MAX_REQUEST_DEPTH = 128
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]|[^\s\[\]{}:,"]+', re.DOTALL)


def too_deep(line: str, limit: int = MAX_REQUEST_DEPTH) -> bool:
    """Whether ``line`` nests arrays/objects more than ``limit`` levels (outside strings)."""
    if line.count("[") + line.count("{") <= limit:
        return False  # every level opens with a bracket: cannot be deeper
    depth = 0
    for bracket in _BRACKETS.findall(_STRING.sub('""', line)):
        if bracket in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def top_level_id(line: str) -> str | int | None:
    """The ``id`` member of the top-level object of ``line``, when it is a string or an
    integer; None when there is none or it cannot be read."""
    depth = 0
    tokens = _TOKEN.finditer(line)
    for match in tokens:
        token = match.group()
        if token in "[{":
            depth += 1
        elif token in "]}":
            depth -= 1
        elif depth == 1 and token == '"id"':
            colon, value = next(tokens, None), next(tokens, None)
            if colon is None or colon.group() != ":" or value is None:
                return None
            return _id_value(value.group())
    return None


def _id_value(token: str) -> str | int | None:
    try:
        value = json.loads(token)
    except ValueError:
        return None
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def refusal(line: str, limit: int = MAX_REQUEST_DEPTH) -> JSONRPCError:
    return JSONRPCError(
        jsonrpc="2.0",
        id=top_level_id(line),
        error=ErrorData(
            code=INVALID_REQUEST,
            message=(
                f"request nested deeper than {limit} levels of arrays/objects: refused "
                "before parsing; flatten the arguments (a mesh payload nests at most 99)"
            ),
        ),
    )


class GuardedLines:
    """``lines`` with every line nested too deep answered (through ``bind``'s stream) instead
    of passed on, as the SDK's stdio transport iterates its stdin."""

    def __init__(self, lines: AsyncIterable[str], limit: int = MAX_REQUEST_DEPTH) -> None:
        self.lines = lines
        self.limit = limit
        self.refused = 0
        self._bound = anyio.Event()
        self._write: Any = None

    def bind(self, write_stream: Any) -> None:
        """Where refusals go: the SDK's write stream, once ``stdio_server`` opened it."""
        self._write = write_stream
        self._bound.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._guarded()

    async def _guarded(self) -> AsyncIterator[str]:
        async for line in self.lines:
            if not too_deep(line, self.limit):
                yield line
                continue
            self.refused += 1
            log.warning("refused a request nested deeper than %d levels", self.limit)
            await self._bound.wait()
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await self._write.send(SessionMessage(refusal(line, self.limit)))


async def serve_guarded(app: MCPServer, lines: AsyncIterable[str], sink: Any) -> None:
    """Run ``app`` over ``lines`` and ``sink`` (what ``stdio_server`` takes) behind the guard."""
    guarded = GuardedLines(lines)
    async with stdio_server(cast(Any, guarded), sink) as (read_stream, write_stream):
        guarded.bind(write_stream)
        lowlevel = app._lowlevel_server  # as MCPServer.run_stdio_async does
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
