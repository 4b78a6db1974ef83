"""The agent tool groups (presence, rooms, rings) through the official MCP client, in process,
over a real station: two macula-mcp servers meet, ring, talk, observe and say goodbye."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from macula.agent.envelope import LOBBY_TOPIC
from macula.agent.petnames import PetnameError, petname
from macula.agent.rings import Rings
from macula.agent.room.rooms import Rooms
from relay.station.station import Station
from support.agentkit import build_app, call, mcp_agent, meet, refused
from support.waiting import entered, eventually

pytestmark = pytest.mark.anyio

AGENT_TOOLS = {
    "mesh_hello": "presence",
    "mesh_agents": "presence",
    "mesh_goodbye": "presence",
    "mesh_open_room": "rooms",
    "mesh_join_room": "rooms",
    "mesh_leave_room": "rooms",
    "mesh_rooms": "rooms",
    "mesh_say": "rooms",
    "mesh_wait_room": "rooms",
    "mesh_read_inbox": "rooms",
    "mesh_observe_lobby": "presence",
    "mesh_lobby_transcript": "presence",
    "mesh_unobserve_lobby": "presence",
    "mesh_ring": "rings",
    "mesh_answer_ring": "rings",
    "mesh_wait_ring": "rings",
    "mesh_trust_agent": "rings",
    "mesh_untrust_agent": "rings",
}
NOT_INVITED = "do not write into a room nobody invited you to"
NOT_ENCRYPTED = "unguessable, not encrypted"
UNJOINED_ROOM = "agents.room." + "ab" * 16


async def test_descriptions_full_and_terse_keep_every_caveat() -> None:
    for terse in (False, True):
        _, describe = build_app({}, terse=terse)
        assert AGENT_TOOLS.keys() <= describe.all.keys()
    for name in AGENT_TOOLS:
        full, short = describe.all[name]
        assert len(short) < len(full), name
    for name in ("mesh_open_room", "mesh_join_room", "mesh_say", "mesh_ring"):
        for text in describe.all[name]:
            assert NOT_INVITED in text.lower() and NOT_ENCRYPTED in text.lower(), name


async def test_two_agents_meet_ring_and_talk(station: Station, tmp_path: Path) -> None:
    async with (
        mcp_agent(station, tmp_path, "alice") as alice,
        mcp_agent(station, tmp_path, "bob", "open") as bob,
    ):
        listed = {tool.name: tool for tool in (await alice.list_tools()).tools}
        for name in AGENT_TOOLS:
            hints = listed[name].annotations
            assert hints is not None, name
            assert hints.read_only_hint or hints.destructive_hint is not None, name

        alice_view, bob_view = await meet(alice, bob)
        assert bob_view["ring"] == {"serving": 1, "contact_policy": "open", "policy_error": None}
        assert alice_view["petname"] == petname(bytes.fromhex(alice_view["node_id"]))
        page = await call(alice, "mesh_agents", {"limit": 1})
        assert page["count"] == 1 and page["next_offset"] == 1
        rows = (await call(alice, "mesh_agents"))["agents"]
        row = next(r for r in rows if r["node_id"] == bob_view["node_id"])
        assert (row["petname"], row["operator_name"], row["model"]) == (
            bob_view["petname"],
            "bob",
            "test-model",
        )
        assert row["stale"] == 0 and row["is_me"] == 0 and row["first_seen_ms"] > 0
        assert row["connected_via"]

        rung = await call(alice, "mesh_ring", {"to": bob_view["petname"], "purpose": "review"})
        assert (rung["answer"], rung["joined"], rung["unreachable"]) == (1, 1, 0)
        assert rung["petname"] == bob_view["petname"]
        room = rung["room_topic"]

        asking = asyncio.create_task(
            call(
                alice,
                "mesh_say",
                {
                    "room_topic": room,
                    "kind": "question_asked",
                    "text": "does the plan hold?",
                    "wait_reply_seconds": 10,
                },
            )
        )

        async def question() -> dict[str, Any] | None:
            inbox = await call(bob, "mesh_read_inbox")
            messages = [m for r in inbox["rooms"] if r["room_topic"] == room for m in r["messages"]]
            return next((m for m in messages if m["kind"] == "question_asked"), None)

        asked = await eventually(question)
        assert asked["from_petname"] == alice_view["petname"] and asked["attested"] == 1
        await call(
            bob,
            "mesh_say",
            {
                "room_topic": room,
                "kind": "answer_given",
                "text": "yes",
                "in_reply_to": asked["message_id"],
            },
        )
        said = await asking
        assert said["timed_out"] == 0 and said["reply"]["in_reply_to"] == asked["message_id"]
        answered = said["reply"]["message_id"]
        assert said["reply"]["from_petname"] == bob_view["petname"]

        waiting = await entered(
            Rooms,
            "wait_unread_all",
            call(bob, "mesh_wait_room", {"room_topic": room, "wait_seconds": 10}),
        )
        await call(alice, "mesh_say", {"room_topic": room, "text": "thanks"})
        heard = await waiting
        seen = [heard["message"]["kind"]]
        # bob's oldest unread may be alice's room_opened, fetched by his catch-up on joining
        # whenever that ran: it comes first, then the remark
        while heard["message"]["kind"] == "room_opened" and len(seen) < 3:
            heard = await call(bob, "mesh_wait_room", {"room_topic": room, "wait_seconds": 10})
            seen.append(heard["message"]["kind"])
        assert heard["timed_out"] == 0 and heard["message"]["kind"] == "remark_made", seen

        # a follow-up to the answer alice's say already returned: bob's inbox threads it under
        # the question (depth 2), though the question and the answer were read before
        follow = {"kind": "question_asked", "text": "and rollback?", "in_reply_to": answered}
        followed = await call(alice, "mesh_say", {"room_topic": room, **follow})

        async def threaded() -> dict[str, Any] | None:
            inbox = await call(bob, "mesh_read_inbox", {"peek": 1})
            shown = [m for r in inbox["rooms"] if r["room_topic"] == room for m in r["messages"]]
            return next((m for m in shown if m["message_id"] == followed["message_id"]), None)

        follow_up = await eventually(threaded)
        assert (follow_up["thread_root"], follow_up["depth"]) == (asked["message_id"], 2)
        inbox = await call(alice, "mesh_read_inbox")
        assert inbox["poll_hint"] and "mesh_wait_room" in inbox["poll_hint"]
        assert (await call(bob, "mesh_read_inbox"))["poll_hint"] is None

        [mine] = (await call(alice, "mesh_rooms"))["joined"]
        assert mine["room_topic"] == room and mine["role"] == "opener" and mine["messages"] >= 4
        assert bob_view["petname"] in {p["petname"] for p in mine["participants_seen"]}

        closing = await refused(bob, "mesh_leave_room", {"room_topic": room, "close": 1})
        assert closing["code"] == "refused" and "opened" in closing["detail"]
        left = await call(bob, "mesh_leave_room", {"room_topic": room})
        assert (left["left"], left["closed"]) == (1, 0)
        assert (await refused(bob, "mesh_leave_room", {"room_topic": room}))["code"] == "refused"

        bye = await call(alice, "mesh_goodbye")
        assert bye["present"] == 0 and room in bye["rooms_left"]

        async def alice_gone() -> bool:
            rows = (await call(bob, "mesh_agents"))["agents"]
            return all(r["node_id"] != alice_view["node_id"] for r in rows)

        await eventually(alice_gone)
        back = await call(alice, "mesh_hello")
        assert back["present"] == 1 and back["ring"]["serving"] == 1


async def test_ask_policy_defers_then_answer_and_trust(
    station: Station, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        mcp_agent(station, tmp_path, "alice") as alice,
        mcp_agent(station, tmp_path, "bob", "ask") as bob,
    ):
        alice_view, bob_view = await meet(alice, bob)
        incoming = await entered(
            Rings, "wait_rings", call(bob, "mesh_wait_ring", {"wait_seconds": 10})
        )
        rung = await call(alice, "mesh_ring", {"to": bob_view["node_id"], "purpose": "pair?"})
        assert (rung["answer"], rung["joined"], rung["unreachable"]) == (3, 0, 0)
        waited = await incoming
        assert waited["timed_out"] == 0 and waited["ring"]["answer"] == 3
        assert waited["ring"]["from_petname"] == alice_view["petname"]

        late = await entered(
            Rings, "wait_rings", call(alice, "mesh_wait_ring", {"wait_seconds": 10})
        )
        [pending] = (await call(bob, "mesh_read_inbox"))["rings"]["pending"]
        assert pending["ring_id"] == rung["ring_id"]
        assert pending["peer_petname"] == alice_view["petname"]
        answered = await call(bob, "mesh_answer_ring", {"ring_id": pending["ring_id"], "answer": 1})
        assert answered["caller_notified"] == 1 and answered["room_topic"] == rung["room_topic"]
        assert answered["peer_petname"] == alice_view["petname"]
        told = await late
        assert told["ring"]["late_answer"] == 1 and told["ring"]["answer"] == 1
        again = await refused(bob, "mesh_answer_ring", {"ring_id": rung["ring_id"], "answer": 2})
        assert "already" in again["detail"]

        trusted = await call(bob, "mesh_trust_agent", {"node_id": alice_view["petname"]})
        assert trusted["node_id"] == alice_view["node_id"] and trusted["allowlisted"] == 1
        assert trusted["contact_policy"] == "ask" and trusted["policy_source"] == "override"
        monkeypatch.setattr("macula.agent.rings.RATE_WINDOW_MS", 0)  # 1 ring per 2 s: not here
        accepted = await call(alice, "mesh_ring", {"to": bob_view["petname"], "purpose": "more"})
        assert (accepted["answer"], accepted["joined"]) == (1, 1)
        untrusted = await call(bob, "mesh_untrust_agent", {"node_id": alice_view["node_id"]})
        assert untrusted["allowlisted"] == 0 and untrusted["contact_policy"] == "ask"

        unknown = await refused(bob, "mesh_trust_agent", {"node_id": "nobody_at_all_0000"})
        assert unknown["code"] == "unknown_agent" and unknown["problems"]
        near = alice_view["petname"][:-1] + "x"
        similar = await refused(bob, "mesh_ring", {"to": near, "purpose": "hi"})
        assert similar["candidates"] == {"to": [alice_view["petname"]]}

        twins = ["01" * 32, "02" * 32]

        def collide(name: str, roster: object) -> bytes:
            raise PetnameError(f"petname {name!r} belongs to 2 agents (a collision)", twins)

        monkeypatch.setattr("macula.agent.agent.resolve", collide)
        ambiguous = await refused(bob, "mesh_trust_agent", {"node_id": "twin_name_0001"})
        assert ambiguous["code"] == "ambiguous_agent"
        assert ambiguous["candidates"] == {"node_id": twins}


async def test_a_ring_deferred_under_ask_waits_for_its_late_answer(
    station: Station, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wait_answer_seconds: the caller's mesh_ring returns the callee's later accept itself
    (late_answer 1), and mesh_wait_ring does not report that answer a second time."""
    async with (
        mcp_agent(station, tmp_path, "alice") as alice,
        mcp_agent(station, tmp_path, "bob", "ask") as bob,
    ):
        _, bob_view = await meet(alice, bob)
        ringing = await entered(
            Rings,
            "wait_answer",
            call(
                alice,
                "mesh_ring",
                {"to": bob_view["node_id"], "purpose": "pair?", "wait_answer_seconds": 30},
            ),
        )
        [pending] = (await call(bob, "mesh_read_inbox"))["rings"]["pending"]
        await call(bob, "mesh_answer_ring", {"ring_id": pending["ring_id"], "answer": 1})
        rung = await ringing
        assert (rung["answer"], rung["late_answer"]) == (1, 1)
        assert rung["ring_id"] == pending["ring_id"] and "mesh_say" in rung["next"]
        again = await call(alice, "mesh_wait_ring", {"wait_seconds": 0.2})
        assert again["timed_out"] == 1
        # no answer within the wait: the ring stays deferred, as without the wait
        monkeypatch.setattr("macula.agent.rings.RATE_WINDOW_MS", 0)  # 1 ring per 2 s: not here
        unanswered = await call(
            alice,
            "mesh_ring",
            {"to": bob_view["node_id"], "purpose": "later?", "wait_answer_seconds": 0.2},
        )
        assert unanswered["answer"] == 3 and "late_answer" not in unanswered
        bad = await refused(
            alice,
            "mesh_ring",
            {"to": bob_view["node_id"], "purpose": "x", "wait_answer_seconds": -1},
        )
        assert bad["code"] == "invalid_argument"


