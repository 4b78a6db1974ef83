"""The audit trail's chain: append, verify, checkpoints, rotation with an anchor, the head,
and appends from two real processes at once never forking the chain."""

from __future__ import annotations

import itertools
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from macula.agent.audit import AuditSettings, AuditTrail, NoTrail, audit_dir, record_once
from macula.agent.audit_verify import verify_trail
from macula.keyfile import save_identity
from macula.store.audit_log import GENESIS, canonical, entries, entry_hash, read_anchor, segments
from support.identities import hardened


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        self.now += 5
        return self.now


def trail(tmp_path: Path, **options: int) -> AuditTrail:
    identity = hardened(1)
    return AuditTrail(audit_dir(tmp_path, identity.node_id), identity, clock=Clock(), **options)


def test_entries_chain_from_genesis_and_carry_digests_only(tmp_path: Path) -> None:
    t = trail(tmp_path)
    digest = t.digest({"text": "the secret plan"})
    assert t.record("tool_called", "ok", name="mesh_say", args_digest=digest) == 1
    assert t.record("task_received", "refused", sender="ab" * 32, code="too_large") == 2
    t.close()
    found = list(entries(t.directory))
    assert [e["seq"] for e in found] == [1, 2, 3]  # the close signed the head
    assert found[0]["prev"] == GENESIS
    assert found[1]["prev"] == found[0]["hash"] and found[2]["prev"] == found[1]["hash"]
    assert all(entry_hash(e) == e["hash"] for e in found)
    assert found[0]["at_ms"] == 1_700_000_000_005  # the injected clock
    assert found[2]["kind"] == "head_signed" and found[2]["facts"]["signed_seq"] == 2
    text = b"".join(p.read_bytes() for _, p in segments(t.directory))
    assert b"secret" not in text and digest.encode() in text
    assert verify_trail(t.directory).problem is None


def test_digests_are_keyed_per_agent(tmp_path: Path) -> None:
    one, other = trail(tmp_path / "a"), AuditTrail(tmp_path / "b", hardened(2))
    assert one.digest({"x": 1}) == one.digest({"x": 1}) != other.digest({"x": 1})
    assert len(one.digest(b"bytes too")) == 64


