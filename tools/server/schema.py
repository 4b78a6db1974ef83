"""What ``tools/list`` says of each tool's parameters: the SDK's JSON Schema, compacted.

Invariants:
- only what a client does not need to fill in arguments is dropped, never a constraint:
  pydantic's ``title`` fields (the parameter's own name, title-cased), the ``null`` option of an
  optional parameter's ``anyOf`` (``anyOf [T, null]`` becomes ``T``, ``anyOf [T, U, null]``
  ``anyOf [T, U]``: optional already means "not in ``required``") and its ``default: null``.
  Types, ``required``, other defaults and every parameter stay; names and meanings are
  unchanged.
- arguments are still validated by the SDK's pydantic model of the function
  (``Tool.fn_metadata``), first at one boundary (``tools.server.arguments``, from ``call_tool``):
  text is kept as text and every schema-level failure is a structured ``invalid_argument``; a
  client sending ``null`` for an optional parameter still works.
- the parameters many tools share (``SHARED``) carry no description of their own: their rule
  is said once, in the server instructions (``tools.server.server.INSTRUCTIONS``).
- with terse descriptions (``MACULA_MCP_TERSE_TOOLS=1``) a parameter keeps its description
  only when it holds a caveat (``TERSE_KEPT``: what a 0/1 flag does, what runs where, what
  cannot be undone).
- every bound comes from the parameter's declaration in the tool function's signature
  (``Field(max_length=..., ge=..., le=...)``, written into the schema by pydantic), the one the
  argument boundary checks; nothing here adds one, but the task limits (``TaskBound``, from the
  server's environment) and drops one only where the parameter's ``SHARED`` rule states that
  very limit once (``LIMIT_SAID_ONCE``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp_types import CallToolResult, InputRequiredResult
from mcp_types import Tool as MCPTool

from macula.agent.task_messages import TaskLimits
from tools.groups import text_limits
from tools.server import arguments as tool_arguments

# parameter name -> its rule, said once in the server instructions
# (tools.server.server.INSTRUCTIONS)
SHARED = {
    "idempotency_key": f"idempotency_key (1-{text_limits.MAX_IDEMPOTENCY_KEY} chars): a retry "
    "with the same key returns the first result instead of acting again",
    "realm": f"realm (<= {text_limits.REALM_CHARS} chars): a realm name or 64 hex tag, default "
    "the all-zero public realm",
    "task_id": "task_id: from mesh_task_send or mesh_task_list",
    "cursor": "lists come in pages: remaining counts what is past a page, next_page is the "
    f"call that returns the rest (cursor, <= {text_limits.CURSOR_CHARS} chars, included), null "
    "when none is left",
}

# parameters whose length limit their ``SHARED`` rule states once: no ``maxLength`` in each of
# the 23 and 10 schemas that have them (tests/unit/tools/server/test_text_limits.py holds rule and
# limit equal)
LIMIT_SAID_ONCE: Mapping[str, int] = {
    "idempotency_key": text_limits.MAX_IDEMPOTENCY_KEY,
    "realm": text_limits.REALM_CHARS,
    "cursor": text_limits.CURSOR_CHARS,
}

# (tool, parameter) whose description stays with terse descriptions too
TERSE_KEPT = frozenset(
    {
        ("mesh_call", "args"),
        ("mesh_call", "direct"),
        ("mesh_serve", "exec"),
        ("mesh_serve", "announce"),
        ("mesh_serve", "allow"),
        ("mesh_publish", "fact"),
        ("mesh_open_room", "public"),
        ("mesh_open_room", "private"),
        ("mesh_ring", "private"),
        ("mesh_leave_room", "close"),
        ("mesh_leave_room", "remove"),
        ("mesh_read_inbox", "peek"),
        ("mesh_answer_ring", "answer"),
        ("mesh_say", "text"),
    }
)


def compact(schema: Any) -> Any:
    """``schema`` without titles, without the ``null`` option of an ``anyOf`` (``T`` for
    ``anyOf [T, null]``) and without its ``default: null``."""
    if isinstance(schema, list):
        return [compact(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):  # parameter names: never dropped
            out[key] = {name: compact(spec) for name, spec in value.items()}
        elif not (key == "title" and isinstance(value, str)):
            out[key] = compact(value)
    options = out.get("anyOf")
    if isinstance(options, list) and len(options) >= 2 and {"type": "null"} in options:
        kept = [option for option in options if option != {"type": "null"}]
        if "default" in out and out["default"] is None:
            del out["default"]
        if len(kept) == 1:
            del out["anyOf"]
            out = {**kept[0], **out}
        else:
            out["anyOf"] = kept
    return out


def tool_schema(
    tool: str,
    schema: dict[str, Any],
    terse: bool,
    task_bounds: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The input schema ``tool`` is listed with (``task_bounds``: each ``TaskBound``
    parameter's limit on this server, ``tools.server.arguments.task_bounds``)."""
    out: dict[str, Any] = compact(schema)
    for name, spec in out.get("properties", {}).items():
        if not isinstance(spec, dict):
            continue
        if terse and (tool, name) not in TERSE_KEPT:
            spec.pop("description", None)
        for arm in [spec, *spec.get("anyOf", [])]:
            if not isinstance(arm, dict) or arm.get("type") != "string":
                continue
            if task_bounds and name in task_bounds:
                arm["maxLength"] = task_bounds[name]
            if name in LIMIT_SAID_ONCE and arm.get("maxLength") == LIMIT_SAID_ONCE[name]:
                del arm["maxLength"]
    return out


class MeshServer(MCPServer[Any]):
    """``MCPServer`` whose ``tools/list`` carries compacted input schemas and whose tool calls
    cross one argument boundary (``tools.server.arguments``) before the SDK runs the tool."""

    def __init__(
        self,
        *args: Any,
        terse: bool = False,
        task_limits: TaskLimits | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.terse_schemas = terse
        self.task_limits = TaskLimits() if task_limits is None else task_limits

    def _task_bounds(self, name: str) -> dict[str, int]:
        tool: Tool | None = self._tool_manager.get_tool(name)
        return {} if tool is None else tool_arguments.task_bounds(tool, self.task_limits)

    async def list_tools(self) -> list[MCPTool]:
        return [
            tool.model_copy(
                update={
                    "input_schema": tool_schema(
                        tool.name,
                        tool.input_schema,
                        self.terse_schemas,
                        self._task_bounds(tool.name),
                    )
                }
            )
            for tool in await super().list_tools()
        ]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        tool = self._tool_manager.get_tool(name)
        if tool is None:
            return tool_arguments.unknown_tool(name)
        found = tool_arguments.problems(tool, arguments, self.task_limits)
        if found:
            return tool_arguments.refusal(found)
        return await super().call_tool(name, arguments, context)
