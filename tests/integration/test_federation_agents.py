"""The agent layer across three real stations in one process (loopback, ports 0, SQLite files).

B links to A through ``peers``, C to A and B: a full mesh. Agents (``macula.agent.agent.Agent``) sit
on different stations; presence and rooms travel as pub/sub across one link, rings as RPC
routed by the stations' advert gossip, the agent and station directories are asked of the
agent's own station, which asks its linked stations (never further).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from macula.agent.agent import Agent
from macula.agent.petnames import petname
from macula.agent.presence import HELLO_TOPIC
from macula.agent.proof import ring_endpoint
from macula.node.node import Node
from macula.services.house import AGENTS_LIST, HOUSE_REALM
from macula.services.house_client import HouseClient
from macula.services.limits import MAX_AGENTS_LIST
from macula.wire.identity import ZERO_REALM
from relay.builtins.outcome import Outcome
from relay.house.mesh import DEFAULT_PER_STATION
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import agent_in, hex_of
from support.waiting import eventually

pytestmark = pytest.mark.anyio

Mesh = tuple[Station, Station, Station]


def subscribed_at(station: Station, holder: Station, topic: str) -> bool:
    """``station`` holds ``holder``'s interest in ``topic`` (zero realm)."""
    return holder.node_id in station.core.subscriptions.subscribers((ZERO_REALM, topic.encode()))


async def registered(agent: Agent) -> None:
    """The agent's directory registration at its own station went through."""

    async def done() -> bool:
        return (
            agent._citizen is not None
            and agent.directory_error is None
            and any(row["node_id"] == hex_of(agent) for row in await agent.house.list_agents())
        )

    await eventually(done, message=f"{petname(agent.node.identity.node_id)} not registered")


async def test_agents_on_different_stations_hear_each_others_hello(
    mesh: Mesh, tmp_path: Path
) -> None:
    a, _, c = mesh
    async with (
        agent_in(a, tmp_path / "alice") as alice,
        agent_in(c, tmp_path / "bob") as bob,
    ):
        await alice.hello()
        await bob.hello()
        # each station holds the other's interest in agent.hello: the next beats cross
        await eventually(
            lambda: subscribed_at(a, c, HELLO_TOPIC) and subscribed_at(c, a, HELLO_TOPIC)
        )
        await alice.presence.beat()
        await bob.presence.beat()

        async def in_roster(viewer: Agent, other: Agent) -> bool:
            heard = {entry.node_id for entry in await viewer.presence.agents()}
            return other.node.identity.node_id in heard

        await eventually(lambda: in_roster(alice, bob), message="alice never heard bob")
        await eventually(lambda: in_roster(bob, alice), message="bob never heard alice")
        assert alice.presence.stats["hello_unauthenticated"] == 0  # signed end to end
        assert bob.presence.stats["hello_unauthenticated"] == 0
        assert a.core.stats["relayed_events_received"] >= 1
        assert c.core.stats["relayed_events_received"] >= 1
        await bob.goodbye()

        async def bob_gone() -> bool:
            return not await in_roster(alice, bob)

        await eventually(bob_gone, message="bob's goodbye did not cross")


async def test_the_agent_directory_lists_every_stations_agents_from_any(
    mesh: Mesh, tmp_path: Path
) -> None:
    a, b, c = mesh
    async with (
        agent_in(a, tmp_path / "alice") as alice,
        agent_in(c, tmp_path / "bob") as bob,
        agent_in(b, tmp_path / "carol") as carol,
    ):
        for agent in (alice, bob, carol):
            await agent.hello()
        for agent in (alice, bob, carol):
            await registered(agent)
        where = {hex_of(alice): a, hex_of(bob): c, hex_of(carol): b}
        for viewer in (alice, bob, carol):
            rows = await viewer.house.list_agents()
            assert sorted(row["node_id"] for row in rows) == sorted(where)  # once each
            for row in rows:
                assert row["station"] == where[row["node_id"]].node_id.hex()
                assert row["petname"] == petname(bytes.fromhex(row["node_id"]))
            listed = [r["registered_ms"] for r in rows]
            assert listed == sorted(listed, reverse=True)  # newest first
            # the roster-and-directory view behind mesh_agents: everyone, from any station
            seen = {row["node_id"]: row for row in await viewer.agents()}
            assert set(where) <= set(seen)
            for node_hex, station in where.items():
                assert seen[node_hex]["station"] == station.node_id.hex()
        raw = await alice.house.call(AGENTS_LIST, {"limit": 10})
        assert (raw["stations_asked"], raw["stations_answered"]) == (2, 2)
        await bob.goodbye()  # removes bob's entry at c, so from everywhere

        async def bob_unlisted() -> bool:
            return hex_of(bob) not in {r["node_id"] for r in await alice.house.list_agents()}

        await eventually(bob_unlisted)


