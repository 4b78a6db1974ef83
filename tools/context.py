"""How a tool reaches the runtime, and how it declares itself (annotations, full/terse text)."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp_types import ToolAnnotations

from tools.runtime import Runtime


def runtime_of(ctx: Context[Any, Any]) -> Runtime:
    runtime = ctx.request_context.lifespan_context
    assert isinstance(runtime, Runtime), "the server was built without its runtime"
    return runtime


def current_runtime(app: Any) -> Runtime:
    """The runtime of a running server, for handlers that get no context (static resources)."""
    runtime = getattr(app, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise RuntimeError("the server is not running")
    return runtime


def hints(
    *, read_only: bool, destructive: bool, idempotent: bool, open_world: bool = True
) -> ToolAnnotations:
    """Every tool states all four hints explicitly."""
    return ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )


class Descriptions:
    """Full and terse descriptions of every tool; ``MACULA_MCP_TERSE_TOOLS=1`` serves terse."""

    def __init__(self, terse: bool) -> None:
        self.terse = terse
        self.all: dict[str, tuple[str, str]] = {}

    def __call__(self, name: str, full: str, terse: str) -> str:
        self.all[name] = (full, terse)
        return terse if self.terse else full