async def test_public_rooms_participants_and_observing(station: Station, tmp_path: Path) -> None:
    async with (
        mcp_agent(station, tmp_path, "alice") as alice,
        mcp_agent(station, tmp_path, "bob", "open") as bob,
    ):
        alice_view, bob_view = await meet(alice, bob)
        observing = await call(bob, "mesh_observe_lobby", {"max_rooms": 5})
        assert (observing["observing"], observing["max_rooms"]) == (1, 5)

        stranger = os.urandom(32)
        opened = await call(
            alice,
            "mesh_open_room",
            {
                "purpose": "design review",
                "participants": [bob_view["petname"], stranger.hex()],
                "wait_join_seconds": 5,
            },
        )
        assert opened["public"] == 0
        assert opened["joined"] == [bob_view["petname"]]
        assert opened["unreachable"] == [petname(stranger)]
        assert opened["deferred"] == opened["declined"] == opened["failed"] == []

        floor = await call(alice, "mesh_open_room", {"purpose": "open floor", "public": 1})
        room = floor["room_topic"]

        async def announced_and_watched() -> dict[str, Any] | None:
            seen = (await call(bob, "mesh_rooms"))["seen_on_central"]
            return next((r for r in seen if r["room_topic"] == room and r["observed"]), None)

        seen = await eventually(announced_and_watched)
        assert seen["opener_petname"] == alice_view["petname"] and seen["purpose"] == "open floor"
        await call(alice, "mesh_say", {"room_topic": room, "text": "anyone around?"})

        async def overheard() -> bool:
            got = (await call(bob, "mesh_lobby_transcript", {"limit": 20}))["messages"]
            return any(m["room_topic"] == room and m["text"] == "anyone around?" for m in got)

        await eventually(overheard)
        central = await call(bob, "mesh_lobby_transcript", {"topic": LOBBY_TOPIC, "limit": 5})
        assert any(m["kind"] == "room_opened" for m in central["messages"])

        stopped = await call(bob, "mesh_unobserve_lobby")
        assert stopped["observing"] == 0 and stopped["stopped_rooms"] >= 1
        joined = await call(bob, "mesh_join_room", {"room_topic": room})
        assert (joined["joined"], joined["already_member"]) == (1, 0)
        rejoined = await call(bob, "mesh_join_room", {"room_topic": room})
        assert rejoined["already_member"] == 1 and rejoined["message_id"] is None
        help_asked = await call(
            bob, "mesh_say", {"room_topic": LOBBY_TOPIC, "kind": "help_requested", "text": "?"}
        )
        assert help_asked["room_topic"] == LOBBY_TOPIC


