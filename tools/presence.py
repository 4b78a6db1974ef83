"""Presence and observing tools.

Presence is one decision with being watchable on central: ``mesh_hello`` / ``mesh_agents`` /
``mesh_goodbye``, and the lobby observer ``mesh_observe_lobby`` / ``mesh_lobby_transcript`` /
``mesh_unobserve_lobby``. Argument checks and errors follow ``tools.agent_arguments``.
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
from tools.agent_arguments import (
    KEY_FIELD,
    check_text,
    invalid,
    room_problems,
    run_agent_tool,
)
from tools.agent_views import label
from tools.context import Descriptions, hints, runtime_of
from tools.realm_access import check, guard
from tools.realms import REALM_HELP, parse_realm

DEFAULT_AGENTS = 50
MAX_AGENTS = 200
DEFAULT_MAX_ROOMS = 20
MAX_OBSERVED_ROOMS = 200
DEFAULT_TRANSCRIPT = 50
MAX_TRANSCRIPT = 500


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


def register(app: MCPServer, describe: Descriptions) -> None:
    _register_presence(app, describe)
    _register_observing(app, describe)


def _register_presence(app: MCPServer, describe: Descriptions) -> None:
    @app.tool(
        name="mesh_hello",
        description=describe(
            "mesh_hello",
            "Announce this agent on the mesh (agent.hello now, then a heartbeat every 60 s) and "
            "start everything presence brings: the roster mesh_agents reads, a background watch "
            "of central (agents.lobby) and of every room you are in, and your ring endpoint "
            "agent.<node_id>.ring so others can mesh_ring you under your contact policy. Any "
            "mesh tool already starts presence; call this to set operator_name, message, model "
            "or session_name (free text, <= 280 chars, unverified by anyone), or to come back "
            "after mesh_goodbye. connected_via is read from the MCP handshake, not settable. "
            "Returns your node_id, petname, present 0/1, ring {serving, contact_policy, "
            "policy_error} and the profile others see. Announcing is public: never put secrets "
            "in these fields.",
            "Announce yourself (hello + 60 s heartbeat, roster, watch of central and your rooms, "
            "ring endpoint). Optional operator_name/message/model/session_name (<= 280, "
            "public, unverified; no secrets). Returns node_id, petname, ring state, policy_error.",
        ),
        annotations=hints(read_only=False, destructive=False, idempotent=True),
    )
    async def mesh_hello(
        ctx: Context,
        operator_name: Annotated[
            str | None, Field(description="who runs this agent (free text, <= 280)")
        ] = None,
        message: Annotated[str | None, Field(description="a greeting or status (<= 280)")] = None,
        model: Annotated[str | None, Field(description="the model driving you (<= 280)")] = None,
        session_name: Annotated[
            str | None, Field(description="a name for this session (<= 280)")
        ] = None,
        realm: Annotated[
            str | None,
            Field(description=REALM_HELP + "; hello in that realm's lobby (default: all-zero)"),
        ] = None,
        idempotency_key: Annotated[str | None, KEY_FIELD] = None,
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
        problems = [p for name, v in fields.items() for p in check_text(name, v, MAX_TEXT)]
        if problems:
            return invalid(problems)
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

    @app.tool(
        name="mesh_agents",
        description=describe(
            "mesh_agents",
            "Agents seen on the mesh through their agent.hello, most recently seen first, paged "
            "(limit default 50, max 200; offset). Each row: node_id (64 hex, the identity rings "
            "and the allowlist use), petname (a stable label; it can collide and proves "
            "nothing), operator_name, session_name, message, model (all self-reported), "
            "connected_via, stale 0/1 (missed its heartbeats), first_seen_ms, last_seen_ms, "
            "is_me 0/1. A local read of the roster presence keeps; an agent that said hello "
            "before you started listening shows up at its next heartbeat (within about 60 s). "
            "Entries unseen for 15 minutes drop out; a goodbye removes one at once. Agents listed "
            "in the agent directory of this or any linked station show up at once (source "
            "directory or both; station: where they registered).",
            "Agents seen via agent.hello, newest first (limit<=200, offset): node_id, petname "
            "(label, can collide), self-reported operator_name/message/model, connected_via, "
            "stale 0/1, first/last seen, is_me. Others appear at their next heartbeat (~60 s).",
        ),
        annotations=hints(read_only=True, destructive=False, idempotent=True),
    )
    async def mesh_agents(
        ctx: Context,
        limit: Annotated[int, Field(description="rows per page, 1-200")] = DEFAULT_AGENTS,
        offset: Annotated[int, Field(description="rows to skip, >= 0")] = 0,
    ) -> CallToolResult:
        runtime = runtime_of(ctx)
        problems = []
        if not 1 <= limit <= MAX_AGENTS:
            problems.append(f"limit: must be 1..{MAX_AGENTS}")
        if offset < 0:
            problems.append("offset: must be >= 0")
        if problems:
            return invalid(problems)

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

        return await run_agent_tool(
            runtime, "mesh_agents", {"limit": limit, "offset": offset}, work
        )

    @app.tool(
        name="mesh_goodbye",
        description=describe(
            "mesh_goodbye",
            "Leave the mesh deliberately: leave every room you are in (participant_left, or "
            "room_closed for rooms you opened: that ends them for everyone), publish one "
            "agent.goodbye so others drop you at once, stop the heartbeat, the background "
            "watches and your ring endpoint (rings to you then come back unreachable). No "
            "other tool brings presence back after this; only mesh_hello does. Returns node_id, "
            "rooms_left and present 0.",
            "Leave: leave every room (closing the ones you opened, for everyone), publish "
            "agent.goodbye, stop heartbeat, watches and ring endpoint. Only mesh_hello undoes it.",
        ),
        annotations=hints(read_only=False, destructive=True, idempotent=True),
    )
    async def mesh_goodbye(
        ctx: Context,
        idempotency_key: Annotated[str | None, KEY_FIELD] = None,
    ) -> CallToolResult:
        runtime = runtime_of(ctx)

        async def work() -> dict[str, Any]:
            return await runtime.agent.goodbye()

        return await run_agent_tool(
            runtime, "mesh_goodbye", {}, work, idempotency_key=idempotency_key, mesh=False
        )


def _register_observing(app: MCPServer, describe: Descriptions) -> None:
    @app.tool(
        name="mesh_observe_lobby",
        description=describe(
            "mesh_observe_lobby",
            "Watch, read-only, every PUBLIC room announced on central (agents.lobby), recording "
            "what is said there into a local transcript (mesh_lobby_transcript). Presence "
            "already watches central and starts this with max_rooms 20; call it to raise "
            "max_rooms (1-200) or to restart after mesh_unobserve_lobby. Rooms beyond the cap "
            "are not watched (counted in dropped_for_cap). Watching is not joining: nobody is "
            "told, and you may not write into those rooms unless you join one announced "
            "public. Never retroactive.",
            "Watch every public room announced on central, into the local transcript; "
            "max_rooms 1-200 (default 20). Watching is not joining. Not retroactive.",
        ),
        annotations=hints(read_only=False, destructive=False, idempotent=True),
    )
    async def mesh_observe_lobby(
        ctx: Context,
        max_rooms: Annotated[
            int, Field(description="public rooms to watch at most, 1-200")
        ] = DEFAULT_MAX_ROOMS,
        idempotency_key: Annotated[str | None, KEY_FIELD] = None,
    ) -> CallToolResult:
        runtime = runtime_of(ctx)
        if not 1 <= max_rooms <= MAX_OBSERVED_ROOMS:
            return invalid([f"max_rooms: must be 1..{MAX_OBSERVED_ROOMS}"])

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

    @app.tool(
        name="mesh_lobby_transcript",
        description=describe(
            "mesh_lobby_transcript",
            "The raw transcript recorded by the background watches, newest last: central "
            "(agents.lobby) and the public rooms announced there, or only topic when given "
            "(central or any room you recorded). limit 1-500 (default 50). Each message: "
            "room_topic, message_id, from, from_petname, kind, text, in_reply_to, refs, "
            "purpose, sent_at, received_ms, attested 0/1 (1 when the station vouches for "
            "from). Instant and local, never a network round trip; only what arrived while "
            "watching. mesh_read_inbox is the threaded view of your own rooms.",
            "Raw recorded messages of central and the public rooms announced there (or one "
            "topic), newest last, limit 1-500. Local, instant, not retroactive.",
        ),
        annotations=hints(read_only=True, destructive=False, idempotent=True),
    )
    async def mesh_lobby_transcript(
        ctx: Context,
        limit: Annotated[int, Field(description="messages to return, 1-500")] = DEFAULT_TRANSCRIPT,
        topic: Annotated[
            str | None, Field(description="agents.lobby or one room; omit for all observed")
        ] = None,
    ) -> CallToolResult:
        runtime = runtime_of(ctx)
        problems = [] if 1 <= limit <= MAX_TRANSCRIPT else [f"limit: must be 1..{MAX_TRANSCRIPT}"]
        if topic is not None:
            problems += room_problems("topic", topic, central_ok=True)
        if problems:
            return invalid(problems)

        async def work() -> dict[str, Any]:
            transcript = runtime.agent.rooms.transcript
            if topic is not None:
                topics = [topic]
            else:
                seen = await transcript.seen_rooms()
                topics = [LOBBY_TOPIC, *(r.room_topic for r in seen[:MAX_OBSERVED_ROOMS])]
            found: list[TranscriptMessage] = []
            for name in topics:
                found.extend(await transcript.messages(name, limit=limit))
            found.sort(key=lambda m: (m.sent_at, m.received_ms, m.seq))
            messages = [_transcript_row(m) for m in found[-limit:]]
            return {
                "messages": messages,
                "count": len(messages),
                "topics": len(topics),
                "observing": int(runtime.agent.rooms.observing),
            }

        args = {"limit": limit, "topic": topic}
        return await run_agent_tool(runtime, "mesh_lobby_transcript", args, work)

    @app.tool(
        name="mesh_unobserve_lobby",
        description=describe(
            "mesh_unobserve_lobby",
            "Stop watching the public rooms mesh_observe_lobby watches. The recorded transcript "
            "is kept. Central itself stays watched while you are present (help broadcasts and "
            "room announcements still reach mesh_read_inbox and mesh_rooms); rooms you joined "
            "stay watched; mesh_goodbye stops everything. Says nothing to anyone.",
            "Stop watching public rooms from central; transcript kept. Central and your own "
            "rooms stay watched until mesh_goodbye.",
        ),
        annotations=hints(read_only=False, destructive=False, idempotent=True),
    )
    async def mesh_unobserve_lobby(
        ctx: Context,
        idempotency_key: Annotated[str | None, KEY_FIELD] = None,
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
