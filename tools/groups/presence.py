"""Presence and observing tools.

Presence is one decision with being watchable on central: ``mesh_hello`` / ``mesh_agents`` /
``mesh_goodbye``, and the lobby observer ``mesh_observe_lobby`` / ``mesh_lobby_transcript`` /
``mesh_unobserve_lobby``. Argument checks and errors follow ``tools.groups.agent_arguments``.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.agent.envelope import LOBBY_TOPIC
from macula.agent.presence import HELLO_TOPIC, MAX_TEXT
from macula.agent.proof import ring_endpoint
from macula.store.transcript import TranscriptMessage
from tools.groups.agent_arguments import invalid, room_problems, run_agent_tool
from tools.groups.agent_views import label
from tools.groups.inbox_views import read_on
from tools.groups.paging import PageBudget, page_cursor, paged, parse_cursor, shortened, size
from tools.groups.realm_access import check, guard
from tools.groups.realms import parse_realm
from tools.groups.text_limits import ROOM_TOPIC_CHARS, Cursor, IdempotencyKey, Realm
from tools.server.arguments import MAX_INDEX
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import InvalidArgument

DEFAULT_AGENTS = 50
MAX_AGENTS = 200
DEFAULT_MAX_ROOMS = 20
MAX_OBSERVED_ROOMS = 200
DEFAULT_TRANSCRIPT = 50
MAX_TRANSCRIPT = 500
Text = Annotated[str | None, Field(max_length=MAX_TEXT)]  # what mesh_hello says of itself


def _transcript_row(message: TranscriptMessage) -> dict[str, Any]:
    return {
        "room_topic": message.room_topic,
        "message_id": message.message_id,
        "from": message.from_hex,
        "from_petname": label(message.from_hex),
        "kind": message.kind,
        "text": message.text,
        "in_reply_to": message.in_reply_to,
        "refs": list(message.refs) if message.refs else None,
        "purpose": message.purpose,
        "sent_at": message.sent_at,
        "received_ms": message.received_ms,
        "attested": message.attested,
    }


# -- the presence tools -------------------------------------------------------------------------


def _client_label(ctx: Context) -> str | None:
    """``connected_via``: the MCP client's own name and version from the handshake."""
    try:
        info = ctx.session.client_params.client_info
    except AttributeError:
        return None
    text = " ".join(str(x) for x in (info.name, info.version) if x).strip()
    return text[:MAX_TEXT] or None


