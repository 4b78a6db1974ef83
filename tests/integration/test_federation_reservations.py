"""Path reservations across linked stations mean what docs/reservations.md says: per station.
A reservation binds the agents that ask the station it was made on; a linked station neither
sees nor enforces it (issue 40)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from macula.node.node import Node
from macula.services.house_client import HouseClient
from macula.wire.identity import Identity
from relay.station.station import Station
from support.identities import new_identity

pytestmark = pytest.mark.anyio

PROJECT = "example.org/team/app"


def house(node: Node, identity: Identity) -> HouseClient:
    return HouseClient(node, node.dht, identity)


async def test_a_reservation_binds_on_its_own_station_only(
    mesh: tuple[Station, Station, Station], tmp_path: Path
) -> None:
    a, b, _ = mesh
    alice, bob, carol = new_identity(), new_identity(), Identity.generate(os.urandom, difficulty=0)
    async with (
        Node(alice, [a.endpoint]) as at_a,
        Node(bob, [b.endpoint]) as bob_at_b,
        Node(carol, [a.endpoint]) as carol_at_a,
    ):
        got = await house(at_a, alice).reserve_paths(PROJECT, ["src/**"], reason="rewrite")
        assert got["granted"] == 1
        # station b knows nothing of it: bob, asking b, sees none and is granted the same paths
        seen = await house(bob_at_b, bob).list_reservations(PROJECT)
        assert seen["reservations"] == []
        assert (await house(bob_at_b, bob).reserve_paths(PROJECT, ["src/x.py"]))["granted"] == 1
        # on station a, where it was made, it binds
        clash = await house(carol_at_a, carol).reserve_paths(PROJECT, ["src/x.py"])
        assert clash["granted"] == 0
        assert clash["conflicts"][0]["holder"] == alice.node_id.hex()
