"""House services over a real station: shared memory, station directory, agent directory."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from macula.agent.petnames import petname
from macula.agent.proof import make_proof
from macula.errors import MaculaError, MeshError
from macula.node.node import Node
from macula.services.house import AGENTS_REGISTER, HOUSE_REALM
from macula.services.house_client import HouseClient
from macula.wire.identity import ZERO_REALM, Identity
from macula.wire.record_keys import storage_key_for_procedure
from macula.wire.records import RecordType
from relay.house.services import HouseConfig
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import agent_in, station_config
from support.waiting import eventually

pytestmark = pytest.mark.anyio

DOC_V1 = (
    "Rotating TLS certificates: renew the certificate a week before it expires "
    "and reload the station."
)
DOC_V2 = "Rotating TLS certificates: now automated by the operator's renewal timer every night."


@pytest.fixture
async def house_station(tmp_path: Path) -> AsyncIterator[Station]:
    config = station_config(tmp_path / "station")
    config.house = HouseConfig(
        city="Brussels", country="BE", continent="Europe", lat=50.85, lng=4.35
    )
    async with Station(config) as running:
        async with Node(new_identity(), [running.endpoint]) as probe:
            await eventually(lambda: announced(probe))
        yield running


async def announced(node: Node) -> bool:
    """The station has stored its service records in its own DHT store (its station
    directory record is stored after the procedure advertisements)."""
    found = await node.call(
        ZERO_REALM, "_dht.find_records_by_type", {"type": RecordType.NODE_RECORD}
    )
    return bool(found)


async def test_remember_then_recall_across_agents(house_station: Station) -> None:
    async with (
        Node(new_identity(), [house_station.endpoint]) as alice,
        Node(new_identity(), [house_station.endpoint]) as bob,
    ):
        alice_house, bob_house = (
            HouseClient(alice, alice.dht, alice.identity),
            HouseClient(bob, bob.dht, bob.identity),
        )
        stored = await alice_house.remember(DOC_V1, source_label="ops.md", document_id="ops.md")
        assert stored["chunks"] >= 1 and stored["realm"] == HOUSE_REALM.hex()
        found = await bob_house.recall("how do I renew TLS certificates", top_k=5)
        [hit] = [h for h in found["hits"] if h["document_id"] == "ops.md"]
        assert hit["content_verified"] == 1 and hit["depositor"] == alice.identity.node_id.hex()
        await alice_house.remember(DOC_V2, source_label="ops.md", document_id="ops.md")
        again = await bob_house.recall("renewal timer", top_k=5)
        texts = [h["text"] for h in again["hits"] if h["document_id"] == "ops.md"]
        assert texts and all("week before" not in t for t in texts)  # replaced, not duplicated
        assert (await bob_house.recall("zebra crossing quantum", top_k=5))["hits"] == []
        with pytest.raises(MeshError):
            await bob_house.recall("tls", top_k=101)
        with pytest.raises(MeshError) as too_big:
            await alice_house.remember("x " * 200_000)
        assert too_big.value.code == 0x0D


async def test_deposits_are_rate_limited_per_depositor(house_station: Station) -> None:
    async with Node(new_identity(), [house_station.endpoint]) as node:
        house = HouseClient(node, node.dht, node.identity)
        outcomes = []
        for i in range(40):
            try:
                await house.remember(f"note number {i} about sourdough starter feeding schedules")
                outcomes.append("ok")
            except MeshError as exc:
                outcomes.append(exc.code)
        assert "ok" in outcomes and 0x08 in outcomes


async def test_a_tampered_hit_is_reported_unverified(house_station: Station) -> None:
    async with Node(new_identity(), [house_station.endpoint]) as node:
        house = HouseClient(node, node.dht, node.identity)
        await house.remember(DOC_V1, document_id="tls.md")
        db = sqlite3.connect(house_station.config.data_dir / "memory.sqlite3")
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            if "text" in columns:
                db.execute(f"UPDATE {table} SET text = replace(text, 'week', 'year')")
        db.commit()
        db.close()
        hits = (await house.recall("renew certificate", top_k=5))["hits"]
        assert hits and all(h["content_verified"] == 0 for h in hits)


async def test_list_stations_filters(house_station: Station) -> None:
    async with Node(new_identity(), [house_station.endpoint]) as node:
        house = HouseClient(node, node.dht, node.identity)
        everything = await house.list_stations({})
        assert everything["count"] == 1 and everything["stations"][0]["city"] == "Brussels"
        assert (await house.list_stations({"country": "be"}))["count"] == 1
        assert (await house.list_stations({"country": "FR"}))["count"] == 0
        near = await house.list_stations({"near": {"lat": 48.85, "lng": 2.35, "limit": 1}})
        assert 200 < near["stations"][0]["distance_km"] < 300  # Paris to Brussels
        with pytest.raises(MeshError):
            await house.list_stations({"near": {"lat": "north"}})


async def test_a_fresh_agent_sees_a_registered_agent_before_its_hello(
    house_station: Station, tmp_path: Path
) -> None:
    async with agent_in(house_station, tmp_path / "alice") as alice:
        await alice.hello()
        me = alice.node.identity.node_id.hex()

        async def settled() -> bool:  # her first hello went out and she is in the directory
            listed = await alice.house.list_agents()
            return alice.presence.last_beat_ms is not None and any(
                a.get("node_id") == me for a in listed
            )

        await eventually(settled)
        await alice.node.flush()  # alice's first hello is long gone when bob arrives
        async with agent_in(house_station, tmp_path / "bob") as bob:
            await bob.hello()
            rows = await bob.agents()
            [row] = [r for r in rows if r["node_id"] == alice.node.identity.node_id.hex()]
            assert row["source"] == "directory" and row["petname"]


async def test_an_entry_proven_by_another_key_is_refused(house_station: Station) -> None:
    mallory = new_identity()
    async with Node(mallory, [house_station.endpoint]) as node:
        house = HouseClient(node, node.dht, node.identity)
        victim = new_identity()
        proof = make_proof(victim, f"{AGENTS_REGISTER}#{victim.node_id.hex()}", _now())
        entry = {"node_id": victim.node_id.hex(), "petname": "x"}
        with pytest.raises(MeshError):
            await house.call(AGENTS_REGISTER, {"entry": entry, "proof": dict(proof)})
        own_proof_wrong_key = make_proof(
            victim, f"{AGENTS_REGISTER}#{mallory.node_id.hex()}", _now()
        )
        with pytest.raises(MeshError):
            await house.call(
                AGENTS_REGISTER,
                {"entry": {"node_id": mallory.node_id.hex()}, "proof": dict(own_proof_wrong_key)},
            )


def _now() -> int:
    return time.time_ns() // 1_000_000


async def test_a_switched_off_service_is_not_served(tmp_path: Path) -> None:
    config = station_config(tmp_path / "station")
    config.house = HouseConfig(memory=False)
    async with Station(config) as station, Node(new_identity(), [station.endpoint]) as node:
        await eventually(lambda: announced(node))
        house = HouseClient(node, node.dht, node.identity)
        with pytest.raises(MaculaError):
            await house.recall("anything")
        assert (await house.list_stations({}))["count"] == 1  # the others still are
        with pytest.raises(MeshError) as no_route:
            await node.call(HOUSE_REALM, "macula.memory.query_v1", {"query_text": "x"})
        assert no_route.value.code == 0x01


@pytest.fixture
async def small_house(tmp_path: Path) -> AsyncIterator[Station]:
    config = station_config(tmp_path / "station")
    config.house = HouseConfig(
        memory_max_bytes=2_000, memory_deposit_rate=100.0, memory_query_rate=1.0
    )
    async with Station(config) as running:
        async with Node(new_identity(), [running.endpoint]) as probe:
            await eventually(lambda: announced(probe))
        yield running


def _weak_identity() -> Identity:
    """A fresh identity that fails the directory's puzzle (difficulty 8)."""
    while True:
        identity = Identity(os.urandom(32))
        if not identity.has_valid_puzzle(8):
            return identity