async def test_bad_arguments_are_listed_and_idempotency(station: Station, tmp_path: Path) -> None:
    async with mcp_agent(station, tmp_path, "alice") as alice:
        me = (await call(alice, "mesh_hello"))["node_id"]
        # a value outside its schema (type, range, length) is refused at the argument boundary
        # (tools.server.arguments) before a tool's own checks run: only those problems are listed
        cases: list[tuple[str, dict[str, Any], str, int]] = [
            ("mesh_hello", {"operator_name": "x" * 281, "model": "y" * 281}, "invalid_argument", 2),
            ("mesh_agents", {"limit": 0, "offset": -1}, "invalid_argument", 2),
            ("mesh_goodbye", {"idempotency_key": ""}, "invalid_argument", 0),
            (
                "mesh_open_room",
                {"public": 2, "purpose": "p" * 281, "wait_join_seconds": 4000},
                "invalid_argument",
                3,
            ),
            ("mesh_open_room", {"participants": ["no_such_agent", "abc123"]}, "unknown_agent", 2),
            ("mesh_open_room", {"participants": [me]}, "invalid_argument", 1),
            ("mesh_join_room", {"room_topic": "agents.room.XYZ"}, "invalid_argument", 1),
            ("mesh_leave_room", {"room_topic": "x", "close": 2}, "invalid_argument", 1),
            ("mesh_leave_room", {"room_topic": UNJOINED_ROOM}, "refused", 0),
            (
                "mesh_say",
                {"room_topic": "agents.room.nope", "kind": "answer_given", "text": " "},
                "invalid_argument",
                3,
            ),
            ("mesh_say", {"room_topic": LOBBY_TOPIC, "text": "hi"}, "invalid_argument", 1),
            (
                "mesh_say",
                {"room_topic": UNJOINED_ROOM, "kind": "room_opened", "text": "x", "refs": [""]},
                "invalid_argument",
                2,
            ),
            ("mesh_say", {"room_topic": UNJOINED_ROOM, "text": "hi"}, "refused", 0),
            ("mesh_wait_room", {"room_topic": "bogus", "wait_seconds": 0}, "invalid_argument", 1),
            ("mesh_wait_room", {"room_topic": UNJOINED_ROOM, "wait_seconds": 1}, "refused", 0),
            ("mesh_observe_lobby", {"max_rooms": 0}, "invalid_argument", 1),
            ("mesh_lobby_transcript", {"limit": 0, "topic": "bogus"}, "invalid_argument", 1),
            ("mesh_unobserve_lobby", {"idempotency_key": "k" * 121}, "invalid_argument", 1),
            (
                "mesh_ring",
                {"to": " ", "purpose": "p" * 281, "room_topic": "bad", "wait_join_seconds": -1},
                "invalid_argument",
                2,
            ),
            (
                "mesh_ring",
                {"to": " ", "purpose": "p" * 281, "room_topic": "bad"},
                "invalid_argument",
                1,
            ),
            (  # within the schema: the tool's own checks, every problem listed
                "mesh_ring",
                {"to": " ", "purpose": "p", "room_topic": "bad"},
                "invalid_argument",
                2,
            ),
            ("mesh_ring", {"to": me, "purpose": "talk to myself"}, "refused", 0),
            ("mesh_ring", {"to": me, "purpose": "x", "room_topic": UNJOINED_ROOM}, "refused", 0),
            (
                "mesh_answer_ring",
                {"ring_id": "no such!", "answer": 3, "reason": "r" * 281},
                "invalid_argument",
                2,
            ),
            (
                "mesh_answer_ring",
                {"ring_id": "no such!", "answer": 1, "reason": "r" * 281},
                "invalid_argument",
                1,
            ),
            (
                "mesh_answer_ring",
                {"ring_id": "no such!", "answer": 1, "reason": "r"},
                "invalid_argument",
                1,
            ),
            ("mesh_answer_ring", {"ring_id": "abc", "answer": 1}, "refused", 0),
            ("mesh_wait_ring", {"wait_seconds": 3601}, "invalid_argument", 1),
            ("mesh_trust_agent", {"node_id": "abc"}, "invalid_argument", 1),
            ("mesh_untrust_agent", {"node_id": "  "}, "invalid_argument", 1),
        ]
        for tool, args, code, problems in cases:
            error = await refused(alice, tool, args)
            assert error["code"] == code, (tool, args, error)
            assert len(error.get("problems", [])) == problems, (tool, args, error)
            assert error["retryable"] == 0
        tested = {tool for tool, *_ in cases}
        assert tested == AGENT_TOOLS.keys() - {"mesh_rooms", "mesh_read_inbox"}  # no arguments

        assert (await call(alice, "mesh_wait_ring", {"wait_seconds": 0.2}))["timed_out"] == 1
        quiet = await call(
            alice, "mesh_wait_room", {"room_topic": LOBBY_TOPIC, "wait_seconds": 0.2}
        )
        assert quiet["timed_out"] == 1 and quiet["message"] is None
        assert (await call(alice, "mesh_rooms"))["joined"] == []
        assert (await call(alice, "mesh_read_inbox"))["rings"]["pending"] == []
        assert (await call(alice, "mesh_trust_agent", {"node_id": me}))["allowlisted"] == 1
        assert (await call(alice, "mesh_untrust_agent", {"node_id": me}))["allowlisted"] == 0

        args = {"purpose": "once", "idempotency_key": "room-1"}
        first = await call(alice, "mesh_open_room", args)
        replay = await call(alice, "mesh_open_room", args)
        assert replay["room_topic"] == first["room_topic"] and replay["replayed"] == 1
        assert "replayed" not in first
        assert len((await call(alice, "mesh_rooms"))["joined"]) == 1
        conflict = await refused(alice, "mesh_open_room", args | {"purpose": "twice"})
        assert conflict["code"] == "idempotency_conflict"
