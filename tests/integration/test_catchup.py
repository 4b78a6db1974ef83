"""Catch-up over a real station: what was said while an agent was away reaches its inbox once,
in order, verified; what the station's history let expire is reported per room."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable
from pathlib import Path

import pytest

from macula.agent.agent import Agent
from relay.house.history import HistoryBounds
from relay.house.services import HouseConfig
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import HELD_OFF, conversation, crash, member, station_config
from support.waiting import eventually

pytestmark = pytest.mark.anyio


async def caught_up(agent: Agent, runs: int) -> None:
    def done() -> bool:
        catch_up = agent.rooms.catch_up
        return catch_up is not None and catch_up.runs >= runs

    catch_up = agent.rooms.catch_up
    stats = None if catch_up is None else (catch_up.runs, dict(catch_up.stats))
    await eventually(done, message=f"catch-up {runs} not done: {stats}")


async def texts_from(agent: Agent, room: str, sender: Agent) -> list[str]:
    me = sender.node.identity.node_id.hex()
    return [
        m.text or m.kind for m in await agent.rooms.transcript.messages(room) if m.from_hex == me
    ]


async def test_an_agent_restarted_with_its_home_catches_up_and_sees_expired_gaps(
    tmp_path: Path,
) -> None:
    config = dataclasses.replace(
        station_config(tmp_path / "station"),
        house=HouseConfig(history_bounds=HistoryBounds(max_per_room=4)),
    )
    bob_id, bob_home = new_identity(), tmp_path / "bob"
    async with (
        Station(config) as station,
        member(station, new_identity(), tmp_path / "alice") as alice,
    ):
        async with member(station, bob_id, bob_home) as bob:
            room = await conversation(alice, bob, "catch-up test")
            await caught_up(bob, 2)  # at hello, then on joining: room_opened came that way
            assert await texts_from(bob, room, alice) == ["catch-up test"]
            crash(bob)
        for n in range(1, 7):
            await alice.rooms.say(room, "remark_made", f"m{n}")
        await alice.node.flush()
        # the room's history keeps 4: m3..m6; room_opened, bob's join, m1, m2 expired
        async with member(station, bob_id, bob_home) as bob:
            await caught_up(bob, 1)
            assert await texts_from(bob, room, alice) == ["catch-up test", "m3", "m4", "m5", "m6"]
            assert await bob.rooms.transcript.gaps() == {room: 2}  # m1 and m2, for good
            inbox = await bob.rooms.inbox(peek=1)
            [thread] = [t for t in inbox.rooms if t.room_topic == room]
            assert thread.lost == 2 and thread.unread == 5  # what bob never read
            order = [await bob.rooms.wait_unread(room, 1) for _ in range(5)]
            assert [m.text for m in order if m] == ["catch-up test", "m3", "m4", "m5", "m6"]
            for message in order:
                assert message is not None and message.attested == 1
            bob.rooms.catch_up_soon()  # again: nothing new, nothing counted twice
            await caught_up(bob, 2)
            assert await bob.rooms.transcript.gaps() == {room: 2}
            assert await texts_from(bob, room, alice) == ["catch-up test", "m3", "m4", "m5", "m6"]


async def test_after_a_reconnect_the_inbox_holds_every_message_exactly_once(
    station: Station, tmp_path: Path
) -> None:
    async with (
        member(station, new_identity(), tmp_path / "alice") as alice,
        member(station, new_identity(), tmp_path / "bob", HELD_OFF) as bob,
    ):
        room = await conversation(alice, bob, "catch-up test")
        await caught_up(bob, 1)
        await alice.rooms.say(room, "remark_made", "before")
        await eventually(lambda: texts_from(bob, room, alice))
        states: list[str] = []
        bob.node.on_state(states.append)
        (await bob.node.session()).close()  # the connection drops; bob stays away until woken
        await eventually(lambda: "disconnected" in states)  # the supervisor is backing off
        for n in range(3):
            await alice.rooms.say(room, "remark_made", f"while away {n}")
        await alice.node.flush()
        assert "while away 0" not in await texts_from(bob, room, alice)
        bob.node.wake()
        await caught_up(bob, 2)
        await alice.rooms.say(room, "remark_made", "after")
        expected = [
            "catch-up test",
            "before",
            "while away 0",
            "while away 1",
            "while away 2",
            "after",
        ]
        await eventually(lambda: _equal(texts_from(bob, room, alice), expected))
        assert await bob.rooms.transcript.gaps() == {}
        with contextlib.suppress(AssertionError):
            await eventually(lambda: _longer(texts_from(bob, room, alice), 6), timeout=0.5)
        assert await texts_from(bob, room, alice) == expected  # and nothing twice


async def _equal(texts: Awaitable[list[str]], expected: list[str]) -> bool:
    return await texts == expected


async def _longer(texts: Awaitable[list[str]], length: int) -> bool:
    return len(await texts) > length


async def test_what_say_returned_for_survives_a_station_stopped_at_once(tmp_path: Path) -> None:
    """``say`` returns once the station has handled the PUBLISH: a station stopped right after
    (no flush, nothing else in between) still has it in its history for a returning agent."""
    config = station_config(tmp_path / "station")
    bob_id, bob_home = new_identity(), tmp_path / "bob"
    alice_id, alice_home = new_identity(), tmp_path / "alice"
    async with (
        Station(config) as station,
        member(station, alice_id, alice_home) as alice,
        member(station, bob_id, bob_home) as bob,
    ):
        room = await conversation(alice, bob, "catch-up test")
        await caught_up(bob, 2)
        crash(bob)
        crash(alice)
        for n in range(3):
            await alice.rooms.say(room, "remark_made", f"last words {n}")
        await station.stop()  # at once: what say returned for must already be there
    async with Station(config) as again, member(again, bob_id, bob_home) as bob:
        await caught_up(bob, 1)
        expected = ["catch-up test", "last words 0", "last words 1", "last words 2"]
        assert await texts_from(bob, room, alice) == expected