async def test_house_limits_refuse_the_flooder_and_serve_the_honest(small_house: Station) -> None:
    async with (
        Node(_weak_identity(), [small_house.endpoint]) as mallory,
        Node(new_identity(), [small_house.endpoint]) as bob,
    ):
        bad, good = (
            HouseClient(mallory, mallory.dht, mallory.identity),
            HouseClient(bob, bob.dht, bob.identity),
        )
        await good.remember(DOC_V1, document_id="tls.md")
        with pytest.raises(MeshError) as weak:  # an unhardened identity is not listed
            await bad.register_agent({"petname": petname(mallory.identity.node_id)})
        assert weak.value.code == 0x0A and "puzzle_required" in str(weak.value.detail)
        await good.register_agent({"petname": petname(bob.identity.node_id)})
        assert [a["node_id"] for a in await good.list_agents()] == [bob.identity.node_id.hex()]
        with pytest.raises(MeshError) as full:  # the station's memory fills up
            for i in range(100):
                await bad.remember(f"{DOC_V2} {i}", document_id=f"junk-{i}")
        assert full.value.code == 0x0F and "shared memory is full" in str(full.value.detail)
        with pytest.raises(MeshError) as flooded:  # recall is rate-limited per identity
            for _ in range(100):
                await bad.recall("certificates")
        assert flooded.value.code == 0x08 and "retry in" in str(flooded.value.detail)
        found = await good.recall("renew TLS certificates", top_k=5)  # bob is unaffected
        assert [h["document_id"] for h in found["hits"]][:1] == ["tls.md"]


async def test_house_services_resolve_as_soon_as_the_station_has_started(tmp_path: Path) -> None:
    """No wait for the refresh task: a client that connects the moment ``start`` returns
    resolves a house procedure (CI stop 43 caught a register call made too early)."""
    async with Station(station_config(tmp_path / "station")) as station:
        assert station.records is not None
        key = storage_key_for_procedure(AGENTS_REGISTER)
        stored = await station.records.find(key, int(time.time() * 1000))
        assert any(r.key == station.identity.node_id for r in stored)
        async with Node(new_identity(), [station.endpoint]) as node:
            realm = await HouseClient(node, node.dht, node.identity).realm_of(AGENTS_REGISTER)
            assert realm == HOUSE_REALM
