"""Presence and observing tools, and what the agent tool groups share.

Presence is one decision with being watchable on central: ``mesh_hello`` / ``mesh_agents`` /
``mesh_goodbye``, and the lobby observer ``mesh_observe_lobby`` / ``mesh_lobby_transcript`` /
``mesh_unobserve_lobby``. Shared with ``tools.rooms`` and ``tools.rings``: naming peers (node id
or petname), argument checks, and errors that list every problem.

Invariants:
- argument checks collect *every* problem before answering; a failure is ``invalid_argument``
  with ``problems`` (each ``"<argument>: <why>"``), never only the first;
- a petname resolves only against this agent's own roster; zero or several matches fail with
  ``unknown_agent`` / ``ambiguous_agent`` and ``candidates`` naming what the caller may have meant;
  what reaches a ring or the allowlist is always the resolved node id;
- library errors that carry ``problems`` (``EnvelopeError``, ``RingError``) or ``candidates``
  (``PetnameError``) keep those lists in the tool error; everything else is mapped by
  ``tools.results.from_error`` through ``run_tool``, unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from macula.agent.envelope import LOBBY_TOPIC, is_node_hex, is_room_topic
from macula.agent.petnames import PetnameError, petname
from macula.agent.presence import HELLO_TOPIC, MAX_TEXT
from macula.agent.proof import ring_endpoint
from macula.store.transcript import TranscriptMessage
from tools.context import Descriptions, hints, runtime_of
from tools.runtime import Runtime, run_tool

DEFAULT_AGENTS = 50
MAX_AGENTS = 200
DEFAULT_MAX_ROOMS = 20
MAX_OBSERVED_ROOMS = 200
DEFAULT_TRANSCRIPT = 50
MAX_TRANSCRIPT = 500
ROOM_TOPIC_SHAPE = "agents.room.<32 lowercase hex>"
KEY_FIELD = Field(description="1-120 chars; replays return the first receipt")


# -- shared by the agent tool groups ------------------------------------------------------------


class ArgumentProblems(ValueError):
    """Every problem found with a call's arguments; ``candidates`` per argument, if any."""

    def __init__(
        self,
        problems: Sequence[str],
        candidates: dict[str, list[str]] | None = None,
        *,
        code: str = "invalid_argument",
        next_action: str = "fix every listed problem and call again",
    ) -> None:
        self.problems = list(problems)
        self.candidates = candidates or {}
        self.code = code
        self.next_action = next_action
        super().__init__("; ".join(self.problems))


def failure(
    code: str,
    detail: str,
    next_action: str,
    *,
    problems: Sequence[str] = (),
    candidates: dict[str, list[str]] | None = None,
    retryable: int = 0,
) -> CallToolResult:
    """The ``{code, detail, retryable, next_action}`` error, plus ``problems``/``candidates``."""
    error: dict[str, Any] = {
        "code": code,
        "detail": detail,
        "retryable": retryable,
        "next_action": next_action,
    }
    if problems:
        error["problems"] = list(problems)
    if candidates:
        error["candidates"] = candidates
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(error, ensure_ascii=False))],
        structured_content=error,
        is_error=True,
    )


def invalid(problems: Sequence[str]) -> CallToolResult:
    """``invalid_argument`` listing every problem found by a tool's own checks."""
    return failure(
        "invalid_argument",
        "; ".join(problems),
        "fix every listed problem and call again",
        problems=problems,
    )


def check_wait(name: str, value: float, *, allow_zero: bool, limit: float) -> list[str]:
    low_ok = value >= 0 if allow_zero else value > 0
    if low_ok and value <= limit:
        return []
    bracket = "[0" if allow_zero else "(0"
    return [f"{name}: must be in {bracket}, {limit:g}] seconds"]


def check_flag(name: str, value: int) -> list[str]:
    return [] if value in (0, 1) and type(value) is int else [f"{name}: must be 0 or 1"]


def check_text(name: str, value: str | None, limit: int) -> list[str]:
    if value is not None and len(value) > limit:
        return [f"{name}: at most {limit} characters"]
    return []


def room_problems(name: str, topic: str, *, central_ok: bool) -> list[str]:
    if is_room_topic(topic) or (central_ok and topic == LOBBY_TOPIC):
        return []
    where = f"{LOBBY_TOPIC!r} or {ROOM_TOPIC_SHAPE}" if central_ok else ROOM_TOPIC_SHAPE
    return [f"{name}: expected {where}"]


