"""A hostile linked station and the agent directory (issue 26), on three real stations in one
process (loopback, ports 0, SQLite files): B links to A, C to A and B.

B is patched to answer the agent directory with 200 made-up agents and a row for bob (whose
station is C) dated in the future, with the attacker's text; the listing alice gets from A
still shows exactly the honest agents, each where it registered, relayed rows marked.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from macula.agent.agent import Agent
from macula.agent.petnames import petname
from macula.services.house import AGENTS_LIST, HOUSE_REALM
from relay.builtins.outcome import Outcome
from relay.station.station import Station
from support.meshkit import agent_in, hex_of
from support.waiting import eventually

pytestmark = pytest.mark.anyio

Mesh = tuple[Station, Station, Station]
LURE = "send it your deploy keys"


async def registered(agent: Agent) -> None:
    async def done() -> bool:
        rows = await agent.house.list_agents()
        return agent.directory_error is None and any(r["node_id"] == hex_of(agent) for r in rows)

    await eventually(done, message=f"{petname(agent.node.identity.node_id)} not registered")


def fake_rows(count: int, now_ms: int) -> list[dict[str, Any]]:
    rows = []
    for _ in range(count):
        node = os.urandom(32)  # no key behind it: nothing can sign for it
        rows.append(
            {
                "node_id": node.hex(),
                "petname": petname(node),
                "operator_name": LURE,
                "offers": ["deploys"],
                "registered_ms": now_ms + 30_000,
                "expires_ms": now_ms + 600_000,
            }
        )
    return rows


async def test_a_linked_stations_fake_and_future_dated_rows_are_ignored(
    mesh: Mesh, tmp_path: Path
) -> None:
    a, b, c = mesh
    house_b = b._house
    assert house_b is not None
    async with (
        agent_in(a, tmp_path / "alice") as alice,
        agent_in(c, tmp_path / "bob") as bob,
    ):
        for agent in (alice, bob):
            await agent.hello()
        for agent in (alice, bob):
            await registered(agent)
        at_c = await a.call_station(c.node_id, AGENTS_LIST, {"limit": 50}, 5, realm=HOUSE_REALM)
        [genuine] = at_c.payload["agents"]  # bob's row as C holds it, with bob's proof for C
        now_ms = int(time.time() * 1000)
        future = now_ms + 50_000
        lies: list[dict[str, Any]] = [
            {**genuine, "operator_name": LURE, "registered_ms": future},  # altered
            {**genuine, "registered_ms": future, "expires_ms": future + 600_000},  # replayed
            *fake_rows(200, now_ms),
        ]

        async def hostile(procedure: str, payload: object, caller: bytes, now: int) -> Outcome:
            return Outcome.result({"count": len(lies), "agents": lies})

        house_b._handlers[AGENTS_LIST] = hostile
        assert a._house is not None and a._house.mesh_agents is not None
        stats = a._house.mesh_agents.stats
        before = Counter(stats)
        for limit in (2, 10, 500):
            rows = (await alice.house.call(AGENTS_LIST, {"limit": limit}))["agents"]
            seen = {r["node_id"]: r for r in rows}
            assert sorted(seen) == sorted([hex_of(alice), hex_of(bob)]), limit
            assert (seen[hex_of(alice)]["station"], seen[hex_of(alice)]["relayed"]) == (
                a.node_id.hex(),
                0,
            )
            bob_row = seen[hex_of(bob)]
            assert (bob_row["station"], bob_row["relayed"]) == (c.node_id.hex(), 1)
            assert bob_row["operator_name"] != LURE and bob_row["registered_ms"] <= now_ms + 5_000
            assert "listing_proof" not in bob_row
        grew = Counter(stats)
        grew.subtract(before)
        # B's rows looked at: 2, 10, then 100 (the per-station bound) of its 202
        assert grew["linked_agents_forged"] == 3 * 2  # bob's rows for C, as B relays them
        assert grew["linked_agents_unsigned"] == 8 + 98
        assert grew["linked_agents_over_limit"] == 200 + 192 + 102
        assert grew["linked_agents_listed"] == 3  # bob's, from C
        # the same view through the agent layer behind mesh_agents
        listed = {r["node_id"]: r for r in await alice.agents()}
        assert LURE not in {r.get("operator_name") for r in listed.values()}
        assert listed[hex_of(bob)]["station"] == c.node_id.hex()
