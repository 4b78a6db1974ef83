"""``mesh_say`` while the station is down, through two real ``macula-mcp`` processes and the
official MCP client (issue 37): each say is accepted (``delivered`` 0, ``next``,
``outbox.queued``), a say with a reply wait does not wait, the 101st is a structured
``outbox_full``; once the station is back the queue drains by itself and bob, joining then, reads
every one of them exactly once."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import pytest
from mcp import Client

from macula.agent.room.outbox import MAX_QUEUED_MESSAGES
from relay.station.station import Station, StationConfig
from support.mcpkit import bad, good, server_env, server_params
from support.processkit import free_udp_port

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


async def test_says_in_the_dark_are_queued_bounded_and_sent_when_back(tmp_path: Path) -> None:
    config = StationConfig(data_dir=tmp_path / "station", port=free_udp_port())
    async with AsyncExitStack() as clients:
        async with Station(config) as station:
            endpoint = station.endpoint
            env = server_env(tmp_path / "alice", endpoint, MACULA_MCP_CONTACT_POLICY="open")
            alice = await clients.enter_async_context(Client(server_params(env)))
            room = (await good(alice, "mesh_open_room", purpose="outbox"))["room_topic"]
            assert (await good(alice, "mesh_say", room_topic=room, text="live"))["delivered"] == 1
        told = await _say_in_the_dark(alice, room)
        async with Station(config):  # back: alice's queue drains by itself
            env = server_env(tmp_path / "bob", endpoint, MACULA_MCP_CONTACT_POLICY="open")
            bob = await clients.enter_async_context(Client(server_params(env)))
            await good(bob, "mesh_join_room", room_topic=room)
            read: list[str] = []
            with anyio.fail_after(60):
                while told[-1] not in read:
                    waited = await good(bob, "mesh_wait_room", room_topic=room, wait_seconds=5)
                    read += [m["text"] for m in waited["messages"] if m["text"] in told]
            assert sorted(read) == sorted(told)  # every one, exactly once
            await clients.aclose()


async def _say_in_the_dark(alice: Client, room: str) -> list[str]:
    """Fill alice's outbox while the station is down; what she was told was queued."""
    first = await good(alice, "mesh_say", room_topic=room, text="dark 0")
    assert (first["delivered"], first["outbox"]) == (0, {"queued": 1})
    assert first["next"].startswith("queued: delivered when the connection")
    asked = await good(
        alice,
        "mesh_say",
        room_topic=room,
        kind="question_asked",
        text="anyone?",
        wait_reply_seconds=600,
    )  # returns at once: nothing to wait for yet
    assert asked["delivered"] == 0 and "reply wait was skipped" in asked["next"]
    told = ["dark 0", "anyone?"]
    for n in range(2, MAX_QUEUED_MESSAGES):
        said = await good(alice, "mesh_say", room_topic=room, text=f"dark {n}")
        assert (said["delivered"], said["outbox"]["queued"]) == (0, n + 1)
        told.append(f"dark {n}")
    full = await bad(alice, "mesh_say", room_topic=room, text="one too many")
    assert (full["code"], full["retryable"]) == ("outbox_full", 1)
    assert full["outbox"]["queued"] == MAX_QUEUED_MESSAGES
    rooms = await good(alice, "mesh_rooms")  # where the agent sees its queue without saying
    assert rooms["outbox"] == {"queued": MAX_QUEUED_MESSAGES}
    [mine] = [r for r in rooms["joined"] if r["room_topic"] == room]
    assert mine["outbox_queued"] == MAX_QUEUED_MESSAGES
    return told
