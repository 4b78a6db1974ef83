"""Room tools: open, join and leave rooms, say and wait, read the inbox (observing central is in
``tools.groups.presence``; argument checks in ``tools.groups.agent_arguments``).

Invariants:
- a room is ``agents.room.<32 hex>``: unguessable, and not encrypted unless opened with
  ``private`` 1 (then end to end: the station and anyone without the key see ciphertext);
  central is ``agents.lobby`` and carries only help broadcasts and public room announcements
  (no conversations; a private room is never announced);
- ``mesh_say`` checks the envelope it will publish before anything is sent and lists every
  problem (kind, topic, text, in_reply_to, refs) in one error;
- waits never poll the station: they wait on the transcript the background taps fill, for at
  most 3600 s; rings made by ``mesh_open_room`` run concurrently, so one slow callee does not
  delay the others;
- every message shown carries ``from`` (64 hex) and ``from_petname`` (a label, never a proof);
- unread marks: ``mesh_wait_room`` returns the oldest unread message from someone else at once,
  else waits, and marks what it returns read; ``mesh_read_inbox`` marks what it shows read
  unless ``peek`` is 1; ``lost`` counts what catch-up found missed for good;
- realms: a room opened with ``realm`` (a name or 64 hex) lives in that realm (stored with the
  membership; joins, rings and catch-up follow it); acting there goes through
  ``tools.groups.realm_access`` (``realm_refused`` when the station refuses; a hint when we hold no
  membership; a room the station refused us is left again).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.agent.agent import Agent
from macula.agent.envelope import (
    LOBBY_TOPIC,
    MAX_PURPOSE_CHARS,
    MAX_TEXT_BYTES,
    TALK_KINDS,
    is_id,
    validate,
)
from macula.agent.petnames import petname
from macula.agent.room.rooms import HELP_KINDS, RoomError, Rooms
from macula.errors import MaculaError
from macula.store.room_outbox import OutboxFullError
from macula.wire.identity import ZERO_REALM
from tools.groups.agent_arguments import (
    ArgumentProblems,
    invalid,
    resolve_peers,
    room_problems,
    run_agent_tool,
)
from tools.groups.agent_views import (
    label,
)
from tools.groups.inbox_views import inbox_page, text_part
from tools.groups.paging import parse_cursor
from tools.groups.realm_access import check, guard, left_if_refused
from tools.groups.realms import parse_realm
from tools.groups.text_limits import (
    KIND_CHARS,
    Cursor,
    Id,
    IdempotencyKey,
    Realm,
    RoomTopic,
)
from tools.groups.wait_views import reply_view, unread_view, wait_fit
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import InvalidArgument, fail

MAX_WAIT_S = 3600.0
DEFAULT_WAIT_S = 30.0
DEFAULT_JOIN_WAIT_S = 30.0
MAX_PARTICIPANTS = 16
ROOM_SCAN = 500  # messages read per room for mesh_rooms' participants
LEFT = "participant_left"


def _say_problems(
    room_topic: str, kind: str, text: str, in_reply_to: str | None, refs: list[str] | None
) -> list[str]:
    """Every problem with the envelope ``mesh_say`` would publish (the library's own rules)."""
    problems: list[str] = []
    if kind not in TALK_KINDS:
        problems.append(
            f"kind: expected one of {', '.join(sorted(TALK_KINDS))} "
            "(lifecycle kinds are published by the room tools)"
        )
    elif room_topic == LOBBY_TOPIC and kind not in HELP_KINDS:
        problems.append(
            "kind: central (agents.lobby) carries only help_requested or help_offered; "
            "talk in a room (mesh_ring or mesh_open_room)"
        )
    trial: dict[str, Any] = {
        "message_id": "0" * 32,
        "room_topic": room_topic,
        "sent_at": 0,
        "from": "0" * 64,
        "kind": kind if kind in TALK_KINDS else "remark_made",
        "text": text,
    }
    if in_reply_to is not None:
        trial["in_reply_to"] = in_reply_to
    if refs is not None:
        trial["refs"] = refs
    return problems + validate(trial)


async def _member_topics(agent: Agent) -> set[str]:
    return {m.room_topic for m in await agent.rooms.transcript.joined_rooms()}


async def _ring_one(
    agent: Agent, to: bytes, purpose: str, room: str, wait_join_seconds: float
) -> dict[str, Any]:
    """One participant's ring for ``mesh_open_room``; a failure is reported, not raised."""
    entry: dict[str, Any] = {"to": to.hex(), "petname": petname(to)}
    try:
        rung = await agent.rings.ring(
            to, purpose, room_topic=room, wait_join_seconds=wait_join_seconds
        )
    except MaculaError as exc:
        return entry | {"failed": 1, "error": str(exc), "answer": None, "unreachable": 0}
    return entry | {
        "ring_id": rung.ring_id,
        "answer": rung.answer,
        "reason": rung.reason,
        "unreachable": rung.unreachable,
        "joined": rung.joined or 0,
        "failed": 0,
    }


def _outcomes(rings: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Petnames grouped by what their ring came to."""
    groups: dict[str, list[str]] = {
        "joined": [],
        "accepted_not_yet_joined": [],
        "deferred": [],
        "declined": [],
        "unreachable": [],
        "failed": [],
    }
    for ring in rings:
        if ring["failed"]:
            group = "failed"
        elif ring["unreachable"]:
            group = "unreachable"
        elif ring["answer"] == 1:
            group = "joined" if ring["joined"] else "accepted_not_yet_joined"
        else:
            group = "declined" if ring["answer"] == 2 else "deferred"
        groups[group].append(ring["petname"])
    return groups


async def _privacy(rooms: Rooms, topic: str) -> dict[str, Any]:
    """``private`` 0/1, and for a private room the key epoch we know and how many envelopes we
    hold without their key (``undecryptable``)."""
    room = None if rooms.keys is None else await rooms.keys.store.room(topic)
    if room is None or rooms.keys is None:
        return {"private": 0}
    return {
        "private": 1,
        "epoch": room.epoch,
        "undecryptable": await rooms.keys.undecryptable(topic),
    }


async def mesh_open_room(
    ctx: Context,
    purpose: Annotated[str | None, Field(max_length=MAX_PURPOSE_CHARS)] = None,
    public: Annotated[int, Field(ge=0, le=1, description="1: also announce it on central")] = 0,
    private: Annotated[int, Field(ge=0, le=1, description="1: end-to-end encrypted")] = 0,
    participants: Annotated[list[str] | None, Field(description="node ids or petnames")] = None,
    wait_join_seconds: Annotated[float, Field(ge=0, le=MAX_WAIT_S)] = DEFAULT_JOIN_WAIT_S,
    realm: Realm = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    names = list(participants or [])
    tag = parse_realm(realm)
    if isinstance(tag, CallToolResult):
        return tag
    problems: list[str] = []
    if private == 1 and public == 1:
        problems.append("public: a private room is never announced on central; use 0")
    if public == 1 and any(tag):
        problems.append("public: a room in a realm is never announced on central; use 0")
    if len(names) > MAX_PARTICIPANTS:
        problems.append(f"participants: at most {MAX_PARTICIPANTS}")
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        agent = runtime.agent
        ids = await resolve_peers(runtime, "participants", names) if names else []
        me = agent.node.identity.node_id
        if me in ids:
            raise ArgumentProblems(
                [f"participants[{ids.index(me)}]: that is you; list the others only"]
            )
        before = await guard(runtime, tag)
        opened = await agent.rooms.open(
            purpose, public=public, participants=ids, private=private, realm=tag
        )
        room = opened.room_topic
        in_realm = await left_if_refused(agent, room, check(runtime, before))
        rings = list(
            await asyncio.gather(
                *(_ring_one(agent, to, purpose or "", room, wait_join_seconds) for to in ids)
            )
        )
        return {
            "room_topic": room,
            "message_id": opened.message_id,
            "public": opened.public,
            "private": opened.private,
            "purpose": purpose,
            "rings": rings,
            **_outcomes(rings),
            **in_realm,
        }

    args = {
        "purpose": purpose,
        "public": public,
        "private": private,
        "participants": names,
        "wait_join_seconds": wait_join_seconds,
        "realm": realm,
    }
    return await run_agent_tool(
        runtime, "mesh_open_room", args, work, idempotency_key=idempotency_key
    )


async def mesh_join_room(
    ctx: Context,
    room_topic: RoomTopic,
    realm: Annotated[Realm, Field(description="omit: the realm you were rung into it in")] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = room_problems("room_topic", room_topic, central_ok=False)
    if problems:
        return invalid(problems)
    tag = None if realm is None else parse_realm(realm)
    if isinstance(tag, CallToolResult):
        return tag

    async def work() -> dict[str, Any]:
        rooms = runtime.agent.rooms
        known = await rooms.transcript.room_realm(room_topic)
        before = await guard(runtime, tag or known or ZERO_REALM)
        joined = await rooms.join(room_topic, tag)
        return {
            "room_topic": joined.room_topic,
            "joined": 1,
            "already_member": joined.already_member,
            "message_id": joined.message_id,
            **await left_if_refused(runtime.agent, room_topic, check(runtime, before)),
        }

    return await run_agent_tool(
        runtime,
        "mesh_join_room",
        {"room_topic": room_topic, "realm": realm},
        work,
        idempotency_key=idempotency_key,
    )


async def mesh_leave_room(
    ctx: Context,
    room_topic: RoomTopic,
    close: Annotated[
        int, Field(ge=0, le=1, description="1: end the room for everyone (opener only)")
    ] = 0,
    remove: Annotated[
        list[str] | None,
        Field(description="node ids to remove (private room you opened)"),
    ] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = room_problems("room_topic", room_topic, central_ok=False)
    if remove is not None and not remove:
        problems.append("remove: name at least one participant, or omit it to leave")
    if remove is not None and len(remove) > MAX_PARTICIPANTS:
        problems.append(f"remove: at most {MAX_PARTICIPANTS}")
    if remove and close:
        problems.append("close: removing participants does not close the room; use one")
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        if remove:
            who = await resolve_peers(runtime, "remove", remove)
            epoch = await runtime.agent.rooms.remove(room_topic, who)
            removed = [{"node_id": n.hex(), "petname": petname(n)} for n in who]
            return {"room_topic": room_topic, "removed": removed, "epoch": epoch, "left": 0}
        left = await runtime.agent.rooms.leave(room_topic, close=close)
        gone = {"outbox_dropped": left.outbox_dropped}  # queued, could not be sent first
        return {"room_topic": left.room_topic, "left": 1, "closed": left.closed} | gone

    args = {"room_topic": room_topic, "close": close, "remove": remove}
    return await run_agent_tool(
        runtime, "mesh_leave_room", args, work, idempotency_key=idempotency_key
    )


async def mesh_rooms(ctx: Context) -> CallToolResult:
    runtime = runtime_of(ctx)

    async def work() -> dict[str, Any]:
        rooms = runtime.agent.rooms
        transcript = rooms.transcript
        counts = {a.room_topic: a.messages for a in await transcript.rooms()}
        unread = await transcript.unread_counts(rooms.me)
        lost = await transcript.gaps()
        observed = set(rooms.observed())
        outbox = rooms.outbox
        joined = []
        for m in await transcript.joined_rooms():
            last_kind: dict[str, str] = {}
            for msg in await transcript.messages(m.room_topic, limit=ROOM_SCAN):
                if msg.attested:
                    last_kind[msg.from_hex] = msg.kind
            people = [
                {"node_id": node, "petname": label(node), "left": int(kind == LEFT)}
                for node, kind in last_kind.items()
            ]
            joined.append(
                {
                    "room_topic": m.room_topic,
                    "realm": m.realm.hex(),
                    "role": m.role,
                    "public": m.public,
                    **await _privacy(rooms, m.room_topic),
                    "purpose": m.purpose,
                    "joined_ms": m.joined_ms,
                    "messages": counts.get(m.room_topic, 0),
                    "unread": unread.get(m.room_topic, 0),
                    "lost": lost.get(m.room_topic, 0),
                    "outbox_queued": 0 if outbox is None else outbox.queued_in(m.room_topic),
                    "participants_seen": people,
                }
            )
        mine = {room["room_topic"] for room in joined}
        seen = [
            {
                "room_topic": r.room_topic,
                "opener": r.opener_hex,
                "opener_petname": label(r.opener_hex),
                "purpose": r.purpose,
                "first_seen_ms": r.first_seen_ms,
                "last_seen_ms": r.last_seen_ms,
                "observed": int(r.room_topic in observed),
            }
            for r in await transcript.seen_rooms()
            if r.room_topic not in mine
        ]
        return {
            "joined": joined,
            "seen_on_central": seen,
            "observing": int(rooms.observing),
            "outbox": {"queued": 0 if outbox is None else outbox.queued},  # says not yet sent
        }

    return await run_agent_tool(runtime, "mesh_rooms", {}, work)


async def mesh_say(
    ctx: Context,
    room_topic: RoomTopic,
    text: Annotated[str, Field(max_length=MAX_TEXT_BYTES, description="non-blank, <= 16 KiB")],
    kind: Annotated[str, Field(max_length=KIND_CHARS)] = "remark_made",
    in_reply_to: Annotated[Id | None, Field(description="a message_id")] = None,
    refs: list[str] | None = None,
    wait_reply_seconds: Annotated[float, Field(ge=0, le=MAX_WAIT_S)] = 0,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = _say_problems(room_topic, kind, text, in_reply_to, refs)  # the library's rules
    if problems:
        return invalid(problems)

    full: list[OutboxFullError] = []

    async def work() -> dict[str, Any]:
        before = await guard(runtime, runtime.agent.rooms.realm_of(room_topic))
        try:
            said = await runtime.agent.rooms.say(
                room_topic,
                kind,
                text,
                in_reply_to=in_reply_to,
                refs=refs,
                wait_reply_seconds=wait_reply_seconds,
                fit=wait_fit,
            )
        except OutboxFullError as exc:
            full.append(exc)
            raise
        result: dict[str, Any] = {"room_topic": said.room_topic, "message_id": said.message_id}
        result |= await check(runtime, before)
        if said.waited:
            result |= reply_view(said)
        result |= {"delivered": said.delivered, "outbox": {"queued": said.queued}}
        if not said.delivered:
            result["next"] = _QUEUED_NEXT + (_NO_WAIT if wait_reply_seconds > 0 else "")
        return result | {"kind": kind}

    args = {
        "room_topic": room_topic,
        "text": text,
        "kind": kind,
        "in_reply_to": in_reply_to,
        "refs": refs,
        "wait_reply_seconds": wait_reply_seconds,
    }
    result = await run_agent_tool(runtime, "mesh_say", args, work, idempotency_key=idempotency_key)
    return _outbox_full(full[0]) if full else result


_QUEUED_NEXT = (
    "queued: delivered when the connection to the station is back, in order, once; "
    "message_id is final (reply to it, wait after it)"
)
_NO_WAIT = "; the reply wait was skipped: mesh_wait_room(after_message_id=message_id) waits"


def _outbox_full(exc: OutboxFullError) -> CallToolResult:
    return fail(
        "outbox_full",
        str(exc),
        retryable=True,
        next_action="the connection is down and your outbox is full: wait until it is back "
        "(mesh_rooms: outbox.queued goes down by itself), then say it again",
        outbox={"queued": exc.messages, "bytes": exc.size},
    )


async def mesh_wait_room(
    ctx: Context,
    room_topic: RoomTopic,
    wait_seconds: Annotated[float, Field(gt=0, le=MAX_WAIT_S)] = DEFAULT_WAIT_S,
    after_message_id: Annotated[Id | None, Field(description="a message_id in the room")] = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = room_problems("room_topic", room_topic, central_ok=True)
    if after_message_id is not None and not is_id(after_message_id):
        problems.append("after_message_id: expected 1..64 characters of A-Z a-z 0-9 _ -")
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        rooms = runtime.agent.rooms
        watched = await _member_topics(runtime.agent) | set(rooms.observed())
        if room_topic != LOBBY_TOPIC and room_topic not in watched:
            raise RoomError(
                f"not in {room_topic}: nothing would arrive; join it first (mesh_join_room)"
            )
        batch = await rooms.wait_unread_all(
            room_topic, wait_seconds, after_message_id=after_message_id, fit=wait_fit
        )
        return {"room_topic": room_topic} | unread_view(batch, args)

    args = {
        "room_topic": room_topic,
        "wait_seconds": wait_seconds,
        "after_message_id": after_message_id,
    }
    return await run_agent_tool(runtime, "mesh_wait_room", args, work)


async def mesh_read_inbox(
    ctx: Context,
    peek: Annotated[int, Field(ge=0, le=1, description="1: leave read marks alone")] = 0,
    cursor: Cursor = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems: list[str] = []
    at = None
    if cursor is not None:
        try:
            at = parse_cursor(cursor)
        except InvalidArgument as exc:
            problems.append(str(exc))
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        if at is not None and at.text_offset is not None:
            return await text_part(runtime, at.seq, at.text_offset)
        return await inbox_page(runtime, peek, 0 if at is None else at.seq)

    args = {"peek": peek, "cursor": cursor}
    return await run_agent_tool(runtime, "mesh_read_inbox", args, work)


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_open_room, hints(read_only=False, destructive=False, idempotent=False)),
    (mesh_join_room, hints(read_only=False, destructive=False, idempotent=True)),
    (mesh_leave_room, hints(read_only=False, destructive=True, idempotent=True)),
    (mesh_rooms, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_say, hints(read_only=False, destructive=False, idempotent=False)),
    (mesh_wait_room, hints(read_only=False, destructive=False, idempotent=False)),
    (mesh_read_inbox, hints(read_only=False, destructive=False, idempotent=True)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