async def test_alice_on_a_rings_bob_on_c_and_they_talk(mesh: Mesh, tmp_path: Path) -> None:
    a, _, c = mesh
    async with (
        agent_in(a, tmp_path / "alice") as alice,
        agent_in(c, tmp_path / "bob", "open") as bob,
    ):
        await alice.hello()
        await bob.hello()
        endpoint = ring_endpoint(bob.node.identity.node_id)
        await eventually(
            lambda: a.core.gossip.serving((ZERO_REALM, endpoint), local_only=False) is not None,
            message="bob's ring endpoint never reached a",
        )
        crossed = a.core.stats["calls_forwarded_to_station"]
        rung = await alice.rings.ring(bob.node.identity.node_id, "review the plan")
        assert (rung.answer, rung.joined, rung.unreachable) == (1, 1, 0)
        assert a.core.stats["calls_forwarded_to_station"] == crossed + 1  # over the a-c link
        room = rung.room_topic
        asked = await alice.rooms.say(room, "question_asked", "does the plan hold?")
        heard = await bob.rooms.wait(room, 5, after_ms=0, kinds={"question_asked"})
        assert heard is not None and heard.text == "does the plan hold?" and heard.attested == 1
        waiting = asyncio.create_task(alice.rooms.wait(room, 5, kinds={"answer_given"}))
        answered = await bob.rooms.say(room, "answer_given", "yes", in_reply_to=asked.message_id)
        reply = await waiting
        assert reply is not None and reply.in_reply_to == asked.message_id and reply.attested == 1
        for agent in (alice, bob):
            await agent.node.flush()
            messages = await agent.rooms.transcript.messages(room, limit=100)
            ids = [m.message_id for m in messages]
            assert ids.count(asked.message_id) == 1 and ids.count(answered.message_id) == 1
            assert len(ids) == len(set(ids))
        ring = await alice.rings.store.get(rung.ring_id)
        assert ring is not None and (ring.state, ring.answer) == ("accepted", 1)


async def test_every_station_lists_every_station(mesh: Mesh) -> None:
    stations = list(mesh)
    for station in stations:
        async with Node(new_identity(), [station.endpoint]) as node:
            house = HouseClient(node, node.dht, node.identity)

            async def listing(house: HouseClient = house) -> list[dict[str, Any]] | None:
                found = (await house.list_stations({}))["stations"]
                return found if len(found) == len(stations) else None

            found = await eventually(listing, message="not every station listed")
            assert found[0]["node_id"] == station.node_id.hex()  # this one first
            assert {(s["node_id"], s["host"], s["port"]) for s in found} == {
                (s.node_id.hex(), "127.0.0.1", s.port) for s in stations
            }


