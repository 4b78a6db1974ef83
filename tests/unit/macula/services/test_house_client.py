"""``HouseClient`` without a station: realms resolved against the connected station's key,
forgotten when the node reconnects to another station."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, cast

from macula.services.dht import DhtClient
from macula.services.house import MEMORY_ADD
from macula.services.house_client import HouseClient
from macula.wire.identity import Identity
from support.running import run

STATION_A, STATION_B = b"\xaa" * 32, b"\xbb" * 32
REALM_A, REALM_B = b"\x01" * 32, b"\x02" * 32


@dataclass
class Link:
    station_key: bytes


@dataclass
class FakeNode:
    """Connected to ``station``; records which realm each call went to."""

    station: bytes = STATION_A
    calls: list[bytes] = field(default_factory=list)

    async def session(self, timeout: float | None = None) -> Link:
        return Link(self.station)

    async def call(
        self, realm: bytes, procedure: str, payload: Any = None, *, timeout: float = 10.0
    ) -> Any:
        self.calls.append(realm)
        return {"chunks": 1}


@dataclass
class FakeDht:
    """Each station's own record names a different realm."""

    asked: list[bytes | None] = field(default_factory=list)

    async def resolve_realm(self, procedure: str, *, station: bytes | None = None) -> bytes:
        self.asked.append(station)
        return {STATION_A: REALM_A, STATION_B: REALM_B}[cast(bytes, station)]


def test_the_realm_is_resolved_against_the_station_and_forgotten_on_a_new_one() -> None:
    node, dht = FakeNode(), FakeDht()
    house = HouseClient(node, cast(DhtClient, dht), Identity.generate(os.urandom))

    async def scenario() -> None:
        assert (await house.remember("one"))["realm"] == REALM_A.hex()
        assert (await house.remember("two"))["realm"] == REALM_A.hex()
        assert dht.asked == [STATION_A]  # cached while on the same station
        node.station = STATION_B  # reconnected elsewhere
        assert (await house.remember("three"))["realm"] == REALM_B.hex()
        assert dht.asked == [STATION_A, STATION_B]
        assert node.calls == [REALM_A, REALM_A, REALM_B]
        assert await house.realm_of(MEMORY_ADD) == REALM_B

    run(scenario())
