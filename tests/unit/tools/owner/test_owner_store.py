"""``owner.toml`` written by the owner's hand: whole, 0600 in a 0700 home, comments and other
features' tables kept, bad changes refused with nothing written; and noticed by a session's
watcher (an injectable clock), said on stderr once per content."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from tools.owner import store, watch
from tools.owner.policy import Problem
from tools.owner.store import OwnerFileError, load, policy_path, set_preset, set_switch
from tools.owner.watch import PolicySource


def test_writes_are_private_and_keep_comments_and_other_tables(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = policy_path(home)
    set_switch(path, "mesh_serve", 0)
    assert home.stat().st_mode & 0o777 == 0o700 and path.stat().st_mode & 0o777 == 0o600
    path.write_text(
        "# the owner's notes\n" + path.read_text() + "\n[approvals]\nttl_s = 60  # keep\n"
        "[agents.alice.a2a]\nport = 7\n"
    )
    set_switch(path, "rpc", 1, agent="alice")
    set_preset(path, "talk")
    text = path.read_text()
    assert "# the owner's notes" in text and "ttl_s = 60  # keep" in text and "port = 7" in text
    switches = load(path).switches("alice")
    assert switches.preset == "talk" and switches.on["mesh_call"] == 1
    assert switches.on["mesh_serve"] == 1  # the preset cleared the home's switches
    assert load(path).switches(None).on["mesh_serve"] == 0  # not in talk


@pytest.mark.parametrize(
    ("name", "value", "agent"),
    [("mesh_nope", 0, None), ("rpc", 2, None), ("mesh_say", 0, "bad name"), ("../x", 1, None)],
)
def test_a_bad_change_writes_nothing(tmp_path: Path, name: str, value: int, agent: str) -> None:
    path = policy_path(tmp_path)
    path.write_text("# mine\n")
    with pytest.raises(OwnerFileError):
        set_switch(path, name, value, agent)
    with pytest.raises(OwnerFileError):
        set_preset(path, "fast")
    assert path.read_text() == "# mine\n"


def test_a_file_that_is_not_toml_is_not_edited(tmp_path: Path) -> None:
    path = policy_path(tmp_path)
    path.write_text("[tools\n")
    with pytest.raises(OwnerFileError, match="fix the file by hand"):
        set_switch(path, "rpc", 0)
    assert path.read_text() == "[tools\n"


def test_unreadable_or_huge_files_fail_closed(tmp_path: Path) -> None:
    path = policy_path(tmp_path)
    path.mkdir(parents=True)
    assert isinstance(load(path).found, Problem)
    path.rmdir()
    path.write_bytes(b"#" * (store.MAX_FILE_BYTES + 1))
    assert isinstance(load(path).found, Problem)
    path.write_bytes(b"\xff\xfe")
    assert set(load(path).switches(None).on.values()) == {0}


def test_every_change_is_told_to_the_audit_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[dict[str, object]] = []
    monkeypatch.setattr(store, "policy_changed_event", lambda **kw: told.append(kw))
    path = policy_path(tmp_path)
    set_switch(path, "rpc", 0, by="console")
    set_preset(path, "talk", agent="alice")
    assert [(t["by"], t["change"], t["agent"]) for t in told] == [
        ("console", "groups.rpc=0", None),
        ("cli", "preset talk", "alice"),
    ]
    assert told[1]["before"] == told[0]["after"] and told[0]["before"] == ""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_watcher_notices_changes_once_and_ignores_comment_edits(tmp_path: Path) -> None:
    path = policy_path(tmp_path)
    clock = Clock()
    source = PolicySource(path, "alice", clock)
    assert source.current().preset == "full" and source.generation == 0
    assert not source.check()
    set_switch(path, "mesh_say", 0, agent="alice")
    clock.now = path.stat().st_mtime + 10  # past the racy window: stat alone decides
    assert source.check() and source.generation == 1
    assert not source.check()
    path.write_text(path.read_text() + "# a comment\n")
    assert not source.check() and source.generation == 1  # same switches: nobody is told
    set_switch(path, "mesh_say", 0)  # the home's: alice's own switch still wins
    assert not source.check()


def test_an_edit_inside_one_timestamp_tick_is_still_seen(tmp_path: Path) -> None:
    path = policy_path(tmp_path)
    path.parent.mkdir(exist_ok=True)
    path.write_text("[groups]\nrpc = 1\n")
    clock = Clock()
    clock.now = path.stat().st_mtime  # within the racy window
    source = PolicySource(path, None, clock)
    stat = path.stat()
    path.write_text("[groups]\nrpc = 0\n")  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime
    assert source.check() and source.current().on["mesh_call"] == 0


def test_a_malformed_file_is_said_once_per_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=watch.log.name)
    path = policy_path(tmp_path)
    path.parent.mkdir(exist_ok=True)
    path.write_text("[tools]\nmesh_say = 7\n")
    clock = Clock()
    sources = [PolicySource(path, None, clock) for _ in range(3)]
    for source in sources:
        for _ in range(3):
            source.current()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and f"{path}:2: key tools.mesh_say" in said[0]
    path.write_text("[tools]\nmesh_say = 8\n")
    clock.now = 1e12
    for source in sources:
        source.current()
    assert len(caplog.records) == 2


def test_a_change_lands_in_the_trails_it_touches(tmp_path: Path) -> None:
    """The home's switches: every agent that keeps a trail; an agent's: that agent's alone."""
    from macula.agent.audit import AuditSettings, audit_dir, record_once
    from macula.config import identity_from_env
    from macula.store.audit_log import entries

    env = {"MACULA_HOME": str(tmp_path), "MACULA_MCP_AGENT": "alice"}
    alice = identity_from_env(env)
    bob = identity_from_env(env | {"MACULA_MCP_AGENT": "bob"})
    settings = AuditSettings.from_env(env)
    record_once(settings, alice, "tool_called", "ok", name="mesh_hello", args_digest="0")
    path = policy_path(tmp_path)
    set_switch(path, "rpc", 0)  # the home's: alice keeps a trail, bob none yet
    set_preset(path, "talk", agent="bob", by="console")

    def changes(node_id: bytes) -> list[dict[str, object]]:
        folder = audit_dir(tmp_path, node_id)
        return [e for e in entries(folder) if e["kind"] == "policy_changed"]

    mine = changes(alice.node_id)
    assert [(e["facts"]["switch"], e["facts"]["by"]) for e in mine] == [("groups.rpc=0", "cli")]
    assert [e["facts"]["switch"] for e in changes(bob.node_id)] == ["preset talk"]
    facts = mine[0]["facts"]
    assert facts["old"] == "" and len(facts["new"]) == 16  # digests of the file, not the file
    assert "[groups]" not in json.dumps(mine)


def test_two_editors_at_once_keep_each_others_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers (say the CLI and the console) turning off disjoint halves of the tools at the
    same time: every tool ends off (without the lock, about 20 of 47 stayed on)."""
    import threading

    from tools.owner.presets import ALL_TOOLS

    monkeypatch.setenv("MACULA_MCP_NO_AUDIT", "1")
    path = policy_path(tmp_path)
    names = sorted(ALL_TOOLS)

    def turn_off(half: list[str]) -> None:
        for name in half:
            set_switch(path, name, 0)

    threads = [threading.Thread(target=turn_off, args=(h,)) for h in (names[::2], names[1::2])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(load(path).switches(None).on.values()) == {0}
