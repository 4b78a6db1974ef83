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
    """Every tool states each hint that departs from the protocol's cautious default
    (``readOnlyHint`` false, ``destructiveHint`` true, ``idempotentHint`` false, ``openWorldHint``
    true), and a tool that writes always states ``destructiveHint``. A hint left out means its
    default; ``destructiveHint`` and ``idempotentHint`` mean nothing on a read-only tool (spec)."""
    return ToolAnnotations(
        read_only_hint=True if read_only else None,
        destructive_hint=None if read_only else destructive,
        idempotent_hint=True if idempotent and not read_only else None,
        open_world_hint=False if not open_world else None,
    )


class Descriptions:
    """Full and terse descriptions of every tool; ``MACULA_MCP_TERSE_TOOLS=1`` serves terse."""

    def __init__(self, terse: bool) -> None:
        self.terse = terse
        self.all: dict[str, tuple[str, str]] = {}

    def __call__(self, name: str, full: str, terse: str) -> str:
        self.all[name] = (full, terse)
        return terse if self.terse else full
