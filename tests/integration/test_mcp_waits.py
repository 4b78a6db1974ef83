"""Waits that return the reply (issue 22), through the MCP tools over a real station: a wait
returns every unread item at once, oldest first, so the answer that arrived after a notice is
in the first result; mesh_say's wait names the item answering what it said; mesh_wait_ring
returns every ring that reached us since the last wait."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from relay.station.station import Station
from support.agentkit import call, mcp_agent, meet
from support.waiting import eventually

pytestmark = pytest.mark.anyio


async def recorded(client: Client, room: str, message_id: str) -> bool:
    """``message_id`` is in ``client``'s transcript of ``room`` (read marks untouched)."""
    inbox = await call(client, "mesh_read_inbox", {"peek": 1})
    return any(
        m["message_id"] == message_id
        for r in inbox["rooms"]
        if r["room_topic"] == room
        for m in r["messages"]
    )


def kinds(result: dict[str, Any]) -> list[str]:
    return [m["kind"] for m in result["messages"]]


async def test_the_answer_after_a_join_notice_is_in_the_first_wait(
    station: Station, tmp_path: Path
) -> None:
    async with (
        mcp_agent(station, tmp_path, "alice") as alice,
        mcp_agent(station, tmp_path, "bob") as bob,
    ):
        _, bob_view = await meet(alice, bob)
        rung = await call(alice, "mesh_ring", {"to": bob_view["petname"], "purpose": "a sum"})
        assert rung["joined"] == 1  # bob's participant_joined: unread for alice
        room = rung["room_topic"]
        question = {"room_topic": room, "kind": "question_asked", "text": "2+2?"}
        asked = (await call(alice, "mesh_say", question))["message_id"]
        answer = {"room_topic": room, "kind": "answer_given", "text": "4", "in_reply_to": asked}
        answered = (await call(bob, "mesh_say", answer))["message_id"]
        await eventually(lambda: recorded(alice, room, answered))

        got = await call(alice, "mesh_wait_room", {"room_topic": room, "wait_seconds": 30})
        assert kinds(got) == ["participant_joined", "answer_given"], got
        assert (got["count"], got["remaining"], got["timed_out"]) == (2, 0, 0)
        assert got["message"]["message_id"] == answered  # the newest of them
        assert got["messages"][1]["in_reply_to"] == asked
        nothing = await call(alice, "mesh_wait_room", {"room_topic": room, "wait_seconds": 0.2})
        assert (nothing["messages"], nothing["message"], nothing["timed_out"]) == ([], None, 1)


async def test_say_waits_past_notices_for_the_answer_and_names_it(
    station: Station, tmp_path: Path
) -> None:
    async with (
        mcp_agent(station, tmp_path, "alice") as alice,
        mcp_agent(station, tmp_path, "bob") as bob,
    ):
        _, bob_view = await meet(alice, bob)
        rung = await call(alice, "mesh_ring", {"to": bob_view["petname"], "purpose": "a sum"})
        room = rung["room_topic"]
        question = {"room_topic": room, "kind": "question_asked", "text": "3+3?"}
        asking = asyncio.create_task(call(alice, "mesh_say", question | {"wait_reply_seconds": 30}))

        async def heard_question() -> str | None:
            inbox = await call(bob, "mesh_read_inbox", {"peek": 1})
            messages = [m for r in inbox["rooms"] if r["room_topic"] == room for m in r["messages"]]
            return next((m["message_id"] for m in messages if m["text"] == "3+3?"), None)

        asked = await eventually(heard_question)
        # notices after the question: bob leaves and comes back, then answers
        await call(bob, "mesh_leave_room", {"room_topic": room})
        rejoined = await call(bob, "mesh_join_room", {"room_topic": room})
        await eventually(lambda: recorded(alice, room, rejoined["message_id"]))
        assert not asking.done()  # notices do not end the wait for an answer
        answer = {"room_topic": room, "kind": "answer_given", "text": "6", "in_reply_to": asked}
        answered = (await call(bob, "mesh_say", answer))["message_id"]

        said = await asking
        assert said["message_id"] == asked
        assert kinds(said) == ["participant_left", "participant_joined", "answer_given"], said
        assert (said["answer_index"], said["timed_out"], said["remaining"]) == (2, 0, 0)
        assert said["reply"]["message_id"] == answered == said["messages"][2]["message_id"]

        quick = await call(alice, "mesh_say", question | {"text": "?", "wait_reply_seconds": 0.2})
        assert (quick["reply"], quick["answer_index"], quick["timed_out"]) == (None, None, 1)


async def test_wait_ring_returns_every_ring_that_reached_us(
    station: Station, tmp_path: Path
) -> None:
    async with (
        mcp_agent(station, tmp_path, "alice") as alice,
        mcp_agent(station, tmp_path, "carol") as carol,
        mcp_agent(station, tmp_path, "bob", "ask") as bob,
    ):
        bob_id = (await call(bob, "mesh_hello", {"operator_name": "bob"}))["node_id"]
        rung = [
            await call(caller, "mesh_ring", {"to": bob_id, "purpose": f"from {name}"})
            for name, caller in (("alice", alice), ("carol", carol))
        ]
        assert [r["answer"] for r in rung] == [3, 3]  # deferred: bob's to answer

        waited = await call(bob, "mesh_wait_ring", {"wait_seconds": 30})
        assert [r["ring_id"] for r in waited["rings"]] == [r["ring_id"] for r in rung]
        assert [r["purpose"] for r in waited["rings"]] == ["from alice", "from carol"]
        assert (waited["count"], waited["remaining"], waited["timed_out"]) == (2, 0, 0)
        assert waited["ring"]["ring_id"] == rung[1]["ring_id"]  # the newest
        again = await call(bob, "mesh_wait_ring", {"wait_seconds": 0.2})
        assert (again["rings"], again["ring"], again["timed_out"]) == ([], None, 1)
