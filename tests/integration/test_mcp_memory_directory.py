"""mesh_remember_directory walks its tree in a worker thread: while a large tree is read the
server goes on answering other calls (issue 26: a walk of / held the event loop for 22.9 s)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

import tools.groups.memory
import tools.server.server
from macula.keyfile import save_identity
from relay.station.station import Station
from support.identities import new_identity
from tools.groups import directory_reader, memory

pytestmark = pytest.mark.anyio


async def test_other_calls_are_answered_while_a_large_tree_is_read(
    station: Station, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "tree"
    for i in range(40):
        (tree / f"d{i}").mkdir(parents=True)
        for j in range(25):
            (tree / f"d{i}" / f"skip{j}.bin").write_bytes(b"x")
    (tree / "d39" / "notes.md").write_text("Lighthouse tides of the northern harbour.\n")
    walking, release = threading.Event(), threading.Event()
    real = directory_reader.read_directory

    def gated(*args: Any, **kwargs: Any) -> directory_reader.DirectoryRead:
        walking.set()  # the walk has started: hold it until the test saw another answer
        assert release.wait(20), "the other call was never answered"
        return real(*args, **kwargs)

    monkeypatch.setattr(tools.groups.memory, "read_directory", gated)
    monkeypatch.setattr(tools.server.server, "GROUPS", (memory,))
    save_identity(tmp_path / "id.key", new_identity())
    env = {
        "MACULA_HOME": str(tmp_path),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_IDENTITY": str(tmp_path / "id.key"),
    }
    reports: list[dict[str, Any]] = []
    async with Client(tools.server.server.build_server(env)) as client:

        async def remember() -> None:
            result = await client.call_tool("mesh_remember_directory", {"directory": str(tree)})
            assert not result.is_error, result.structured_content
            reports.append(result.structured_content or {})

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(remember)
                await anyio.to_thread.run_sync(walking.wait, 20)
                assert walking.is_set()
                stations = await client.call_tool("mesh_list_stations", {})
                assert not stations.is_error, stations.structured_content
                release.set()
    assert reports[0]["ingested_count"] == 1
    assert reports[0]["skipped_by_reason"] == {"other_extension": 1000}
