"""``macula-mcp audit verify|show|export`` as the owner runs them (a real subprocess): verify
names the first entry edited, removed or reordered, and a truncated file; exit 0 / 1 / 3."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from macula.agent.audit import AuditTrail, audit_dir
from macula.keyfile import save_identity
from macula.store.audit_log import segments
from support.identities import hardened
from support.mcpkit import cli


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home with agent ``alice`` whose trail holds 20 entries (seq 1..20) and a checkpoint
    (seq 21, at close)."""
    identity = hardened(3)
    save_identity(tmp_path / "agents" / "alice.key", identity)
    trail = AuditTrail(audit_dir(tmp_path, identity.node_id), identity)
    for n in range(20):
        trail.record("tool_called", "ok", name=f"mesh_tool_{n}", args_digest=trail.digest(n))
    trail.close()
    return tmp_path


def env_of(home: Path) -> dict[str, str]:
    return dict(os.environ, MACULA_HOME=str(home))


def segment(home: Path) -> Path:
    ((_, path),) = segments(audit_dir(home, hardened(3).node_id))
    return path


def lines(home: Path) -> list[bytes]:
    return segment(home).read_bytes().splitlines(keepends=True)


def verify(home: Path) -> tuple[int, str]:
    done = cli(["audit", "verify", "--agent", "alice"], env_of(home))
    return done.returncode, done.stdout + done.stderr


def test_an_intact_trail_verifies(home: Path) -> None:
    code, said = verify(home)
    assert code == 0, said
    assert "intact: seq 1..21, 21 entries, 1 checkpoints" in said


def test_verify_names_an_edited_entry(home: Path) -> None:
    rows = lines(home)
    entry = json.loads(rows[6])
    entry["outcome"] = "invalid_argument"
    rows[6] = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    segment(home).write_bytes(b"".join(rows))
    code, said = verify(home)
    assert code == 1, said
    assert "edited: seq 7 was edited" in said and "first bad entry: seq 7" in said


def test_verify_names_a_removed_entry(home: Path) -> None:
    rows = lines(home)
    del rows[9]
    segment(home).write_bytes(b"".join(rows))
    code, said = verify(home)
    assert code == 1, said
    assert "removed: seq 10 removed" in said and "first bad entry: seq 10" in said


def test_verify_names_two_swapped_entries(home: Path) -> None:
    rows = lines(home)
    rows[4], rows[5] = rows[5], rows[4]
    segment(home).write_bytes(b"".join(rows))
    code, said = verify(home)
    assert code == 1, said
    assert "reordered: seq 6 comes before seq 5" in said and "first bad entry: seq 5" in said


def test_verify_catches_a_truncated_file(home: Path) -> None:
    data = segment(home).read_bytes()
    cut = data[: len(data) * 2 // 3]  # inside a line
    segment(home).write_bytes(cut)
    code, said = verify(home)
    assert code == 1, said
    line = cut.count(b"\n") + 1
    assert said.startswith(
        f"truncated: the line of seq {line} is cut (seg-000000000001.jsonl line {line})"
    ), said


def test_verify_catches_whole_lines_cut_from_the_end(home: Path) -> None:
    segment(home).write_bytes(b"".join(lines(home)[:15]))
    code, said = verify(home)
    assert code == 1, said
    assert "truncated: the trail ends at seq 15 but its head says seq 21" in said


def test_show_and_export(home: Path, tmp_path: Path) -> None:
    shown = cli(["audit", "show", "--agent", "alice", "--limit", "3"], env_of(home))
    assert shown.returncode == 0, shown.stderr
    said = shown.stdout.splitlines()
    assert len(said) == 3 and said[-1].split()[2:4] == ["head_signed", "signed"]
    out = tmp_path / "export.jsonl"
    exported = cli(["audit", "export", "--agent", "alice", "--out", str(out)], env_of(home))
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["seq"] for row in rows] == list(range(1, 22))
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_no_trail_and_bad_usage(tmp_path: Path) -> None:
    nothing = cli(["audit", "verify"], env_of(tmp_path))
    assert nothing.returncode == 3 and "no audit trail" in nothing.stderr
    nobody = cli(["audit", "show", "--agent", "bob"], env_of(tmp_path))
    assert nobody.returncode == 3 and "does not exist" in nobody.stderr
    assert cli(["audit", "rewrite"], env_of(tmp_path)).returncode == 2
