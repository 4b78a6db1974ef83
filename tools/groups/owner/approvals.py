"""``mesh_approvals``: what waits in the owner's approval queue, as metadata only (issue 39).

Invariants:
- read-only: nothing here (and no tool anywhere) approves or denies; the owner decides with
  ``macula-mcp approvals`` or in the console;
- an item is shown as id, kind, sender, petname, size, age and time left: never its content
  (``macula.store.approvals.Item.metadata``);
- a bounded page (``limit``, ``offset``) that says how many items wait in all.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from tools.groups.agent_arguments import run_agent_tool
from tools.server.context import Descriptions, hints, register_tools, runtime_of

MAX_PAGE = 50
NEXT = (
    "only the owner decides: `macula-mcp approvals approve|deny ID` or the console; tell "
    "your user if something waits"
)


async def mesh_approvals(
    ctx: Context,
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE, description="items per page")] = 20,
    offset: Annotated[int, Field(ge=0, le=100_000, description="items to skip")] = 0,
) -> CallToolResult:
    runtime = runtime_of(ctx)

    async def work() -> dict[str, Any]:
        approvals = runtime.agent.approvals
        now = approvals.clock()
        items = await approvals.pending(limit=limit, offset=offset)
        total = await approvals.count_pending()
        settings = approvals.settings()
        return {
            "pending": [item.metadata(now) for item in items],
            "total": total,
            "left": max(0, total - offset - len(items)),
            "tasks_from_strangers": settings.tasks_from_strangers,
            "rings_when_asked": settings.rings_when_asked,
            "settings_error": settings.error,
            "next": NEXT,
        }

    args = {"limit": limit, "offset": offset}
    return await run_agent_tool(runtime, "mesh_approvals", args, work, mesh=False)


TOOLS = ((mesh_approvals, hints(read_only=True, destructive=False, idempotent=True)),)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
