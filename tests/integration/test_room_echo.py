"""Our own envelope coming back on a room's tap (real station, loopback QUIC, real SQLite): it
was recorded before it went out, so the copy is dropped before the transcript is asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from macula.agent.agent import Agent
from macula.agent.room.rooms import OWN_ECHOES
from macula.node.subscriptions import Delivery
from macula.wire.identity import ZERO_REALM
from relay.station.station import Station
from support.meshkit import agent_in
from support.waiting import eventually

pytestmark = pytest.mark.anyio


async def test_our_own_echo_is_dropped_unrecorded_and_others_still_hear_it(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent_in(station, tmp_path / "alice") as alice,
        agent_in(station, tmp_path / "bob") as bob,
    ):
        await alice.hello()
        await bob.hello()
        room = (await alice.rooms.open("echo")).room_topic
        await bob.rooms.join(room)
        assert (await alice.rooms.wait_unread_all(room, 5)).messages  # bob joined
        await alice.node.flush()
        records: list[str] = []
        record = alice.rooms.transcript.record

        async def counted(**fields: object) -> bool:
            records.append(str(fields["message_id"]))
            return await record(**fields)  # type: ignore[arg-type]

        alice.rooms.transcript.record = counted  # type: ignore[method-assign]
        echoes = alice.rooms.stats["own_echoes"]
        said = await alice.rooms.say(room, "remark_made", "hello bob")
        heard = await bob.rooms.wait_unread_all(room, 5)
        assert [m.message_id for m in heard.messages] == [said.message_id]
        await eventually(lambda: alice.rooms.stats["own_echoes"] == echoes + 1)
        assert records == [said.message_id]  # recorded once, when it was said
        mine = await alice.rooms.transcript.message(room, said.message_id)
        assert mine is not None and mine.attested == 1 and mine.from_hex == alice.rooms.me
        for n in range(OWN_ECHOES):  # the memory is bounded: the oldest id goes first
            alice.rooms._published(room, f"later-{n}")
        assert not alice.rooms._own_echo(room, heard_again(alice, room, said.message_id))
        assert alice.rooms._own_echo(room, heard_again(alice, room, f"later-{OWN_ECHOES - 1}"))


def heard_again(agent: Agent, room: str, message_id: str) -> Delivery:
    """A delivery of an envelope of ours (its id only matters here)."""
    return Delivery(
        ZERO_REALM, room, agent.node.identity.node_id, 1, {"message_id": message_id}, True
    )
