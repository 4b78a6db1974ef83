"""Path reservations between two agents of two homes (two MACULA_HOMEs, two identities), each
an in-process MCP server, through a real station subprocess: a conflict that names the holder,
renewal, expiry, release, a listing page, and a station restart that keeps them (issue 40)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from macula.agent.petnames import petname
from support.identities import agent_home
from support.processkit import StationProcess
from support.waiting import eventually
from tools.server.server import build_server

pytestmark = pytest.mark.anyio

PROJECT = "git@github.com:Org/Shared.git"  # normalised to github.com/Org/Shared
RESTART_S = 30.0


async def call(client: Client, tool: str, args: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    result = await client.call_tool(tool, {"project": PROJECT} | args)
    return int(bool(result.is_error)), dict(result.structured_content or {})


async def test_two_agents_reserve_conflict_renew_expire_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    station = StationProcess(tmp_path / "station")
    endpoint = await station.start()
    try:
        env_a, alice = agent_home(tmp_path, "alice", endpoint)
        env_b, _ = agent_home(tmp_path, "bob", endpoint)
        async with Client(build_server(env_a)) as a, Client(build_server(env_b)) as b:
            error, got = await call(
                a, "mesh_reserve_paths", {"paths": ["src/auth/**"], "reason": "auth rewrite"}
            )
            assert not error, got
            assert got["project"] == "github.com/Org/Shared" and got["granted"] == 1
            error, clash = await call(b, "mesh_reserve_paths", {"paths": ["src/auth/login.py"]})
            assert error and clash["code"] == "reservation_conflict"
            assert petname(alice) in clash["detail"] and "auth rewrite" in clash["detail"]
            [held] = clash["conflicts"]
            assert held["holder"] == alice.hex() and held["holder_name"] == "alice"
            assert held["path"] == "src/auth/**" and held["exclusive"] == 1
            assert clash["retryable"] == 1 and clash["next_action"]
            # elsewhere and shared: granted
            error, got = await call(b, "mesh_reserve_paths", {"paths": ["docs/"], "exclusive": 0})
            assert not error, got
            # renewal: the same paths again move the expiry
            error, first = await call(a, "mesh_reserve_paths", {"paths": ["src/auth/**"]})
            error, renewed = await call(
                a, "mesh_reserve_paths", {"paths": ["src/auth/**"], "ttl_seconds": 7200}
            )
            assert not error and renewed["expires_at"] > first["expires_at"]
            # a station restart keeps them (SQLite on the station's disk)
            await station.kill()
            await station.start()
            listed = await eventually(
                lambda: listing(b, "src/auth/login.py"), RESTART_S, interval=0.2
            )
            assert [r["holder"] for r in listed["reservations"]] == [alice.hex()]
            assert listed["remaining"] == 0 and listed["next_page"] is None
            # release: then bob's reservation passes
            error, done = await call(a, "mesh_release_paths", {})
            assert not error and done["released"] == 1
            error, got = await call(b, "mesh_reserve_paths", {"paths": ["src/auth/login.py"]})
            assert not error, got
            # expiry: a short reservation lapses by itself
            error, got = await call(a, "mesh_reserve_paths", {"paths": ["lib/"], "ttl_seconds": 1})
            assert not error, got
            await eventually(lambda: granted(b, ["lib/x.py"]), 10.0, interval=0.2)
    finally:
        await station.kill()


async def listing(client: Client, touching: str) -> dict[str, Any] | None:
    result = await client.call_tool("mesh_reservations", {"project": PROJECT, "touching": touching})
    got = dict(result.structured_content or {})
    return None if result.is_error or not got.get("reservations") else got


async def granted(client: Client, paths: list[str]) -> int:
    error, _ = await call(client, "mesh_reserve_paths", {"paths": paths})
    return int(not error)


async def test_listing_pages_and_hostile_arguments(tmp_path: Path) -> None:
    station = StationProcess(tmp_path / "station")
    endpoint = await station.start()
    try:
        env_a, _ = agent_home(tmp_path, "alice", endpoint)
        async with Client(build_server(env_a)) as a:
            paths = [f"f{i}.py" for i in range(30)]
            error, got = await call(a, "mesh_reserve_paths", {"paths": paths})
            assert not error, got
            seen: list[str] = []
            args: dict[str, Any] = {}
            for _ in range(5):
                error, page = await call(a, "mesh_reservations", args)
                assert not error, page
                seen += [r["path"] for r in page["reservations"]]
                if page["next_page"] is None:
                    break
                args = page["next_page"]["arguments"]
            assert sorted(seen) == sorted(paths)
            for bad in (["../etc/passwd"], ["/etc/passwd"], ["a/[x]"], ["*/*/*/*/*/*/*/*/*"]):
                error, got = await call(a, "mesh_reserve_paths", {"paths": bad})
                assert error and got["code"] == "invalid_argument", got
            error, got = await call(a, "mesh_reservations", {"cursor": "nonsense"})
            assert error and got["code"] == "invalid_argument"
    finally:
        await station.kill()
