"""Unread marks through the MCP tools over a real station: an answer that arrives before
``mesh_wait_room`` is called is returned at once; after_message_id, read marks and peek."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from relay.station.station import Station
from support.agentkit import call, mcp_agent, meet, refused
from support.waiting import eventually

pytestmark = pytest.mark.anyio


async def test_an_answer_that_arrived_before_the_wait_is_returned_at_once(
    station: Station, tmp_path: Path
) -> None:
    async with (
        mcp_agent(station, tmp_path, "alice") as alice,
        mcp_agent(station, tmp_path, "bob") as bob,
    ):
        _, bob_view = await meet(alice, bob)
        rung = await call(alice, "mesh_ring", {"to": bob_view["petname"], "purpose": "a sum"})
        room = rung["room_topic"]
        first = await call(alice, "mesh_wait_room", {"room_topic": room, "wait_seconds": 10})
        assert first["message"]["kind"] == "participant_joined"  # bob joined: unread till now
        asked = await call(
            alice, "mesh_say", {"room_topic": room, "kind": "question_asked", "text": "2+2?"}
        )
        question = asked["message_id"]
        seen = []  # bob's oldest unread may be alice's room_opened, if his catch-up on joining
        for _ in range(3):  # fetched it before the question arrived: both are unread for him
            heard = await call(bob, "mesh_wait_room", {"room_topic": room, "wait_seconds": 10})
            seen.append(heard["message"]["kind"])
            if heard["message"]["message_id"] == question:
                break
        assert heard["message"]["message_id"] == question, seen
        assert set(seen[:-1]) <= {"room_opened", "participant_joined"}, seen
        answer = {"kind": "answer_given", "text": "4", "in_reply_to": question}
        answered = await call(bob, "mesh_say", {"room_topic": room, **answer})

        async def recorded() -> bool:  # the answer is in alice's transcript before she waits
            inbox = await call(alice, "mesh_read_inbox", {"peek": 1})
            [entry] = [r for r in inbox["rooms"] if r["room_topic"] == room]
            return any(m["message_id"] == answered["message_id"] for m in entry["messages"])

        await eventually(recorded)
        # it asks to wait the longest allowed (an hour); returning at all within the test's
        # own bound means it did not wait: the answer was already there
        with anyio.fail_after(60):
            got = await call(alice, "mesh_wait_room", {"room_topic": room, "wait_seconds": 3600})
        assert got["timed_out"] == 0 and got["message"]["message_id"] == answered["message_id"]
        assert got["message"]["in_reply_to"] == question

        after = {"room_topic": room, "wait_seconds": 5, "after_message_id": question}
        again = await call(alice, "mesh_wait_room", after)  # what follows: read or not
        assert again["message"]["message_id"] == answered["message_id"]
        nothing = await call(alice, "mesh_wait_room", {"room_topic": room, "wait_seconds": 0.2})
        assert nothing["timed_out"] == 1 and nothing["message"] is None

        await call(bob, "mesh_say", {"room_topic": room, "text": "anything else?"})
        await eventually(lambda: _unread(alice, room, 1))
        peeked = await call(alice, "mesh_read_inbox", {"peek": 1})
        assert _entry(peeked, room)["unread"] == 1 and _entry(peeked, room)["lost"] == 0
        read = await call(alice, "mesh_read_inbox")
        assert _entry(read, room)["unread"] == 1
        emptied = await call(alice, "mesh_read_inbox")  # all read: nothing listed, nothing left
        assert (emptied["rooms"], emptied["remaining"], emptied["next_page"]) == ([], 0, None)
        [mine] = (await call(alice, "mesh_rooms"))["joined"]
        assert (mine["unread"], mine["lost"]) == (0, 0)

        bad = await refused(alice, "mesh_wait_room", {**after, "after_message_id": "no such!"})
        assert "after_message_id" in bad["detail"]
        unknown = await refused(alice, "mesh_wait_room", {**after, "after_message_id": "nosuch"})
        assert "not a message recorded" in unknown["detail"]
        assert "peek" in (await refused(alice, "mesh_read_inbox", {"peek": 2}))["detail"]


def _entry(inbox: dict[str, Any], room: str) -> dict[str, Any]:
    [entry] = [r for r in inbox["rooms"] if r["room_topic"] == room]
    return entry


async def _unread(client: Client, room: str, count: int) -> bool:
    [mine] = (await call(client, "mesh_rooms"))["joined"]
    return bool(mine["room_topic"] == room and mine["unread"] == count)