async def test_a_station_peers_listing_is_its_own_and_never_fans_out(
    mesh: Mesh, tmp_path: Path
) -> None:
    a, b, c = mesh
    async with agent_in(c, tmp_path / "bob") as bob:
        await bob.hello()
        await registered(bob)
        house_b = b._house
        assert house_b is not None and house_b.mesh_agents is not None
        before = house_b.mesh_agents.stats["mesh_lists"]
        calls_from_b = b.core.stats["station_calls"]
        reply = await a.call_station(b.node_id, AGENTS_LIST, {"limit": 50}, 5, realm=HOUSE_REALM)
        assert reply.ok and reply.payload == {"count": 0, "agents": []}  # bob is c's, not b's
        assert house_b.mesh_agents.stats["mesh_lists"] == before
        assert b.core.stats["station_calls"] == calls_from_b
        # no payload makes a client's listing look like a station's: it still spans the mesh
        async with Node(new_identity(), [b.endpoint]) as node:
            house = HouseClient(node, node.dht, node.identity)
            for marked in ({"from_station": 1}, {"hops_remaining": 0}, {"local": 1}):
                rows = (await house.call(AGENTS_LIST, marked))["agents"]
                assert [r["node_id"] for r in rows] == [hex_of(bob)]


async def test_a_hostile_linked_station_cannot_break_the_listing(
    mesh: Mesh, tmp_path: Path
) -> None:
    a, b, c = mesh
    house_a, house_b = a._house, b._house
    assert house_a is not None and house_a.mesh_agents is not None and house_b is not None
    fake = new_identity().node_id
    garbage: list[object] = [
        "not an entry",
        {"node_id": "zz" * 32, "petname": "x"},
        {"node_id": fake.hex(), "petname": "wrong_petname_1"},
        {"node_id": fake.hex(), "petname": petname(fake), "registered_ms": True},
        *({"node_id": os.urandom(32).hex()} for _ in range(3 * MAX_AGENTS_LIST)),
    ]
    answers: list[object] = [{"agents": garbage}, {"agents": "nope"}, ["not", "a", "map"], None]

    async def hostile(procedure: str, payload: object, caller: bytes, now_ms: int) -> Outcome:
        return Outcome.result(answers[0])

    house_b._handlers[AGENTS_LIST] = hostile
    async with (
        agent_in(a, tmp_path / "alice") as alice,
        agent_in(c, tmp_path / "bob") as bob,
    ):
        for agent in (alice, bob):
            await agent.hello()
        for agent in (alice, bob):
            await registered(agent)
        stats = house_a.mesh_agents.stats
        first = True
        while answers:
            before = dict(stats)
            rows = (await alice.house.call(AGENTS_LIST, {"limit": MAX_AGENTS_LIST}))["agents"]
            assert sorted(r["node_id"] for r in rows) == sorted([hex_of(alice), hex_of(bob)])
            answers.pop(0)
            grew = {k: stats[k] - before.get(k, 0) for k in stats if stats[k] != before.get(k)}
            if first:  # the oversized list: only its first 100 are looked at, all refused
                assert grew["linked_agents_over_limit"] == len(garbage) - DEFAULT_PER_STATION
                assert grew["linked_agents_invalid"] == DEFAULT_PER_STATION - 1
                assert grew["linked_agents_unsigned"] == 1  # well formed, but no agent signed it
                first = False
            else:
                assert grew["linked_lists_invalid"] == 1
            assert grew["linked_agents_listed"] == 1  # bob's, from c


async def test_a_deferred_ring_is_answered_later_across_stations(
    mesh: Mesh, tmp_path: Path
) -> None:
    a, _, c = mesh
    async with (
        agent_in(a, tmp_path / "alice") as alice,
        agent_in(c, tmp_path / "bob", "ask") as bob,
    ):
        await alice.hello()
        await bob.hello()
        for station, callee in ((a, bob), (c, alice)):  # each ring endpoint known across
            endpoint = ring_endpoint(callee.node.identity.node_id)
            await eventually(
                lambda s=station, e=endpoint: s.core.gossip.serving(
                    (ZERO_REALM, e), local_only=False
                )
            )
        rung = await alice.rings.ring(bob.node.identity.node_id, "pair on a bug")
        assert rung.answer == 3
        [pending] = (await bob.inbox()).pending_rings
        answered = await bob.rings.answer_ring(pending.ring_id, 1)
        assert answered.caller_notified == 1  # bob on c reached alice's endpoint on a
        ring = await eventually(lambda: alice.rings.store.get(rung.ring_id))
        assert (ring.state, ring.answer) == ("accepted", 1)
