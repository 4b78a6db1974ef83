"""``mesh_audit``: the agent reads its own audit trail (``macula.agent.audit``), read-only.

Invariants:
- the tool reads the trail of the identity this server runs as, and nothing else: no argument
  names a file, a folder or another agent; the filters are a kind from ``KINDS``, seq and time
  bounds and a cursor ``a<seq>``, each checked (a bad one is ``invalid_argument``);
- nothing here writes: the trail is appended by the agent's own parts and the owner's CLI,
  never through a tool (the call to ``mesh_audit`` itself is recorded, like every call);
- a page by the one rule (``tools.groups.paging``): ``remaining`` and ``next_page``; entries
  show digests, never content (there is none in the trail).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.agent.audit import KINDS, AuditTrail
from macula.store.audit_log import entries, read_head
from tools.groups.paging import PageBudget, paged, size
from tools.groups.text_limits import Cursor
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import bad_argument
from tools.server.runtime import run_tool

MAX_MS = 2**53  # JSON's exact integers
MAX_SEQ = 2**53
MAX_ENTRIES = 200
DEFAULT_ENTRIES = 50
_CURSOR = re.compile(r"a(\d{1,16})\Z")
KIND_CHARS = max(len(kind) for kind in KINDS)


def _view(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: entry.get(key) for key in ("seq", "at_ms", "kind", "outcome", "facts", "hash")}


def read_page(
    directory: Path,
    after: int,
    *,
    kind: str | None,
    until_seq: int | None,
    since_ms: int | None,
    until_ms: int | None,
    limit: int,
) -> tuple[list[dict[str, Any]], int]:
    """The entries after seq ``after`` that pass the filters: a page, and how many more."""
    page: list[dict[str, Any]] = []
    remaining = 0
    budget = PageBudget()
    for entry in entries(directory, after):
        seq, at = int(entry["seq"]), int(entry.get("at_ms", 0))
        if until_seq is not None and seq > until_seq:
            break
        if kind is not None and entry.get("kind") != kind:
            continue
        if (since_ms is not None and at < since_ms) or (until_ms is not None and at > until_ms):
            continue
        view = _view(entry)
        if remaining or len(page) >= limit or not budget.admit(size(view)):
            remaining += 1
        else:
            page.append(view)
    return page, remaining


async def mesh_audit(
    ctx: Context,
    kind: Annotated[
        str | None, Field(max_length=KIND_CHARS, description="e.g. tool_called")
    ] = None,
    since_seq: Annotated[int | None, Field(ge=1, le=MAX_SEQ)] = None,
    until_seq: Annotated[int | None, Field(ge=1, le=MAX_SEQ)] = None,
    since_ms: Annotated[int | None, Field(ge=0, le=MAX_MS)] = None,
    until_ms: Annotated[int | None, Field(ge=0, le=MAX_MS)] = None,
    limit: Annotated[int, Field(ge=1, le=MAX_ENTRIES)] = DEFAULT_ENTRIES,
    cursor: Cursor = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    if kind is not None and kind not in KINDS:
        return bad_argument("kind", f"one of {', '.join(sorted(KINDS))}")
    if since_seq is not None and until_seq is not None and since_seq > until_seq:
        return bad_argument("since_seq", "must not be after until_seq")
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        return bad_argument("since_ms", "must not be after until_ms")
    after = (since_seq or 1) - 1
    if cursor is not None:
        found = _CURSOR.match(cursor)
        if found is None:
            return bad_argument("cursor", "must be a next_page cursor of mesh_audit")
        after = max(after, int(found.group(1)))
    args = {"kind": kind, "since_seq": since_seq, "until_seq": until_seq,
            "since_ms": since_ms, "until_ms": until_ms, "limit": limit}  # fmt: skip
    trail = runtime.agent.audit

    async def work() -> dict[str, Any]:
        if not isinstance(trail, AuditTrail):
            return {"recorded": 0, "entries": [], "remaining": 0, "next_page": None}
        directory = trail.directory
        page, remaining = await asyncio.to_thread(
            read_page, directory, after, kind=kind, until_seq=until_seq,
            since_ms=since_ms, until_ms=until_ms, limit=limit,
        )  # fmt: skip
        head = read_head(directory)
        following = args | ({"cursor": f"a{page[-1]['seq']}"} if page else {})
        return {
            "recorded": 1,
            "head_seq": head.seq if head else 0,
            "entries": page,
        } | paged(remaining, "mesh_audit", following)

    return await run_tool(runtime, "mesh_audit", args, work, mesh=False)


# every tool of this group, in tools/list order, with its hints
TOOLS = ((mesh_audit, hints(read_only=True, destructive=False, idempotent=True, open_world=False)),)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
