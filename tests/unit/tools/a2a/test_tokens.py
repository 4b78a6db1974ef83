"""A2A client tokens: shown once, kept as a hash in 0600 files, one agent each, revoked at once;
a damaged or loosened record grants nothing."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from macula.errors import ConfigError
from tools.a2a import tokens


def test_a_token_is_shown_once_and_kept_only_as_its_hash(tmp_path: Path) -> None:
    client, token = tokens.create(tmp_path, "crew", "alice", 1_000)
    assert token.startswith("a2a_") and len(token) == 47
    folder = tmp_path / "a2a" / "clients"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert token.encode() not in path.read_bytes()
    record = json.loads((folder / "crew.json").read_text())
    assert record["token_sha256"] == tokens.token_digest(token)
    assert tokens.identify(tmp_path, token) == client
    assert client.agent == "alice" and len(client.node_id) == 64
    assert tokens.clients(tmp_path) == [client]


def test_wrong_revoked_or_damaged_tokens_identify_nobody(tmp_path: Path) -> None:
    _, token = tokens.create(tmp_path, "crew", "alice", 1)
    _, other = tokens.create(tmp_path, "ops", "bob", 2)
    for presented in (None, "", "a2a_" + "A" * 43, token + "x", token.upper(), "Bearer " + token):
        assert tokens.identify(tmp_path, presented) is None, presented
    assert tokens.revoke(tmp_path, "crew") and not tokens.revoke(tmp_path, "crew")
    assert tokens.identify(tmp_path, token) is None
    record = tmp_path / "a2a" / "clients" / "ops.json"
    record.chmod(0o644)  # loosened: grants nothing
    assert tokens.identify(tmp_path, other) is None
    record.chmod(0o600)
    assert tokens.identify(tmp_path, other) is not None
    record.write_text("{not json")
    assert tokens.identify(tmp_path, other) is None and tokens.clients(tmp_path) == []


def test_names_are_checked_and_a_client_is_made_once(tmp_path: Path) -> None:
    for bad in ("../x", "a b", "", "x" * 65):
        with pytest.raises(ConfigError):
            tokens.create(tmp_path, bad, "alice", 1)
        with pytest.raises(ConfigError):
            tokens.create(tmp_path, "ok", bad, 1)
    tokens.create(tmp_path, "crew", "alice", 1)
    with pytest.raises(ConfigError, match="revoke it first"):
        tokens.create(tmp_path, "crew", "alice", 2)


@pytest.mark.anyio
async def test_the_a2a_folder_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """``$MACULA_HOME/a2a`` is 0700 when the tokens or the door's requesters make it (mkdir's
    parents follow the umask), and one an earlier version left 0755 is tightened."""
    import os

    from tools.a2a.requesters import Requesters

    before = os.umask(0o022)
    try:
        tokens.create(tmp_path / "one", "crew", "alice", 1)
        async with Requesters(tmp_path / "two"):
            pass
        (tmp_path / "three" / "a2a").mkdir(parents=True, mode=0o755)
        tokens.create(tmp_path / "three", "crew", "alice", 1)
    finally:
        os.umask(before)
    for home in ("one", "two", "three"):
        folder = tmp_path / home / "a2a"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, home
        for path in folder.rglob("*"):
            wanted = 0o700 if path.is_dir() else 0o600
            assert stat.S_IMODE(path.stat().st_mode) == wanted, path