def label(node_hex: object) -> str | None:
    """The petname of a 64-hex node id, or None if it is not one."""
    if not isinstance(node_hex, str) or not is_node_hex(node_hex):
        return None
    return petname(bytes.fromhex(node_hex))


async def run_agent_tool(
    runtime: Runtime,
    tool: str,
    args: dict[str, Any],
    work: Callable[[], Awaitable[dict[str, Any]]],
    *,
    idempotency_key: str | None = None,
    mesh: bool = True,
) -> CallToolResult:
    """``run_tool``, with errors that keep their lists (problems, candidates)."""
    caught: list[BaseException] = []

    async def tracked() -> dict[str, Any]:
        try:
            return await work()
        except Exception as exc:
            caught.append(exc)
            raise

    result = await run_tool(
        runtime, tool, args, tracked, idempotency_key=idempotency_key, mesh=mesh
    )
    if not result.is_error or not caught:
        return result
    return _with_lists(result, caught[0])


def _with_lists(result: CallToolResult, exc: BaseException) -> CallToolResult:
    if isinstance(exc, PetnameError):  # a library path that resolved a name by itself
        exc = _unresolved([("name", str(exc), exc.candidates)])
    if isinstance(exc, ArgumentProblems):
        return failure(
            exc.code,
            str(exc),
            exc.next_action,
            problems=exc.problems,
            candidates=exc.candidates,
        )
    problems = getattr(exc, "problems", None)  # EnvelopeError, RingError
    if isinstance(problems, tuple | list) and problems:
        return failure(
            "invalid_argument",
            str(exc),
            "fix every listed problem and call again",
            problems=[str(p) for p in problems],
        )
    return result


def _unresolved(found: list[tuple[str, str, Sequence[str]]]) -> ArgumentProblems:
    """One error for every name that did not resolve: ``(argument, why, candidates)``."""
    ambiguous = any(len(c) > 1 and all(is_node_hex(x) for x in c) for _, _, c in found)
    unknown = any("no agent in your roster" in why for _, why, _ in found)
    if ambiguous:
        code, action = "ambiguous_agent", "use one of the candidate node ids instead of the petname"
    elif unknown:
        code, action = (
            "unknown_agent",
            "check the name with mesh_agents (petnames resolve only against agents you have "
            "seen), or pass the 64-hex node id",
        )
    else:
        code, action = "invalid_argument", "pass a 64-hex node id or a petname from mesh_agents"
    return ArgumentProblems(
        [f"{arg}: {why}" for arg, why, _ in found],
        {arg: list(c) for arg, _, c in found if c},
        code=code,
        next_action=action,
    )


async def resolve_peers(runtime: Runtime, argument: str, names: Sequence[str]) -> list[bytes]:
    """Node ids for node ids or roster petnames; ``ArgumentProblems`` naming every failure."""
    resolved: list[bytes] = []
    found: list[tuple[str, str, Sequence[str]]] = []
    single = len(names) == 1 and argument != "participants"
    for i, name in enumerate(names):
        where = argument if single else f"{argument}[{i}]"
        try:
            node_id = await runtime.agent.resolve(name)
        except PetnameError as exc:
            found.append((where, str(exc), exc.candidates))
            continue
        if node_id in resolved:
            found.append((where, f"{name!r} names the same agent as an earlier entry", ()))
        resolved.append(node_id)
    if found:
        raise _unresolved(found)
    return resolved


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
        idempotency_key: Annotated[str | None, KEY_FIELD] = None,
    ) -> CallToolResult:
        runtime = runtime_of(ctx)
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
            view = await agent.hello(**fields, connected_via=via)
            node_id = agent.node.identity.node_id
            return view | {
                "topics": {
                    "hello": HELLO_TOPIC,
                    "central": LOBBY_TOPIC,
                    "ring_endpoint": ring_endpoint(node_id),
                },
                "heartbeat_seconds": agent.presence.profile.interval_seconds,
                "observing": int(agent.rooms.observing),
                "stations": [str(s) for s in runtime.stations],
            }

        args = {k: v for k, v in fields.items() if v is not None}
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
            "Entries unseen for 15 minutes drop out; a goodbye removes one at once.",
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
                "observed": (await rooms.rooms())["observed"],
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
            before = len((await rooms.rooms())["observed"])
            await rooms.unobserve()
            return {"observing": 0, "stopped_rooms": before, "transcript_kept": 1}

        return await run_agent_tool(
            runtime, "mesh_unobserve_lobby", {}, work, idempotency_key=idempotency_key, mesh=False
        )
