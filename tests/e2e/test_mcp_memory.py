"""Shared memory through macula-mcp over stdio: remember this repository's own docs with
progress, recall from another agent, list stations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from relay.house.services import HouseConfig
from relay.station.station import Station, StationConfig
from support.paths import REPO
from tools.launch import server_command

pytestmark = pytest.mark.anyio


def params(home: Path, station: Station) -> StdioServerParameters:
    env = dict(
        os.environ,
        MACULA_HOME=str(home),
        MACULA_MESH_STATIONS=station.endpoint,
        MACULA_MCP_IDENTITY=str(home / "id.key"),
    )
    command = server_command()
    return StdioServerParameters(command=command[0], args=command[1:], env=env)


async def test_remember_directory_then_recall_from_another_agent(tmp_path: Path) -> None:
    config = StationConfig(
        data_dir=tmp_path / "station", port=0, house=HouseConfig(city="Ghent", country="BE")
    )
    async with Station(config) as station:
        progress: list[tuple[float, float | None]] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.append((done, total))

        async with Client(params(tmp_path / "ada", station)) as ada:
            result = await ada.call_tool(
                "mesh_remember_directory",
                {
                    "directory": str(REPO),
                    "exclude_dirs": [".git", ".venv", "tests", "node_modules"],
                },
                progress_callback=on_progress,
            )
            assert not result.is_error, result.structured_content
            report = result.structured_content or {}
            assert report["ingested_count"] >= 1 and report["total_chunks"] >= 1
            assert progress and progress[-1][0] == progress[-1][1]  # progress reached the end
            bad = await ada.call_tool(
                "mesh_remember_directory", {"directory": str(tmp_path / "nope")}
            )
            assert bad.is_error
        async with Client(params(tmp_path / "bob", station)) as bob:
            recalled = await bob.call_tool(
                "mesh_recall", {"query_text": "quickstart macula demo", "top_k": 5}
            )
            hits = (recalled.structured_content or {})["hits"]
            assert hits and all(h["content_verified"] == 1 for h in hits)
            assert any(h["document_id"] == "README.md" for h in hits)
            assert (await bob.call_tool("mesh_recall", {"query_text": "x", "top_k": 500})).is_error
            stations = await bob.call_tool("mesh_list_stations", {"country": "BE"})
            assert (stations.structured_content or {})["count"] == 1
            assert (await bob.call_tool("mesh_list_stations", {"near": {"lat": 1.0}})).is_error
            remembered = await bob.call_tool(
                "mesh_remember", {"content": "Ghent has a station now.", "topics": ["ops"]}
            )
            assert not remembered.is_error
            assert (await bob.call_tool("mesh_remember", {"content": "   "})).is_error
