"""mesh_remember_directory against a hostile tree, through macula-mcp over stdio (issue 26):
nothing outside the named tree, no FIFO, device or secret-looking file reaches the station's
shared memory, the server never blocks, and the result says what was skipped and why."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from relay.station.station import Station
from support.mcpkit import Tools, server_env, server_params

pytestmark = pytest.mark.anyio


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("The lighthouse keeper logs every ship passing Ghent.\n")
    (root / "docs" / "guide.md").write_text("The guide explains the harbour tides at length.\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.md").write_text("CANARYSECRET lives outside the tree and stays there.\n")
    (root / "leak.md").symlink_to(outside / "canary.md")
    (root / "docs" / "away").symlink_to(outside)
    (root / "passwd.txt").symlink_to("/etc/passwd")
    (root / "zero.md").symlink_to("/dev/zero")
    (root / ".env.md").write_text("CANARYSECRET=in a dotenv file\n")
    (root / "id_rsa.txt").write_text("CANARYSECRET private key\n")
    (root / ".ssh").mkdir()
    (root / ".ssh" / "config.md").write_text("CANARYSECRET ssh notes\n")
    return root


@contextlib.contextmanager
def fifo_in(root: Path) -> Iterator[Path]:
    """A FIFO named like a document; whatever happens, a reader blocked on it is released."""
    pipe = root / "pipe.md"
    os.mkfifo(pipe)
    try:
        yield pipe
    finally:
        with contextlib.suppress(OSError):  # ENXIO: nobody reads it, nothing to release
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))


async def test_a_hostile_tree_leaks_nothing_and_says_what_it_skipped(
    tmp_path: Path, station: Station, tree: Path
) -> None:
    with fifo_in(tree):
        params = server_params(server_env(tmp_path / "ada", station.endpoint))
        async with Client(params) as client:
            tools = Tools(client)
            with anyio.fail_after(30):  # the FIFO must not block the server
                report = await tools.good("mesh_remember_directory", directory=str(tree))
            assert report["ingested_count"] == 2, report
            by_reason = report["skipped_by_reason"]
            assert by_reason["symbolic_link"] == 4, report
            assert by_reason["not_a_regular_file"] == 1, report
            assert by_reason["secret_looking_name"] == 2, report
            assert by_reason["secret_looking_folder"] == 1, report
            assert "leak.md" in report["skipped_sample"]["symbolic_link"]
            assert report["stopped_early"] is None
            # the server still answers, and shared memory holds no canary
            recalled = await tools.good("mesh_recall", query_text="CANARYSECRET", top_k=10)
            assert all("CANARYSECRET" not in hit["text"] for hit in recalled["hits"]), recalled
            kept = await tools.good("mesh_recall", query_text="lighthouse keeper", top_k=5)
            assert any(hit["document_id"] == "README.md" for hit in kept["hits"])


async def test_roots_a_model_could_be_tricked_into_are_refused_structured(
    tmp_path: Path, station: Station, tree: Path
) -> None:
    params = server_params(server_env(tmp_path / "ada", station.endpoint))
    async with Client(params) as client:
        tools = Tools(client)
        for directory, says in (
            ("~root", "'~' is not expanded"),
            ("~", "'~' is not expanded"),
            (f"{tree}/docs/../..", "'..' is refused"),
            ("/dev/zero", "not a directory"),
            ("/dev", "pseudo-filesystem"),
            ("/proc/self", "pseudo-filesystem"),
            ("/" + "x" * 5000, "at most 4096 characters"),  # its listed maxLength (PATH_MAX)
            (f"{tree}/" + "y" * 300, "name too long"),
        ):
            error = await tools.bad("mesh_remember_directory", directory=directory)
            assert error["code"] == "invalid_argument", error
            assert says in error["detail"].lower(), (directory, error)
        assert (await tools.good("mesh_list_stations"))["count"] >= 1  # still serving
