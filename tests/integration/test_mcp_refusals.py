"""What the station refuses without an answer on the wire is the tool's error, never a success
(issue 22): through the MCP tools, in process, over a real station protecting a realm. A
non-member's mesh_publish, mesh_watch and mesh_serve in the realm answer ``realm_refused`` with
a next_action (the watch at once, the serve leaving nothing served); the same calls in a realm
the station does not protect succeed; a procedure another node serves is ``advertise_taken``."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from macula.keyfile import save_identity
from macula.realm.membership import MembershipStore, memberships_path
from macula.realm.records import check_endorsement
from macula.wire.identity import Identity
from relay.realms.gate import ProtectedRealm
from relay.station.station import Station
from support.agentkit import DOUBLE, build_app, call, refused
from support.identities import new_identity
from support.meshkit import station_config
from support.rawclient import now_ms
from support.realmkit import PRIVATE, REALM_NAME, endorse
from support.waiting import eventually
from tools.groups import presence, pubsub, rings, rooms, rpc

pytestmark = pytest.mark.anyio

AUTHORITY = Identity.generate(os.urandom)
UNPROTECTED = "cd" * 32
TOPIC = "org.example.private.news"
PROCEDURE = "org.example.private_double"
BOUND_S = 20.0  # far below a refused watch's own duration: it must return at once


@pytest.fixture
async def protected(tmp_path: Path) -> AsyncIterator[Station]:
    config = station_config(tmp_path / "station")
    config.realms = [ProtectedRealm(REALM_NAME, PRIVATE, AUTHORITY.node_id)]
    async with Station(config) as running:
        yield running


@contextlib.asynccontextmanager
async def agent(station: Station, home: Path) -> AsyncIterator[Client]:
    """An MCP server with the pub/sub, RPC and agent groups, its own identity and home."""
    env = {
        "MACULA_HOME": str(home),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_IDENTITY": str(home / "id.key"),
        "MACULA_MCP_CONTACT_POLICY": "open",
    }
    app, _ = build_app(env, groups=(pubsub, presence, rooms, rings, rpc))
    async with Client(app) as client:
        yield client


def is_realm_refusal(error: dict[str, object]) -> bool:
    action = str(error["next_action"])
    return error["code"] == "realm_refused" and "mesh_join_realm" in action


async def test_a_non_members_publish_watch_and_serve_in_a_protected_realm_are_refused(
    protected: Station, tmp_path: Path
) -> None:
    async with agent(protected, tmp_path / "eve") as eve:
        fact = {"topic": TOPIC, "fact": {"n": 1}}
        published = await refused(eve, "mesh_publish", fact | {"realm": REALM_NAME})
        assert is_realm_refusal(published), published
        assert PRIVATE.hex() in published["detail"]

        watch = {"topic": TOPIC, "realm": PRIVATE.hex(), "duration_seconds": 3600, "count": 1}
        watched = await asyncio.wait_for(refused(eve, "mesh_watch", watch), BOUND_S)
        assert is_realm_refusal(watched), watched

        serve = {"name": PROCEDURE, "exec": DOUBLE, "realm": REALM_NAME, "announce": 0}
        served = await refused(eve, "mesh_serve", serve)
        assert is_realm_refusal(served), served
        gone = await refused(eve, "mesh_unserve", {"name": PROCEDURE})
        assert "not served here" in gone["detail"] and "served: nothing" in gone["detail"]
        refusals = protected.core.stats["realm_refused"]
        assert refusals >= 3  # publish, serve, and the watch's SUBSCRIBE (told twice)

        # a realm this station does not protect: the same calls succeed, with the hint
        elsewhere = await call(eve, "mesh_publish", fact | {"realm": UNPROTECTED})
        assert (elsewhere["published"], elsewhere["realm_member"]) == (1, 0)
        assert "mesh_join_realm" in elsewhere["realm_hint"]
        quiet = watch | {"realm": UNPROTECTED, "duration_seconds": 0.2}
        heard = await call(eve, "mesh_watch", quiet)
        assert (heard["timed_out"], heard["events"], heard["realm_member"]) == (1, [], 0)
        serving = await call(eve, "mesh_serve", serve | {"realm": UNPROTECTED})
        assert (serving["serving"], serving["realm_member"]) == (1, 0)
        assert protected.core.stats["realm_refused"] == refusals


async def test_a_members_publish_watch_and_serve_in_the_protected_realm_succeed(
    protected: Station, tmp_path: Path
) -> None:
    home = tmp_path / "ada"
    identity = new_identity()
    save_identity(home / "id.key", identity)
    record = endorse(AUTHORITY, identity.node_id)
    endorsement = check_endorsement(
        record,
        realm=PRIVATE,
        authority=AUTHORITY.node_id,
        member=identity.node_id,
        now_ms=now_ms(),
    )
    MembershipStore(memberships_path(home, identity.node_id), identity).put(endorsement, now_ms())
    async with agent(protected, home) as ada:
        watch = {"topic": TOPIC, "realm": REALM_NAME, "duration_seconds": 20, "count": 1}
        watching = asyncio.create_task(call(ada, "mesh_watch", watch))

        async def heard() -> dict[str, Any] | None:  # publish until the watch (ours) hears one
            published = await call(
                ada, "mesh_publish", {"topic": TOPIC, "fact": {"n": 2}, "realm": REALM_NAME}
            )
            assert (published["published"], published["realm_member"]) == (1, 1)
            assert "realm_hint" not in published
            await asyncio.wait({watching}, timeout=0.2)
            return watching.result() if watching.done() else None

        got = await eventually(heard)
        assert [e["payload"] for e in got["events"]] == [{"n": 2}] and got["realm_member"] == 1
        serve = {"name": PROCEDURE, "exec": DOUBLE, "realm": REALM_NAME, "announce": 0}
        served = await call(ada, "mesh_serve", serve)
        assert (served["serving"], served["realm_member"]) == (1, 1)
        assert protected.core.stats["realm_refused"] == 0


async def test_a_procedure_another_node_serves_is_refused_as_taken(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent(station, tmp_path / "ada") as ada,
        agent(station, tmp_path / "bob") as bob,
    ):
        serve = {"name": "org.example.double", "exec": DOUBLE, "announce": 0}
        first = await call(ada, "mesh_serve", serve)
        assert first["serving"] == 1 and "realm_member" not in first
        taken = await refused(bob, "mesh_serve", serve)
        assert taken["code"] == "advertise_taken", taken
        assert "choose another name" in taken["next_action"]
        unserve = await refused(bob, "mesh_unserve", {"name": serve["name"]})
        assert "served: nothing" in unserve["detail"]
        reached = await reaches(bob, serve["name"])  # ada still serves it
        assert reached["result"]["doubled"] == 42


async def reaches(client: Client, procedure: str) -> dict[str, Any]:
    """``mesh_call`` of ``procedure`` once the station knows who serves it (§6.1: no ack)."""

    async def attempt() -> dict[str, Any] | None:
        result = await client.call_tool("mesh_call", {"procedure": procedure, "args": {"n": 21}})
        data = result.structured_content or {}
        if result.is_error and data.get("code") == "unknown_next_peer":
            return None
        assert not result.is_error, data
        return data

    found: dict[str, Any] = await eventually(attempt)
    return found
