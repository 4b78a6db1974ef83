"""The station's disk bounds over real QUIC (issue 11): a client stuffing the DHT or the content
store is refused with a clear ERROR, and an honest client on the same station is unaffected.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from macula.errors import MeshError
from macula.node.node import Node
from macula.services.dht import DhtClient, ResolveError
from macula.wire.codes import ErrorCode
from macula.wire.content import raw_mcid
from macula.wire.identity import ZERO_REALM
from macula.wire.records import RecordType, new_record, record_version
from relay.station.station import Station
from relay.stores.records import StoreLimits
from support.identities import new_identity
from support.meshkit import station_config
from support.rawclient import now_ms
from support.waiting import eventually

pytestmark = pytest.mark.anyio


async def test_record_and_content_stuffing_is_refused_and_honest_clients_served(
    tmp_path: Path,
) -> None:
    limits = StoreLimits(records_per_signer=3, content_bytes_total=64 * 1024)
    config = dataclasses.replace(station_config(tmp_path / "station"), store_limits=limits)
    async with (
        Station(config) as station,
        Node(new_identity(), [station.endpoint]) as mallory,
        Node(new_identity(), [station.endpoint]) as alice,
    ):
        stuffer = DhtClient(mallory, mallory.identity)
        for i in range(3):
            await stuffer.announce_procedure(ZERO_REALM, f"m.n{i}_v1", station.node_id)
        with pytest.raises(MeshError) as caught:
            await stuffer.announce_procedure(ZERO_REALM, "m.n3_v1", station.node_id)
        assert caught.value.code == ErrorCode.UNKNOWN_ERROR
        assert (caught.value.detail or "").startswith("quota_exceeded: ")
        assert await stuffer.procedure_records("m.n3_v1") == []

        # a record from the future is refused with its reason
        created = now_ms() + 3_600_000
        future = new_record(
            mallory.identity,
            RecordType.PROCEDURE_ADVERTISEMENT,
            {
                "procedure_uri": "m.future_v1",
                "advertiser_node": mallory.identity.node_id,
                "serving_station": station.node_id,
            },
            now_ms=created,
            version=record_version(created, os.urandom(10)),
        )
        with pytest.raises(MeshError) as caught:
            await stuffer.put_record(future)
        assert (caught.value.detail or "").startswith("clock_skew: ")

        # content past the station's cap while all of it is fresh: refused, not dropped
        for _ in range(2):
            data = os.urandom(30 * 1024)
            put = {"mcid": raw_mcid(data).to_bytes(), "payload": data}
            assert await mallory.call(ZERO_REALM, "_content.put_block", put) == "ok"
        with pytest.raises(MeshError) as caught:
            data = os.urandom(30 * 1024)
            put = {"mcid": raw_mcid(data).to_bytes(), "payload": data}
            await mallory.call(ZERO_REALM, "_content.put_block", put)
        assert (caught.value.detail or "").startswith("quota_exceeded: ")

        # the honest client's records go in and come back
        honest = DhtClient(alice, alice.identity)
        record = await honest.announce_procedure(ZERO_REALM, "a.echo_v1", station.node_id)
        assert await honest.procedure_records("a.echo_v1") == [record]

        async def endpoint_resolves() -> bool:  # the station's own records are not bounded
            try:
                return (await honest.resolve_station(station.node_id)).port == station.port
            except ResolveError:
                return False  # the refresher has not run yet

        await eventually(endpoint_resolves)
