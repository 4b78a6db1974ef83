"""The ``macula-mcp`` server: tool groups, resources and prompts over one runtime."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

import anyio
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, InputRequiredResult
from mcp_types import Tool as MCPTool
from pydantic import AnyUrl

from macula.agent.audit import outside_fact
from tools.groups import (
    content,
    dht,
    memory,
    presence,
    pubsub,
    realms,
    reservations,
    rings,
    rooms,
    rpc,
    tasks,
    text_limits,
)
from tools.groups.owner import approvals as owner_approvals
from tools.groups.owner import audit as audit_tools
from tools.owner.switchboard import (
    Switchboard,
    declare_list_changed,
    disabled,
    switchboard_for,
)
from tools.server import channel, surface
from tools.server.context import Descriptions
from tools.server.runtime import Runtime, open_runtime, station_names
from tools.server.runtime_gate import RETRY_BACKOFF, Problem, RuntimeGate
from tools.server.schema import SHARED, MeshServer
from tools.server.tool_search import mark_always_loaded
from tools.settings import terse_tools

GROUPS = (
    rpc,
    pubsub,
    content,
    dht,
    presence,
    rooms,
    rings,
    memory,
    reservations,
    realms,
    tasks,
    audit_tools,
    owner_approvals,
    surface,
)

# What the model reads at start (tool search shows it names and these instructions, cut at
# 2 KB): when to search for the mesh tools, which few stay loaded (tools.server.tool_search), the
# etiquette, and the parameters many tools share. Kept under 2048 bytes by a test.
INSTRUCTIONS = (
    "Macula mesh: other agents are present, reachable and talkative. Loaded at once: "
    "mesh_hello (announce yourself, first), mesh_read_inbox (what arrived), mesh_wait_room "
    "(block for the next message instead of sleeping), mesh_say (speak in a room you are in), "
    "mesh_ring (invite one agent into a room). Every other tool is named mesh_*: when the user "
    "mentions other agents, rooms, rings, tasks, shared memory or the mesh, search your tools "
    "for mesh and the area: rooms (mesh_open_room, mesh_join_room, mesh_leave_room, "
    "mesh_rooms), rings (mesh_wait_ring, mesh_answer_ring, mesh_trust_agent), who is here "
    "(mesh_agents, mesh_observe_lobby, mesh_goodbye), tasks (mesh_task_send, mesh_task_wait, "
    "mesh_task_get, mesh_task_complete), finding what was said (mesh_search), files you will "
    "edit in a shared repository (mesh_reserve_paths, mesh_reservations), memory "
    "(mesh_remember, mesh_recall), topics "
    "(mesh_publish, mesh_watch), procedures (mesh_call, mesh_serve), content (mesh_put, "
    "mesh_get), records (mesh_find_record), realms and stations (mesh_join_realm, "
    "mesh_list_stations), what your owner keeps (mesh_audit, mesh_approvals). "
    "Etiquette: payloads never carry booleans (use 0/1); names of facts are past-tense verbs; "
    "wait with the blocking tools (mesh_wait_room, mesh_wait_ring, mesh_watch) instead of sleeping "
    "and polling; ring an agent (mesh_ring) before talking to it, never write into a room nobody "
    "invited you to; rooms are unguessable, not secret; never paste secrets into the mesh. "
    "Parameters shared by many tools: " + "; ".join(SHARED.values()) + "."
)


class GatedServer(MeshServer):
    """The server whose tools wait at its ``RuntimeGate``: a runtime that is not open (yet)
    answers every tool call with its ``Problem`` instead of ending the session."""

    gate: RuntimeGate | None = None
    runtime: Runtime | None = None
    switchboard: Switchboard | None = None  # the owner's switches (tools.owner)

    async def list_tools(self) -> list[MCPTool]:
        """The tools the owner's switches leave on, read afresh."""
        tools = await super().list_tools()
        if self.switchboard is None:
            return tools
        switches = self.switchboard.current()
        return [tool for tool in tools if switches.allows(tool.name)]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        gate = self.gate
        if self.switchboard is not None and self._tool_manager.get_tool(name) is not None:
            switches = self.switchboard.current()  # every call: a client may hold an old list
            if not switches.allows(name):
                refused = disabled(name, switches)
                self._audited(name, arguments, outcome_code(refused))  # once the runtime is open
                return refused
        if gate is not None and self._tool_manager.get_tool(name) is not None:
            found = await gate.usable()
            if isinstance(found, Problem):
                return found.result()
        try:
            result = await super().call_tool(name, arguments, context)
        except asyncio.CancelledError:
            self._audited(name, arguments, "cancelled")
            raise
        except Exception:
            self._audited(name, arguments, "raised")
            raise
        self._audited(name, arguments, outcome_code(result))
        return result

    def _audited(self, name: str, arguments: dict[str, Any], outcome: str) -> None:
        """The trail's ``tool_called``: the tool (``"?"`` and a digest for a name that is no
        tool: a model must not write its own text into the trail), a digest of its arguments,
        the outcome."""
        runtime = self.runtime
        if runtime is not None:
            audit = runtime.agent.audit
            known = self._tool_manager.get_tool(name) is not None
            audit.record("tool_called", outcome, args_digest=audit.digest(arguments),
                         **outside_fact(audit, "name", name, known))  # fmt: skip

    async def read_resource(
        self, uri: AnyUrl | str, context: Context[Any, Any] | None = None
    ) -> Iterable[ReadResourceContents] | InputRequiredResult:
        """A resource read waits as a tool call does; ``mesh://status`` then says the problem,
        the others raise it (``tools.server.context.current_runtime``)."""
        if self.gate is not None:
            await self.gate.usable()
        return await super().read_resource(uri, context)


