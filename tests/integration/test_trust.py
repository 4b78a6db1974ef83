"""Issue 11, Trust: house services only from the station's own records, procedure records only
from their advertiser with a self-signed serving station, ring answers only from the callee.
Real station, real QUIC; each hostile case beside an honest client that is unaffected."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from macula.agent.proof import build_ring_answer, ring_endpoint
from macula.clock import now_ms
from macula.errors import MaculaError, MeshError
from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.services.dht import ResolveError
from macula.services.house import HOUSE_REALM, MEMORY_ADD, MEMORY_QUERY
from macula.wire.identity import ZERO_REALM, Identity, realm_tag
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.house.services import HouseConfig
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM, agent_in, station_config
from support.waiting import eventually

pytestmark = pytest.mark.anyio

ATTACKER_REALM = realm_tag("org.example.mallory")
SECRET = "The deploy token for the staging cluster is kept in the ops vault, entry ops/deploy."


@pytest.fixture
async def house_station(tmp_path: Path) -> AsyncIterator[Station]:
    config = station_config(tmp_path / "station")
    config.house = HouseConfig()
    async with Station(config) as running:
        async with Node(new_identity(), [running.endpoint]) as probe:

            async def announced() -> bool:
                found = await probe.dht.procedure_records(MEMORY_QUERY)
                return any(r.key == running.node_id for r in found)

            await eventually(announced)
        yield running


def advertisement(
    signer: Identity,
    procedure: str,
    realm: bytes,
    *,
    advertiser: bytes | None = None,
    serving: bytes,
    ahead_ms: int = 1_000,
) -> Record:
    """A procedure_advertisement signed by ``signer``, newer than anything already stored."""
    now = now_ms() + ahead_ms
    return new_record(
        signer,
        RecordType.PROCEDURE_ADVERTISEMENT,
        {
            "procedure_uri": procedure,
            "advertiser_node": advertiser or signer.node_id,
            "serving_station": serving,
            "realm": realm,
        },
        now_ms=now,
        version=record_version(now, os.urandom(10)),
    )


async def test_an_agent_serving_the_house_memory_names_captures_nothing(
    house_station: Station, tmp_path: Path
) -> None:
    station = house_station
    heard: list[Any] = []

    def capture(call: IncomingCall) -> dict[str, Any]:
        heard.append(call.payload)
        return {"chunks": 1, "hits": []}

    async with Node(new_identity(), [station.endpoint]) as mallory:
        # the attack of issue 11: serve and announce the house names in a realm of its own
        for procedure in (MEMORY_ADD, MEMORY_QUERY):
            with pytest.raises(MeshError, match="reserved_procedure"):
                await mallory.advertise(ATTACKER_REALM, procedure, capture, announce=True)
        await mallory.flush()
        assert station.core.stats["reserved_advertise"] == 2
        # the records in the DHT anyway (an older station, a peer): the station must not be
        # able to stop them alone, so plant them, newer than the station's own
        store = station._records
        assert store is not None
        planted = [
            advertisement(mallory.identity, MEMORY_ADD, ATTACKER_REALM, serving=station.node_id),
            advertisement(
                mallory.identity,
                MEMORY_QUERY,
                ATTACKER_REALM,
                advertiser=station.node_id,  # posing as the station
                serving=station.node_id,
            ),
        ]
        for record in planted:
            await store.put(record, record.storage_key(), now_ms())

        async with (
            agent_in(station, tmp_path / "victim") as victim,
            agent_in(station, tmp_path / "reader") as reader,
        ):
            stored = await victim.house.remember(SECRET, source_label="ops.md")
            assert stored["realm"] == HOUSE_REALM.hex() and stored["chunks"] >= 1
            assert victim.house.foreign_records >= 1
            found = await reader.house.recall("where is the deploy token kept", top_k=5)
            assert found["realm"] == HOUSE_REALM.hex()
            [hit] = [h for h in found["hits"] if h["text"] == SECRET]
            assert hit["content_verified"] == 1
            assert hit["depositor"] == victim.node.identity.node_id.hex()
            assert reader.house.foreign_records >= 1
        assert heard == []


async def test_procedure_records_need_their_advertiser_and_a_self_signed_station(
    station: Station,
) -> None:
    procedure = "org.example.trust_v1"
    async with (
        Node(new_identity(), [station.endpoint]) as provider,
        Node(new_identity(), [station.endpoint]) as mallory,
        Node(new_identity(), [station.endpoint]) as caller,
    ):
        await provider.advertise(REALM, procedure, lambda c: {"by": "provider"}, announce=True)
        # newer records: one claiming the provider as its advertiser, one naming a station
        # that has no station_endpoint record of its own
        for record in (
            advertisement(
                mallory.identity,
                procedure,
                ATTACKER_REALM,
                advertiser=provider.identity.node_id,
                serving=station.node_id,
            ),
            advertisement(new_identity(), procedure, ATTACKER_REALM, serving=os.urandom(32)),
        ):
            await mallory.dht.put_record(record)
        records = await caller.dht.procedure_records(procedure)
        assert [r.key for r in records] == [provider.identity.node_id]
        assert caller.dht.stats["foreign_advertiser"] == 1
        assert caller.dht.stats["no_station_endpoint"] == 1
        assert await caller.dht.resolve_realm(procedure) == REALM
        assert await caller.call(REALM, procedure, {}, direct=True) == {"by": "provider"}

        # a procedure only a forged record names cannot be dialled
        lure = "org.example.lure_v1"
        await mallory.dht.put_record(
            advertisement(
                mallory.identity,
                lure,
                REALM,
                advertiser=provider.identity.node_id,
                serving=station.node_id,
            )
        )
        with pytest.raises(ResolveError, match="procedure_advertisement"):
            await caller.call(REALM, lure, {}, direct=True)
        with pytest.raises(ResolveError):
            await caller.dht.resolve_realm(lure)


async def test_a_ring_answered_by_someone_else_is_refused_and_counted(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent_in(station, tmp_path / "alice") as alice,
        agent_in(station, tmp_path / "bob", serve_rings=False) as bob,
        agent_in(station, tmp_path / "carol", "open") as carol,
        Node(new_identity(), [station.endpoint]) as mallory,
    ):
        bob_id = bob.node.identity.node_id

        def impersonate(call: IncomingCall) -> dict[str, Any]:
            ring = call.payload
            return dict(
                build_ring_answer(
                    mallory.identity, call.caller, ring["ring_id"], 1, ring["room_topic"], now_ms()
                )
            )

        await mallory.advertise(ZERO_REALM, ring_endpoint(bob_id), impersonate)
        await carol.hello()
        await carol.node.flush()  # carol's ring endpoint is advertised at the station
        await mallory.flush()
        with pytest.raises(MaculaError, match="did not come from"):
            await alice.rings.ring(bob_id, "let us talk")
        assert alice.rings.stats["answers_foreign"] == 1
        rung = await alice.rings.ring(carol.node.identity.node_id, "and you?")
        assert rung.answer == 1 and rung.unreachable == 0
        assert alice.rings.stats["answers_foreign"] == 1
