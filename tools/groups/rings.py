"""Ring tools: ring an agent into a room, answer and wait for rings, trust and untrust peers.

Invariants:
- ``to`` and ``node_id`` accept a 64-hex node id or a petname from this agent's own roster;
  what a ring or the allowlist uses is always the resolved node id (petnames are labels);
- answers are the ints 1 accepted, 2 declined, 3 deferred; ``unreachable``,
  ``joined`` and ``caller_notified`` are 0/1;
- the allowlist tools edit a local file only: they never start presence or touch the mesh.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.agent.envelope import MAX_PURPOSE_CHARS, is_id, is_room_topic
from macula.agent.petnames import petname
from macula.agent.proof import MAX_REASON_CHARS
from macula.agent.rings import RingEvent, RingPlaced, Rings
from macula.agent.room.rooms import RoomError
from macula.config import CONTACT_POLICY_ENV
from macula.wire.identity import ZERO_REALM
from tools.groups.agent_arguments import invalid, resolve_peers, run_agent_tool
from tools.groups.agent_views import label
from tools.groups.paging import paged
from tools.groups.realm_access import check, guard, left_if_refused
from tools.groups.realms import parse_realm
from tools.groups.text_limits import Id, IdempotencyKey, Peer, Realm, RoomTopic
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import fail
from tools.server.runtime import Runtime

MAX_WAIT_S = 3600.0
DEFAULT_WAIT_S = 30.0
DEFAULT_JOIN_WAIT_S = 30.0

_NEXT = {
    1: "talk in room_topic with mesh_say; mesh_wait_room waits for their messages",
    2: "they declined (see reason); do not write into the room on their behalf",
    3: "their model decides later: mesh_wait_ring blocks until the answer arrives (late_answer 1)",
}


def _peer_problems(name: str, value: str) -> list[str]:
    return [] if value.strip() else [f"{name}: expected a 64-hex node id or a petname"]


def _placed_view(placed: RingPlaced) -> dict[str, Any]:
    """A ring we placed: ``detail`` if unreachable, else ``reason``; ``joined`` after an accept."""
    view: dict[str, Any] = {
        "ring_id": placed.ring_id,
        "to": placed.to.hex(),
        "room_topic": placed.room_topic,
        "unreachable": placed.unreachable,
        "answer": placed.answer,
    }
    if placed.unreachable:
        view["detail"] = placed.detail
    else:
        view["reason"] = placed.reason
    if placed.joined is not None:
        view["joined"] = placed.joined
    return view


def _event_view(event: RingEvent) -> dict[str, Any]:
    """An incoming ring (with its purpose), or a late answer to ours (``late_answer`` 1)."""
    view: dict[str, Any] = {"ring_id": event.ring_id, "from": event.sender.hex()}
    if event.late_answer:
        view |= {
            "answer": event.answer,
            "reason": event.reason,
            "room_topic": event.room_topic,
            "late_answer": 1,
        }
    else:
        view |= {
            "purpose": event.purpose,
            "room_topic": event.room_topic,
            "answer": event.answer,
            "reason": event.reason,
        }
    return view | {"from_petname": label(view["from"])}


def _policy_note(before: str, after: str, source: str, trusted: bool) -> str:
    """What a trust/untrust call did to the contact policy, in words."""
    if source == "override":
        return (
            f"{CONTACT_POLICY_ENV} keeps this process on {after!r}; the file changed. "
            + ("Allowlisted callers are accepted under ask too." if trusted else "")
        ).strip()
    if not trusted:
        return f"removed from the allowlist; contact_policy stays {after!r}"
    if before != after:
        return f"contact_policy switched from {before!r} to {after!r} so the allowlist is consulted"
    if after == "closed":
        return "recorded, but contact_policy 'closed' declines everyone, allowlisted or not"
    if after == "open":
        return "recorded; contact_policy 'open' already accepts everyone"
    return f"recorded; contact_policy stays {after!r}"


async def _edit_allowlist(runtime: Runtime, node_id: str, *, trusted: bool) -> dict[str, Any]:
    rings: Rings = runtime.agent.rings
    before = rings.policy().mode.label
    [peer] = await resolve_peers(runtime, "node_id", [node_id])
    edit = runtime.agent.trust if trusted else runtime.agent.untrust
    result = await edit(peer.hex())
    after = rings.policy()
    return result | {
        "allowlisted": int(after.allows(peer)),
        "policy_source": after.mode_source,
        "note": _policy_note(before, after.mode.label, after.mode_source, trusted),
    }


async def mesh_ring(
    ctx: Context,
    to: Annotated[Peer, Field(description="node id or petname")],
    purpose: Annotated[str, Field(max_length=MAX_PURPOSE_CHARS)],
    room_topic: Annotated[RoomTopic | None, Field(description="omit: a fresh room")] = None,
    wait_join_seconds: Annotated[float, Field(ge=0, le=MAX_WAIT_S)] = DEFAULT_JOIN_WAIT_S,
    private: Annotated[
        int, Field(ge=0, le=1, description="1: end-to-end encrypted fresh room")
    ] = 0,
    realm: Annotated[
        Realm,
        Field(description="of a fresh room (a room you are in keeps its own)"),
    ] = None,
    wait_answer_seconds: Annotated[float, Field(ge=0, le=MAX_WAIT_S)] = 0.0,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    tag = None if realm is None else parse_realm(realm)
    if isinstance(tag, CallToolResult):
        return tag
    problems = _peer_problems("to", to)
    if private == 1 and room_topic is not None:
        problems.append("private: applies to a fresh room; omit room_topic")
    if room_topic is not None and not is_room_topic(room_topic):
        problems.append("room_topic: expected agents.room.<32 lowercase hex>")
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        agent = runtime.agent
        [callee] = await resolve_peers(runtime, "to", [to])
        if room_topic is not None:
            joined = {m.room_topic for m in await agent.rooms.transcript.joined_rooms()}
            if room_topic not in joined:
                raise RoomError(
                    f"not in {room_topic}: ring into a fresh room (omit room_topic) or one "
                    "you are in"
                )
        in_room = None if room_topic is None else agent.rooms.realm_of(room_topic)
        before = await guard(runtime, in_room or tag or ZERO_REALM)
        rung = await agent.rings.ring(
            callee,
            purpose,
            room_topic=room_topic,
            wait_join_seconds=wait_join_seconds,
            private=private,
            realm=tag,
        )
        checked = check(runtime, before)
        if room_topic is None:  # a fresh room the station refused us is left again
            checked = left_if_refused(agent, rung.room_topic, checked)
        in_realm = await checked
        view = (
            _placed_view(rung) | in_realm | {"petname": petname(callee), "joined": rung.joined or 0}
        )
        if rung.answer == 3 and wait_answer_seconds > 0:
            await ctx.report_progress(0, None, "deferred: waiting for their answer")
            late = await agent.rings.wait_answer(rung.ring_id, wait_answer_seconds)
            if late is not None:
                view |= {"answer": late.answer, "reason": late.reason, "late_answer": 1}
        answer = view["answer"] or 0
        return view | {"next": _NEXT.get(answer, "they are not reachable now; try again later")}

    args = {
        "to": to,
        "purpose": purpose,
        "room_topic": room_topic,
        "wait_join_seconds": wait_join_seconds,
        "private": private,
        "realm": realm,
        "wait_answer_seconds": wait_answer_seconds,
    }
    return await run_agent_tool(runtime, "mesh_ring", args, work, idempotency_key=idempotency_key)


async def mesh_answer_ring(
    ctx: Context,
    ring_id: Annotated[Id, Field(description="from rings.pending")],
    answer: Annotated[int, Field(ge=1, le=2, description="1 accept (join), 2 decline")],
    reason: Annotated[
        str | None, Field(max_length=MAX_REASON_CHARS, description="told to the caller")
    ] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = [] if is_id(ring_id) else ["ring_id: expected the ring_id from rings.pending"]
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        rings = runtime.agent.rings
        done = await rings.answer_ring(ring_id, answer, reason)
        answered: dict[str, Any] = {
            "ring_id": done.ring_id,
            "answer": done.answer,
            "caller_notified": done.caller_notified,
            "state": done.state,
        }
        ring = await rings.store.get(ring_id)
        if ring is not None:
            answered |= {
                "room_topic": ring.room_topic,
                "peer": ring.peer.hex(),
                "peer_petname": petname(ring.peer),
            }
        return answered

    args = {"ring_id": ring_id, "answer": answer, "reason": reason}
    return await run_agent_tool(
        runtime, "mesh_answer_ring", args, work, idempotency_key=idempotency_key
    )


async def mesh_wait_ring(
    ctx: Context,
    wait_seconds: Annotated[float, Field(gt=0, le=MAX_WAIT_S)] = DEFAULT_WAIT_S,
) -> CallToolResult:
    runtime = runtime_of(ctx)

    async def work() -> dict[str, Any]:
        async def started() -> None:  # a progress notification, for clients that asked
            await ctx.report_progress(0, None, "waiting for a ring")

        waited = await runtime.agent.rings.wait_rings(wait_seconds, started=started)
        rings = [_event_view(event) for event in waited.events]
        newest = rings[-1] if rings else None
        return {
            "rings": rings,
            "count": len(rings),
            **paged(waited.left, "mesh_wait_ring", {"wait_seconds": wait_seconds}),
            "ring": newest,
            "timed_out": int(newest is None),
        }

    return await run_agent_tool(runtime, "mesh_wait_ring", {"wait_seconds": wait_seconds}, work)


async def mesh_trust_agent(
    ctx: Context,
    node_id: Annotated[Peer, Field(description="node id or petname")],
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    return await _allowlist_tool(ctx, "mesh_trust_agent", node_id, idempotency_key, trusted=True)


async def mesh_untrust_agent(
    ctx: Context,
    node_id: Annotated[Peer, Field(description="node id or petname")],
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    return await _allowlist_tool(ctx, "mesh_untrust_agent", node_id, idempotency_key, trusted=False)


async def _allowlist_tool(
    ctx: Context, tool: str, node_id: str, idempotency_key: str | None, *, trusted: bool
) -> CallToolResult:
    """``mesh_trust_agent`` / ``mesh_untrust_agent``: one edit of the contact allowlist."""
    runtime = runtime_of(ctx)
    problems = _peer_problems("node_id", node_id)
    if problems:
        return invalid(problems)
    held = runtime.agent.approvals.settings()
    if trusted and (held.tasks_from_strangers or held.rings_when_asked):
        # the allowlist decides who is a stranger: trusting one would let its work skip the queue
        return fail(
            "owner_decides",
            "the owner holds strangers' tasks or rings for approval ([approvals] in owner.toml), "
            "and the contact allowlist says who is a stranger: only the owner can trust an agent",
            retryable=False,
            next_action="ask your owner (a person): they approve what waits (`uv run macula-mcp "
            "approvals list`) or add the node id to the allowlist of "
            f"{runtime.agent.rings.policy_file}",
        )

    async def work() -> dict[str, Any]:
        return await _edit_allowlist(runtime, node_id, trusted=trusted)

    return await run_agent_tool(
        runtime, tool, {"node_id": node_id}, work, idempotency_key=idempotency_key, mesh=False
    )


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_ring, hints(read_only=False, destructive=False, idempotent=False)),
    (mesh_answer_ring, hints(read_only=False, destructive=False, idempotent=False)),
    (mesh_wait_ring, hints(read_only=True, destructive=False, idempotent=True)),
    (
        mesh_trust_agent,
        hints(read_only=False, destructive=False, idempotent=True, open_world=False),
    ),
    (
        mesh_untrust_agent,
        hints(read_only=False, destructive=True, idempotent=True, open_world=False),
    ),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
