"""A protected realm across linked stations (issues 13, 26): its events cross a link only to a
station the realm's authority endorsed for it (a station endorsement presented in its
CONNECT/HELLO; what it says it protects grants nothing). Station B (dials A) protects the
realm and is endorsed, station C (dials A) does not and is not: a member on B gets what a
member on A publishes and the other way round; C's SUBSCRIBE in the realm is refused by A,
and nothing of the realm reaches C's client."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from macula.keyfile import load_or_create_identity
from macula.wire.identity import Identity
from relay.federation.links import LinkTarget
from relay.realms.gate import ProtectedRealm
from relay.station.station import Station, StationConfig
from support.meshkit import linked, station_config, target
from support.rawclient import now_ms, raw_client
from support.realmkit import PRIVATE, REALM_NAME, endorse, is_event, present, publish, subscribe
from support.waiting import eventually

pytestmark = pytest.mark.anyio

AUTHORITY = Identity.generate(os.urandom)
NEWS = "linked.news"


def make(tmp: Path, peers: list[LinkTarget], *, protects: bool) -> StationConfig:
    config = dataclasses.replace(
        station_config(tmp),
        peers=peers,
        link_backoff_s=0.05,
        link_backoff_max_s=0.2,
        link_timeout_s=2.0,
    )
    if protects:
        config.realms = [ProtectedRealm(REALM_NAME, PRIVATE, AUTHORITY.node_id)]
        node_id = load_or_create_identity(tmp / "station.key").node_id
        config.station_endorsements = [endorse(AUTHORITY, node_id, role="station")]
    return config


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[Station, Station, Station]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(Station(make(tmp_path / "a", [], protects=True)))
        b = await stack.enter_async_context(
            Station(make(tmp_path / "b", [target(a)], protects=True))
        )
        c = await stack.enter_async_context(
            Station(make(tmp_path / "c", [target(a)], protects=False))
        )
        await eventually(lambda: len(linked(a)) == 2, message="links not up")
        yield a, b, c


def holds(station: Station, holder: Station) -> bool:
    return holder.node_id in station.core.subscriptions.subscribers((PRIVATE, NEWS.encode()))


async def test_protected_events_cross_only_to_stations_protecting_the_realm(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    async with (
        raw_client(a) as on_a,
        raw_client(b) as on_b,
        raw_client(c) as on_c,
    ):
        for member in (on_a, on_b):
            answer = await present(member, endorse(AUTHORITY, member.node_id))
            assert len(answer["accepted"]) == 1
        # C protects nothing: its client subscribes freely there, and C asks A for the topic
        for client in (on_a, on_b, on_c):
            subscribe(client, NEWS)
            await client.flush()
        await eventually(lambda: holds(a, b), message="B's interest did not reach A")
        await eventually(lambda: a.core.stats["realm_refused"] >= 1, message="C not refused")
        assert not holds(a, c)
        publish(on_a, NEWS, 1, "from a", e2e=True)
        await on_b.expect(is_event(NEWS, "from a"))
        publish(on_b, NEWS, 1, "from b", e2e=True)
        await on_a.expect(is_event(NEWS, "from b"))
        await on_c.quiet(is_event(NEWS))
        assert c.core.stats["relayed_events_received"] == 0
        # each station knows which links may carry the realm: the endorsed ones
        b_conn = a.core.node_conn[b.node_id]
        c_conn = a.core.node_conn[c.node_id]
        assert a.core.realms.endorsed_realms(b_conn, now_ms()) == {PRIVATE}
        assert a.core.realms.endorsed_realms(c_conn, now_ms()) == frozenset()
        a_conn = b.core.node_conn[a.node_id]
        assert b.core.realms.endorsed_realms(a_conn, now_ms()) == {PRIVATE}
