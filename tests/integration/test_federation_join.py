"""A station joining through one ``--peer`` meshes at once (issue 37): three real Stations in
one process (loopback, ports 0), discovery left at its 30 s interval so only the link's own
station list (``_mesh.stations``, relay.federation.mesh_roster) can form the mesh in time.

B and C name only A. C learns B from A's answer to its introduction; B learns C from A passing
C's own record on. Each waits a few seconds at most: far under the discovery interval, so the
old code (which waited for the next discovery round) fails them. And a linked station that
sends a bogus, oversized or unsigned list is ignored and counted; the station keeps serving.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from macula.clock import now_ms
from macula.errors import MeshError
from macula.node.node import Node
from macula.wire.codes import ErrorCode
from macula.wire.identity import Identity
from macula.wire.records import RecordType, new_record, record_version
from relay.federation.links import LinkTarget
from relay.federation.mesh_roster import MAX_MESH_RECORDS, MESH_PROCEDURE, mesh_payload
from relay.station.station import Station, StationConfig
from support.identities import new_identity
from support.meshkit import REALM, linked, station_config, target
from support.waiting import eventually

pytestmark = pytest.mark.anyio

JOIN_DEADLINE_S = 5.0  # well under the 30 s discovery interval


def join_config(data_dir: Path, peers: list[LinkTarget]) -> StationConfig:
    return dataclasses.replace(
        station_config(data_dir),
        peers=peers,
        discover_interval_s=30.0,
        link_backoff_s=0.05,
        link_backoff_max_s=0.2,
        link_timeout_s=2.0,
    )


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[Station, Station, Station]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(Station(join_config(tmp_path / "a", [])))
        b = await stack.enter_async_context(Station(join_config(tmp_path / "b", [target(a)])))
        await eventually(lambda: linked(b) == {a.node_id}, timeout=JOIN_DEADLINE_S)
        c = await stack.enter_async_context(Station(join_config(tmp_path / "c", [target(a)])))
        await eventually(
            lambda: linked(b) == {a.node_id, c.node_id} and linked(c) == {a.node_id, b.node_id},
            timeout=JOIN_DEADLINE_S,
            message="B and C did not link from what A told them",
        )
        yield a, b, c


def endpoint_record(identity: Identity, port: int, **changes: Any) -> dict[str, Any]:
    now = now_ms()
    payload = {"quic_port": port, "host_advertised": [b"127.0.0.1"], "alpn": "macula"}
    record = new_record(
        identity,
        RecordType.STATION_ENDPOINT,
        {**payload, **changes.pop("payload", {})},
        now_ms=changes.pop("now", now),
        version=record_version(now, os.urandom(10)),
        ttl_ms=changes.pop("ttl_ms", 60_000),
    )
    return record.to_wire()


async def test_c_and_b_link_from_what_a_tells_them_long_before_discovery(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    assert {t.node_id for t in c.config.peers} == {a.node_id}
    assert a.links is not None and a.links.attempts == 0  # A dialled nobody: it was told
    roster_a = a._links.roster
    assert roster_a.stats["mesh_passed_on"] >= 1  # C's record, on to B
    assert {b.node_id, c.node_id} <= set(roster_a._own)  # each introduced itself to A
    dialled = b._links.roster.stats["mesh_stations_dialled"]
    dialled += c._links.roster.stats["mesh_stations_dialled"]
    assert dialled >= 1
    refused = [k for k, v in roster_a.stats.items() if v and ("refused" in k or "bad" in k)]
    assert refused == []


async def test_a_subscriber_on_b_hears_c_and_b_calls_a_procedure_on_c(
    mesh: tuple[Station, Station, Station],
) -> None:
    _, b, c = mesh
    async with (
        Node(new_identity(), [b.endpoint]) as at_b,
        Node(new_identity(), [c.endpoint]) as at_c,
    ):
        watch = await at_b.subscribe(REALM, "joined")
        await at_c.advertise(REALM, "org.example.join_echo_v1", lambda call: call.payload)
        await at_b.flush()
        await at_c.flush()

        async def heard() -> bool:
            await at_c.publish(REALM, "joined", "hello")
            try:
                return (await watch.next(0.2)).payload == "hello"
            except TimeoutError:
                return False

        assert await eventually(heard, timeout=JOIN_DEADLINE_S)

        async def answered() -> bool:
            try:
                return await at_b.call(REALM, "org.example.join_echo_v1", 7, timeout=1) == 7
            except MeshError:
                return False

        assert await eventually(answered, timeout=JOIN_DEADLINE_S)


async def test_bogus_station_lists_are_ignored_and_counted(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    roster = a._links.roster
    stranger, other = new_identity(), new_identity()
    valid = endpoint_record(stranger, 1)
    forged = dict(endpoint_record(stranger, 2))
    forged["s"] = bytes(64)  # signed by nobody
    signed_by_other = endpoint_record(other, 3)
    signed_by_other["k"] = stranger.node_id  # another key's signature over a stranger's record
    bogus: list[tuple[Any, str]] = [
        ("not a map", "mesh_bad_list"),
        ({"records": "nope"}, "mesh_bad_list"),
        ({"records": [valid] * (MAX_MESH_RECORDS + 1)}, "mesh_list_too_long"),
        ({"records": [{"t": 18}]}, "mesh_bad_record"),
        ({"records": [forged]}, "mesh_refused_bad_signature"),
        ({"records": [signed_by_other]}, "mesh_refused_bad_signature"),
        (
            {"records": [endpoint_record(stranger, 4, now=now_ms() - 120_000)]},
            "mesh_refused_expired",
        ),
        ({"records": [endpoint_record(stranger, 0)]}, "mesh_bad_endpoint"),
    ]
    for payload, counter in bogus:
        before = roster.stats[counter]
        reply = await b.call_station(a.node_id, MESH_PROCEDURE, payload, 2.0)
        assert reply.ok, (payload, reply)
        assert reply.payload == mesh_payload([], more=0)
        assert roster.stats[counter] == before + 1, (counter, dict(roster.stats))
        assert a.core.refusals[counter] >= 1  # counted on the link as a refused frame is
    assert a.links is not None and a.links.attempts == 0  # nothing bogus was dialled
    # A still serves: a client on C still reaches a client on A
    async with (
        Node(new_identity(), [a.endpoint]) as at_a,
        Node(new_identity(), [c.endpoint]) as at_c,
    ):
        await at_a.advertise(REALM, "org.example.join_ok_v1", lambda call: "ok")
        await at_a.flush()

        async def answered() -> bool:
            try:
                return await at_c.call(REALM, "org.example.join_ok_v1", None, timeout=1) == "ok"
            except MeshError:
                return False

        assert await eventually(answered, timeout=JOIN_DEADLINE_S)


async def test_a_client_cannot_call_the_station_list(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, _, _ = mesh
    async with Node(new_identity(), [a.endpoint]) as client:
        with pytest.raises(MeshError) as caught:
            await client.call(bytes(32), MESH_PROCEDURE, mesh_payload([], more=1), timeout=2)
        assert caught.value.code == ErrorCode.UNKNOWN_NEXT_PEER
