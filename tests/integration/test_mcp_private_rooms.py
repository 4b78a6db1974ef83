"""A private room through the MCP tools, over a real station: mesh_open_room private=1, mesh_say,
mesh_read_inbox, mesh_rooms, mesh_leave_room remove=[...]; a wire-level subscriber sees only
ciphertext, and the removed participant reads nothing said after."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from mcp import Client

from macula.node.node import Node
from macula.node.subscriptions import Delivery
from macula.wire.identity import ZERO_REALM
from relay.station.station import Station
from support.agentkit import call, mcp_agent, meet, refused
from support.identities import new_identity
from support.waiting import eventually

pytestmark = pytest.mark.anyio

SECRET = "tools-secret-31c8: the rollout starts at noon"
REPLY = "tools-reply-77ad: noted"
AFTER = "tools-after-0e9b: bob was removed"


async def test_private_room_through_the_tools(station: Station, tmp_path: Path) -> None:
    async with (
        mcp_agent(station, tmp_path, "alice") as alice,
        mcp_agent(station, tmp_path, "bob") as bob,
        Node(new_identity(), [station.endpoint]) as eve,
    ):
        _, bob_view = await meet(alice, bob)
        bob_hex = bob_view["node_id"]
        for bad in ({"private": 1, "public": 1}, {"private": 2}):
            error = await refused(alice, "mesh_open_room", bad)
            assert error["code"] == "invalid_argument", error
        opened = await call(
            alice,
            "mesh_open_room",
            {"purpose": "rollout", "private": 1, "participants": [bob_hex]},
        )
        assert (opened["private"], opened["public"]) == (1, 0)
        assert opened["joined"] == [bob_view["petname"]], opened
        room = opened["room_topic"]

        heard: list[Delivery] = []
        tap = await eve.subscribe(ZERO_REALM, room)

        async def pump() -> None:
            async for delivery in tap:
                heard.append(delivery)

        pumping = asyncio.create_task(pump())
        await eve.flush()

        asked = await call(alice, "mesh_say", {"room_topic": room, "text": SECRET})

        async def inbox_texts(client: Client) -> list[str]:
            inbox = await call(client, "mesh_read_inbox")
            return [m.get("text", "") for r in inbox["rooms"] for m in r["messages"]]

        await eventually(lambda: _has(inbox_texts(bob), SECRET))
        await call(
            bob,
            "mesh_say",
            {
                "room_topic": room,
                "kind": "answer_given",
                "text": REPLY,
                "in_reply_to": asked["message_id"],
            },
        )
        await eventually(lambda: _has(inbox_texts(alice), REPLY))
        [mine] = [r for r in (await call(alice, "mesh_rooms"))["joined"] if r["room_topic"] == room]
        assert (mine["private"], mine["epoch"], mine["undecryptable"]) == (1, 1, 0)

        # only the opener removes; then bob cannot read or say anything more
        error = await refused(bob, "mesh_leave_room", {"room_topic": room, "remove": [bob_hex]})
        assert error["code"] == "refused" and "opener" in error["detail"]
        error = await refused(alice, "mesh_leave_room", {"room_topic": room, "remove": []})
        assert error["code"] == "invalid_argument"
        removed = await call(alice, "mesh_leave_room", {"room_topic": room, "remove": [bob_hex]})
        assert (removed["epoch"], removed["left"]) == (2, 0)
        assert [r["node_id"] for r in removed["removed"]] == [bob_hex]

        async def bob_on_epoch(epoch: int, undecryptable: int) -> bool:
            rows = (await call(bob, "mesh_rooms"))["joined"]
            [row] = [r for r in rows if r["room_topic"] == room]
            return row["epoch"] == epoch and row["undecryptable"] >= undecryptable

        await eventually(lambda: bob_on_epoch(2, 0))
        await call(alice, "mesh_say", {"room_topic": room, "text": AFTER})
        await eventually(lambda: bob_on_epoch(2, 1))
        assert AFTER not in await inbox_texts(bob)
        error = await refused(bob, "mesh_say", {"room_topic": room, "text": "still here"})
        assert error["code"] == "refused" and "no key" in error["detail"]

        await eventually(lambda: sum("cipher" in d.payload for d in heard) >= 3)
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumping
        wire = json.dumps([d.payload for d in heard])
        for secret in (SECRET, REPLY, AFTER, "rollout"):
            assert secret not in wire


async def _has(texts: object, text: str) -> bool:
    assert asyncio.iscoroutine(texts)
    return text in await texts
