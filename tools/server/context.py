"""How a tool reaches the runtime, and how it declares itself (annotations, full/terse text).

Invariants:
- every tool is a module-level typed async function named as the tool; a group's ``register``
  only lists its tools with their hints (``register_tools``);
- a tool's full and terse descriptions live in its group's data file,
  ``tools/groups/descriptions/<group>.toml`` (a table per tool with ``full`` and ``terse``), read
  with
  ``tomllib`` through ``importlib.resources`` so they ship in the wheel.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

from tools.server.runtime import Runtime


def runtime_of(ctx: Context[Any, Any]) -> Runtime:
    runtime = ctx.request_context.lifespan_context
    runtime = getattr(runtime, "runtime", runtime)  # a RuntimeGate's open runtime
    assert isinstance(runtime, Runtime), "the server was built without its runtime"
    return runtime


def current_runtime(app: Any) -> Runtime:
    """The runtime of a running server, for handlers that get no context (static resources)."""
    runtime = getattr(app, "runtime", None)
    if not isinstance(runtime, Runtime):
        problem = getattr(getattr(app, "gate", None), "problem", None)  # tools.server.runtime_gate
        if problem is not None:
            raise RuntimeError(f"{problem.code}: {problem.detail} ({problem.next_action})")
        raise RuntimeError("the mesh is not usable yet (mesh://status says why)")
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


def description_files() -> dict[str, tuple[str, str]]:
    """Every tool's (full, terse) description, from ``tools/groups/descriptions/*.toml``."""
    texts: dict[str, tuple[str, str]] = {}
    folder = resources.files("tools.groups").joinpath("descriptions")
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".toml"):
            continue
        for name, table in tomllib.loads(entry.read_text(encoding="utf-8")).items():
            if name in texts:
                raise ValueError(f"{entry.name}: {name} is described twice")
            texts[name] = (str(table["full"]), str(table["terse"]))
    return texts


class Descriptions:
    """Full and terse descriptions of every tool; ``MACULA_MCP_TERSE_TOOLS=1`` serves terse.
    ``all`` holds those of the tools registered so far."""

    def __init__(self, terse: bool) -> None:
        self.terse = terse
        self.all: dict[str, tuple[str, str]] = {}
        self.texts = description_files()

    def __call__(self, name: str) -> str:
        full, terse = self.texts[name]
        self.all[name] = (full, terse)
        return terse if self.terse else full


Tool = Callable[..., Any]


def register_tools(
    app: MCPServer[Any], describe: Descriptions, tools: Sequence[tuple[Tool, ToolAnnotations]]
) -> None:
    """Register each ``(tool, hints)`` under the tool function's name, in order, described by
    its group's data file."""
    for tool, hinted in tools:
        name = tool.__name__
        app.add_tool(tool, name=name, description=describe(name), annotations=hinted)