def outcome_code(result: CallToolResult | InputRequiredResult) -> str:
    """``ok``, the structured error's ``code``, or ``input_required``."""
    if not isinstance(result, CallToolResult):
        return "input_required"
    if not result.is_error:
        return "ok"
    code = (result.structured_content or {}).get("code")
    return code[:64] if isinstance(code, str) and code else "error"


def build_server(
    env: Mapping[str, str] | None = None,
    runtime: Callable[[], AbstractAsyncContextManager[Runtime]] | None = None,
    problem: Problem | None = None,
    only_problem: bool = False,
) -> MCPServer:
    """The server; its runtime is opened for it (``open_runtime``), or lent by ``runtime``
    (the daemon's, shared by every session of one agent), behind a ``RuntimeGate``: the
    handshake never waits for it, and ``problem`` (a bad setting found at start-up) is what
    the tools answer until it opens (``only_problem``: all they ever answer)."""
    environ = dict(os.environ if env is None else env)
    bad = problem.facts.get("variable") if problem else None
    shaping = {k: v for k, v in environ.items() if k != bad}  # a bad one cannot shape the tools
    describe = Descriptions(terse=terse_tools(shaping))
    binding: channel.ChannelBinding | None = None

    def opener(attempt: int) -> AbstractAsyncContextManager[Runtime]:
        if runtime is not None:
            return runtime()
        return open_runtime(environ, None if attempt == 0 else RETRY_BACKOFF)

    def using(opened: Runtime) -> AbstractAsyncContextManager[Any]:
        return channel.attached(binding, opened.agent)  # push into this session

    @contextlib.asynccontextmanager
    async def lifespan(server: MCPServer[Any]) -> AsyncIterator[RuntimeGate]:
        gate = RuntimeGate(
            None if only_problem else opener,
            stations=station_names(environ),
            using=using,
            problem=problem,
            env=environ,
        )
        gated = cast(GatedServer, server)
        gate.on_open.append(lambda opened: setattr(gated, "runtime", opened))
        async with gate, anyio.create_task_group() as watching:
            gated.gate = gate
            watching.start_soon(board.watch, server._subscriptions)  # owner.toml changes
            try:
                yield gate
            finally:
                watching.cancel_scope.cancel()
                gated.gate = None
                gated.runtime = None

    app: MCPServer[Any] = GatedServer(
        name="macula-mcp",
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        version="0.1.0",
        terse=describe.terse,
        task_limits=text_limits.task_limits(shaping),
    )
    binding = channel.install(app, shaping)  # None with MACULA_MCP_CHANNEL=0
    board = switchboard_for(environ)
    cast(GatedServer, app).switchboard = board
    app._lowlevel_server.middleware.append(board)
    declare_list_changed(app)
    for group in GROUPS:
        group.register(app, describe)
    mark_always_loaded(app)
    app.descriptions = describe  # type: ignore[attr-defined]
    return app
