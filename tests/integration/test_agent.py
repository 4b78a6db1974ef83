"""The agent layer over a real station: presence, rooms, rings, contact policy."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from macula.agent.agent import Agent
from macula.agent.envelope import LOBBY_TOPIC, build_envelope, new_message_id
from macula.agent.petnames import petname
from macula.agent.proof import build_ring, make_proof, ring_endpoint
from macula.agent.rings import RATE_WINDOW_MS
from macula.node.node import Node
from macula.wire.identity import ZERO_REALM
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import agent_in
from support.waiting import eventually

pytestmark = pytest.mark.anyio


agent = agent_in


async def test_presence_hello_roster_and_goodbye(station: Station, tmp_path: Path) -> None:
    async with agent(station, tmp_path / "alice") as alice, agent(station, tmp_path / "bob") as bob:
        await alice.hello()
        await bob.hello(message="hi all")
        bob_hex = bob.node.identity.node_id.hex()

        async def alice_sees_bob() -> bool:
            return any(
                a["node_id"] == bob_hex and a["message"] == "hi all" for a in await alice.agents()
            )

        await eventually(alice_sees_bob)
        row = next(a for a in await alice.agents() if a["node_id"] == bob_hex)
        assert row["petname"] == petname(bob.node.identity.node_id) and row["stale"] == 0
        assert await alice.resolve(row["petname"]) == bob.node.identity.node_id
        await bob.goodbye()

        async def bob_gone() -> bool:
            return all(a["node_id"] != bob_hex for a in await alice.agents())

        await eventually(bob_gone)
        assert not bob.presence.present and bob.presence.said_goodbye
        await bob.ensure_present()  # after goodbye only an explicit hello restarts presence
        assert not bob.presence.present


async def test_spoofed_hello_and_goodbye_are_ignored(station: Station, tmp_path: Path) -> None:
    async with (
        agent(station, tmp_path / "alice") as alice,
        Node(new_identity(), [station.endpoint]) as mallory,
    ):
        await alice.hello()
        victim = new_identity().node_id.hex()
        await mallory.publish(
            ZERO_REALM, "agent.hello", {"node_id": victim, "interval_seconds": 60, "at": 1}
        )
        await mallory.publish(
            ZERO_REALM, "agent.goodbye", {"node_id": alice.node.identity.node_id.hex(), "at": 1}
        )
        await eventually(
            lambda: (
                alice.presence.stats["hello_ignored"] >= 1
                and alice.presence.stats["goodbye_ignored"] >= 1
            )
        )
        assert all(a["node_id"] != victim for a in await alice.agents())


async def test_open_ring_accepted_and_a_conversation(station: Station, tmp_path: Path) -> None:
    async with (
        agent(station, tmp_path / "alice") as alice,
        agent(station, tmp_path / "bob", "open") as bob,
    ):
        await alice.hello()
        await bob.hello()
        await bob.node.flush()  # bob's ring endpoint is advertised at the station
        rung = await alice.rings.ring(bob.node.identity.node_id, "review the plan")
        assert (rung.answer, rung.joined, rung.unreachable) == (1, 1, 0)
        room = rung.room_topic
        asked = await alice.rooms.say(room, "question_asked", "does the plan hold?")
        heard = await bob.rooms.wait(room, 5, after_ms=0, kinds={"question_asked"})
        assert heard is not None and heard.text == "does the plan hold?" and heard.attested == 1
        waiting = asyncio.create_task(alice.rooms.wait(room, 5, kinds={"answer_given"}))
        await bob.rooms.say(room, "answer_given", "yes", in_reply_to=asked.message_id)
        reply = await waiting
        assert reply is not None and reply.in_reply_to == asked.message_id
        inbox = await alice.inbox()
        [entry] = [r for r in inbox.rooms if r.room_topic == room]
        answer = next(m for m in entry.messages if m["kind"] == "answer_given")
        assert (answer["thread_root"], answer["depth"]) == (asked.message_id, 1)


async def test_ask_policy_defers_then_the_answer_reaches_the_caller(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent(station, tmp_path / "alice") as alice,
        agent(station, tmp_path / "bob", "ask") as bob,
    ):
        await alice.hello()
        await bob.hello()
        await bob.node.flush()  # bob's ring endpoint is advertised at the station
        waiting = asyncio.create_task(bob.rings.wait_ring(5))
        rung = await alice.rings.ring(bob.node.identity.node_id, "pair on a bug")
        assert rung.answer == 3
        incoming = await waiting
        assert incoming is not None and incoming.answer == 3
        assert incoming.sender == alice.node.identity.node_id and incoming.late_answer == 0
        [pending] = (await bob.inbox()).pending_rings
        answered = await bob.rings.answer_ring(pending.ring_id, 1)
        assert answered.caller_notified == 1
        joined = await alice.rooms.wait(
            rung.room_topic,
            5,
            after_ms=0,
            kinds={"participant_joined"},
            sender=bob.node.identity.node_id.hex(),
        )
        assert joined is not None
        ring = await alice.rings.store.get(rung.ring_id)
        assert ring is not None and (ring.state, ring.answer) == ("accepted", 1)


async def test_closed_policy_declines_and_unserved_is_unreachable(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent(station, tmp_path / "alice") as alice,
        agent(station, tmp_path / "bob", "closed") as bob,
        agent(station, tmp_path / "carol", serve_rings=False) as carol,
    ):
        for a in (alice, bob, carol):
            await a.hello()
            await a.node.flush()  # ring endpoints advertised, taps subscribed
        declined = await alice.rings.ring(bob.node.identity.node_id, "hello?")
        assert declined.answer == 2 and declined.reason
        unreachable = await alice.rings.ring(carol.node.identity.node_id, "hello?")
        assert unreachable.unreachable == 1 and unreachable.answer is None


async def test_a_ring_proven_for_another_procedure_is_declined_unrecorded(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent(station, tmp_path / "alice") as alice,
        agent(station, tmp_path / "bob", "open") as bob,
    ):
        await bob.hello()
        await bob.node.flush()  # bob's ring endpoint is advertised at the station
        now = alice.clock()
        room = (await alice.rooms.open("x")).room_topic
        bob_id = bob.node.identity.node_id
        payload = dict(build_ring(alice.node.identity, bob_id, "x", room, "ring1", now))
        payload["proof"] = dict(
            make_proof(alice.node.identity, ring_endpoint(bob_id) + "#ring:other", now)
        )
        reply = await alice.node.call(ZERO_REALM, ring_endpoint(bob_id), payload)
        assert reply["answer"] == 2 and "unverified" in reply["reason"]
        assert await bob.rings.store.get("ring1") is None


async def test_spoofed_room_message_is_recorded_unattested_and_never_a_reply(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent(station, tmp_path / "alice") as alice,
        Node(new_identity(), [station.endpoint]) as mallory,
    ):
        await alice.hello()
        room = (await alice.rooms.open("private")).room_topic
        forged = build_envelope(
            message_id=new_message_id(os.urandom(16)),
            room_topic=room,
            sender=new_identity().node_id,
            kind="remark_made",
            text="not me",
            sent_at=alice.clock(),
        )
        await mallory.publish(ZERO_REALM, room, dict(forged))
        assert await alice.rooms.wait(room, 0.5) is None  # unattested: not a reply
        await eventually(lambda: alice.rooms.stats["unattested"] >= 1)
        await mallory.publish(ZERO_REALM, room, {"kind": "remark_made"})
        await eventually(lambda: alice.rooms.stats["invalid_envelopes"] >= 1)


async def test_public_rooms_are_announced_on_central_and_observed(
    station: Station, tmp_path: Path
) -> None:
    async with agent(station, tmp_path / "alice") as alice, agent(station, tmp_path / "bob") as bob:
        await alice.hello()
        await bob.hello()
        await bob.node.flush()  # bob taps central before alice announces on it
        opened = await alice.rooms.open("open office hours", public=1)

        async def bob_sees_it() -> bool:
            seen = await bob.rooms.transcript.seen_rooms()
            return any(r.room_topic == opened.room_topic for r in seen)

        await eventually(bob_sees_it)
        assert opened.room_topic in bob.rooms.observed()
        await alice.rooms.say(LOBBY_TOPIC, "help_requested", "anyone know QUIC?")
        await eventually(lambda: _has_help(bob))


async def _has_help(agent: Agent) -> bool:
    return any(m.kind == "help_requested" for m in (await agent.inbox()).central_help)


async def test_trust_by_petname_turns_ask_into_allowlist(station: Station, tmp_path: Path) -> None:
    async with (
        agent(station, tmp_path / "alice") as alice,
        agent(station, tmp_path / "bob", "ask") as bob,
    ):
        await bob.hello()  # bob listens before alice's first (immediate) hello
        await bob.node.flush()
        await alice.hello()
        alice_name = petname(alice.node.identity.node_id)

        async def bob_knows_alice() -> bool:
            return any(a["petname"] == alice_name for a in await bob.agents())

        await eventually(bob_knows_alice)
        trusted = await bob.trust(alice_name)
        assert trusted["contact_policy"] == "allowlist"
        rung = await alice.rings.ring(bob.node.identity.node_id, "trusted now")
        assert rung.answer == 1
        await bob.untrust(alice.node.identity.node_id.hex())
        assert bob.rings.policy().mode.label == "allowlist"
        stepped = bob.rings.clock  # one ring per caller per 2 s: step bob's clock past it
        bob.rings.clock = lambda: stepped() + RATE_WINDOW_MS
        again = await alice.rings.ring(bob.node.identity.node_id, "and now?")
        assert again.answer == 2 and "rate limited" not in (again.reason or "")