async def mesh_hello(
    ctx: Context,
    operator_name: Annotated[Text, Field(description="who runs this agent")] = None,
    message: Text = None,
    model: Text = None,
    session_name: Text = None,
    realm: Annotated[Realm, Field(description="hello in that realm's lobby")] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    tag = None if realm is None else parse_realm(realm)
    if isinstance(tag, CallToolResult):
        return tag
    fields = {
        "operator_name": operator_name,
        "message": message,
        "model": model,
        "session_name": session_name,
    }
    via = _client_label(ctx)

    async def work() -> dict[str, Any]:
        agent = runtime.agent
        before = await guard(runtime, agent.presence.realm if tag is None else tag)
        view = await agent.hello(tag, **fields, connected_via=via)
        node_id = agent.node.identity.node_id
        return (
            view
            | await check(runtime, before)
            | {
                "topics": {
                    "hello": HELLO_TOPIC,
                    "central": LOBBY_TOPIC,
                    "ring_endpoint": ring_endpoint(node_id),
                },
                "heartbeat_seconds": agent.presence.profile.interval_seconds,
                "observing": int(agent.rooms.observing),
                "stations": [str(s) for s in runtime.stations],
            }
        )

    args = {k: v for k, v in fields.items() if v is not None}
    if realm is not None:
        args["realm"] = realm
    return await run_agent_tool(
        runtime, "mesh_hello", args, work, idempotency_key=idempotency_key, mesh=False
    )


async def mesh_agents(
    ctx: Context,
    limit: Annotated[int, Field(ge=1, le=MAX_AGENTS)] = DEFAULT_AGENTS,
    offset: Annotated[int, Field(ge=0, le=MAX_INDEX)] = 0,
) -> CallToolResult:
    runtime = runtime_of(ctx)

    async def work() -> dict[str, Any]:
        me = runtime.agent.node.identity.node_id.hex()
        rows = await runtime.agent.agents(limit, offset)
        for row in rows:
            row["is_me"] = int(row["node_id"] == me)
        return {
            "agents": rows,
            "count": len(rows),
            "limit": limit,
            "offset": offset,
            "next_offset": offset + len(rows) if len(rows) == limit else None,
        }

    return await run_agent_tool(runtime, "mesh_agents", {"limit": limit, "offset": offset}, work)


async def mesh_goodbye(
    ctx: Context,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)

    async def work() -> dict[str, Any]:
        return await runtime.agent.goodbye()

    return await run_agent_tool(
        runtime, "mesh_goodbye", {}, work, idempotency_key=idempotency_key, mesh=False
    )


async def mesh_observe_lobby(
    ctx: Context,
    max_rooms: Annotated[int, Field(ge=1, le=MAX_OBSERVED_ROOMS)] = DEFAULT_MAX_ROOMS,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)

    async def work() -> dict[str, Any]:
        rooms = runtime.agent.rooms
        count = await rooms.observe(max_rooms)
        return {
            "observing": 1,
            "max_rooms": max_rooms,
            "observed_rooms": count,
            "observed": rooms.observed(),
            "dropped_for_cap": rooms.stats["observer_rooms_dropped"],
        }

    return await run_agent_tool(
        runtime,
        "mesh_observe_lobby",
        {"max_rooms": max_rooms},
        work,
        idempotency_key=idempotency_key,
    )


async def mesh_lobby_transcript(
    ctx: Context,
    limit: Annotated[int, Field(ge=1, le=MAX_TRANSCRIPT)] = DEFAULT_TRANSCRIPT,
    topic: Annotated[
        str | None, Field(max_length=ROOM_TOPIC_CHARS, description="omit: all observed")
    ] = None,
    cursor: Cursor = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems: list[str] = []
    if topic is not None:
        problems += room_problems("topic", topic, central_ok=True)
    before = None
    if cursor is not None:
        try:
            at = parse_cursor(cursor)
            if at.text_offset is not None:
                raise InvalidArgument("cursor: a text cursor is read with mesh_read_inbox")
            before = at.seq
        except InvalidArgument as exc:
            problems.append(str(exc))
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        transcript = runtime.agent.rooms.transcript
        if topic is not None:
            topics = [topic]
        else:
            seen = await transcript.seen_rooms()
            topics = [LOBBY_TOPIC, *(r.room_topic for r in seen[:MAX_OBSERVED_ROOMS])]
        found, older = await transcript.before(topics, before, limit)
        rows = [shortened(_transcript_row(m), read_on(m.seq)) for m in found]
        kept = PageBudget().fit(size(row) for row in reversed(rows))  # the newest first
        messages, older = rows[len(rows) - kept :], older + len(rows) - kept
        arguments = {"limit": limit, "topic": topic}
        if messages:
            arguments["cursor"] = page_cursor(found[len(found) - kept].seq)
        return {
            "messages": messages,
            "count": len(messages),
            "topics": len(topics),
            "observing": int(runtime.agent.rooms.observing),
        } | paged(older, "mesh_lobby_transcript", arguments)

    args = {"limit": limit, "topic": topic, "cursor": cursor}
    return await run_agent_tool(runtime, "mesh_lobby_transcript", args, work)


async def mesh_unobserve_lobby(
    ctx: Context,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)

    async def work() -> dict[str, Any]:
        rooms = runtime.agent.rooms
        before = len(rooms.observed())
        await rooms.unobserve()
        return {"observing": 0, "stopped_rooms": before, "transcript_kept": 1}

    return await run_agent_tool(
        runtime, "mesh_unobserve_lobby", {}, work, idempotency_key=idempotency_key, mesh=False
    )


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_hello, hints(read_only=False, destructive=False, idempotent=True)),
    (mesh_agents, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_goodbye, hints(read_only=False, destructive=True, idempotent=True)),
    (mesh_observe_lobby, hints(read_only=False, destructive=False, idempotent=True)),
    (mesh_lobby_transcript, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_unobserve_lobby, hints(read_only=False, destructive=False, idempotent=True)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