def test_files_are_private(tmp_path: Path) -> None:
    t = trail(tmp_path)
    t.record("tool_called", "ok", name="mesh_hello")
    t.close()
    assert stat.S_IMODE(t.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(t.directory.parent.stat().st_mode) == 0o700  # <home>/audit
    for path in t.directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_bad_facts_and_kinds_are_refused(tmp_path: Path) -> None:
    t = trail(tmp_path)
    with pytest.raises(ValueError, match="not an audit kind"):
        t.record("tool_deleted", "ok")
    with pytest.raises(ValueError, match="not an audit kind"):
        t.record("head_signed", "signed")
    with pytest.raises(ValueError, match="256"):
        t.record("tool_called", "ok", text="x" * 300)  # content must be digested
    assert t.record("tool_called", "ok", flag=True) == 1  # a bool is 0/1
    assert next(entries(t.directory))["facts"] == {"flag": 1}


def test_checkpoints_every_n_entries_verify(tmp_path: Path) -> None:
    t = trail(tmp_path, checkpoint_every=4)
    for n in range(9):  # seq 1-4, 5 signs 4, 6-8, 9 signs 8, 10-11
        t.record("tool_called", "ok", name=f"tool{n}")
    report = verify_trail(t.directory)
    assert report.problem is None and report.checkpoints == 2 and report.last_seq == 11
    assert report.notes  # the tail after the last checkpoint is not signed yet
    t.close()
    assert verify_trail(t.directory).notes == []


def test_rotation_keeps_k_segments_and_an_anchor_that_verifies(tmp_path: Path) -> None:
    t = trail(tmp_path, segment_bytes=2048, keep_segments=3)
    for n in range(120):
        t.record("tool_called", "ok", name="mesh_say", args_digest=t.digest(n))
    t.close()
    held = segments(t.directory)
    assert len(held) == 3
    anchor = read_anchor(t.directory)
    assert anchor is not None and anchor["seq"] == held[0][0] - 1
    report = verify_trail(t.directory)
    assert report.problem is None, report.problem
    assert report.anchored_at == anchor["seq"] and report.first_seq == anchor["seq"] + 1
    first = next(entries(t.directory))
    assert first["prev"] == anchor["hash"]  # the first kept entry links to the last dropped
    for (_, path), (following, _) in itertools.pairwise(held):
        last = json.loads(path.read_bytes().splitlines()[-1])
        assert last["kind"] == "head_signed" and last["seq"] == following - 1


def test_a_forged_anchor_is_named(tmp_path: Path) -> None:
    t = trail(tmp_path, segment_bytes=2048, keep_segments=2)
    for n in range(80):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    anchor_path = t.directory / "anchor.json"
    anchor = json.loads(anchor_path.read_text())
    anchor_path.write_text(json.dumps(anchor | {"hash": "1" * 64}))
    problem = verify_trail(t.directory).problem
    assert problem is not None and problem.kind == "edited" and "anchor" in problem.detail


def test_a_rewritten_and_rehashed_chain_fails_its_checkpoint(tmp_path: Path) -> None:
    t = trail(tmp_path, checkpoint_every=8)
    for n in range(12):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    ((_, path),) = segments(t.directory)
    rows = [json.loads(line) for line in path.read_bytes().splitlines()]
    rows[2]["outcome"] = "invalid_argument"  # then rehash everything after, as a forger would
    prev = rows[1]["hash"]
    for row in rows[2:]:
        row["prev"] = prev
        row["hash"] = prev = entry_hash(row)
    path.write_bytes(b"".join(canonical(r) + b"\n" for r in rows))  # as the writer writes
    problem = verify_trail(t.directory).problem
    assert problem is not None and problem.kind == "edited" and "checkpoint" in problem.detail


def test_a_lost_head_is_recovered_by_the_writer_and_named_by_verify(tmp_path: Path) -> None:
    t = trail(tmp_path)
    t.record("tool_called", "ok", name="a")
    t.close()
    (t.directory / "head").unlink()
    problem = verify_trail(t.directory).problem
    assert problem is not None and problem.kind == "head_missing"
    again = trail(tmp_path)
    assert again.record("tool_called", "ok", name="b") == 3  # the chain goes on, not forked
    again.close()
    assert verify_trail(t.directory).problem is None


def test_turned_off_it_records_nothing(tmp_path: Path) -> None:
    env = {"MACULA_HOME": str(tmp_path), "MACULA_MCP_NO_AUDIT": "1"}
    settings = AuditSettings.from_env(env)
    assert isinstance(AuditTrail.open(settings, hardened(1)), NoTrail)
    assert record_once(settings, hardened(1), "policy_changed", "applied", switch="x") == 0
    assert not (tmp_path / "audit").exists()
    on = AuditSettings.from_env({"MACULA_HOME": str(tmp_path)})
    assert record_once(on, hardened(1), "policy_changed", "applied", switch="x", by="cli") == 1
    assert verify_trail(audit_dir(tmp_path, hardened(1).node_id)).problem is None


WRITER = """
import sys
from pathlib import Path
from macula.agent.audit import AuditTrail
from macula.keyfile import load_identity
trail = AuditTrail(Path(sys.argv[1]), load_identity(sys.argv[2]), segment_bytes=4096,
                   keep_segments=50, checkpoint_every=16)
print("ready", flush=True)
sys.stdin.readline()
for n in range(int(sys.argv[3])):
    trail.record("tool_called", "ok", name=sys.argv[4], n=n)
trail.close()
"""


def test_two_processes_append_to_one_chain_without_forking_it(tmp_path: Path) -> None:
    identity = hardened(1)
    key = tmp_path / "id.key"
    save_identity(key, identity)
    directory = audit_dir(tmp_path, identity.node_id)
    count = 300
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(directory), str(key), str(count), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for name in ("daemon", "cli")
    ]
    for writer in writers:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    for writer in writers:  # both start together: their appends interleave
        assert writer.stdin is not None
        writer.stdin.write("go\n")
        writer.stdin.flush()
    for writer in writers:
        assert writer.wait(timeout=60) == 0
    report = verify_trail(directory)
    assert report.problem is None, report.problem
    found = [e for e in entries(directory) if e["kind"] == "tool_called"]
    assert len(found) == 2 * count
    for name in ("daemon", "cli"):
        assert [e["facts"]["n"] for e in found if e["facts"]["name"] == name] == list(range(count))
    assert [e["seq"] for e in entries(directory)] == list(range(1, report.last_seq + 1))
