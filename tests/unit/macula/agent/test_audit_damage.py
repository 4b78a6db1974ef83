"""The trail against damage and tampering: a damaged file never fails the agent, and
``verify`` names every forgery that needs no witness outside the trail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from macula.agent.audit import AuditSettings, AuditTrail, UnwritableTrail, audit_dir, record_once
from macula.agent.audit_verify import verify_trail
from macula.store.audit_log import AuditLog, canonical, entries, entry_hash, segments
from support.identities import hardened


def trail(tmp_path: Path, **options: int) -> AuditTrail:
    identity = hardened(1)
    return AuditTrail(audit_dir(tmp_path, identity.node_id), identity, clock=lambda: 1, **options)


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def rechained(rows: list[dict[str, Any]], first: int, prev: str) -> bytes:
    """``rows`` renumbered from ``first`` and rehashed from ``prev``, as a forger would."""
    for seq, row in enumerate(rows, start=first):
        row["seq"], row["prev"] = seq, prev
        row["hash"] = prev = entry_hash(row)
    return b"".join(canonical(row) + b"\n" for row in rows)


def test_a_line_with_a_foreign_seq_is_passed_over_when_the_tail_is_read(tmp_path: Path) -> None:
    t = trail(tmp_path)
    for n in range(3):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    ((_, path),) = segments(t.directory)
    with open(path, "ab") as segment:
        segment.write(b'{"hash":"y","seq":"x"}\n{"hash":"' + b"a" * 64 + b'","seq":true}\n')
    again = trail(tmp_path)
    assert again.record("tool_called", "ok", name="after") == 5  # on from seq 4, the last whole
    again.close()


def test_any_failure_of_the_files_is_counted_never_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = trail(tmp_path)
    t.record("tool_called", "ok", name="a")

    def broken(self: AuditLog, head: object, entry: object) -> object:
        raise RuntimeError("damaged")

    monkeypatch.setattr(AuditLog, "append", broken)
    assert t.record("tool_called", "ok", name="b") == 0
    assert t.checkpoint() == 0
    t.close()  # the agent's shutdown goes on (its checkpoint fails and is counted too)
    assert t.failures == 3
    assert verify_trail(t.directory).problem is None  # nothing half-written


def test_an_audit_folder_that_cannot_be_made_lets_the_agent_start(tmp_path: Path) -> None:
    (tmp_path / "audit").write_text("not a folder")
    settings = AuditSettings(tmp_path)
    opened = AuditTrail.open(settings, hardened(1))
    assert isinstance(opened, UnwritableTrail)
    assert opened.record("tool_called", "ok", name="mesh_hello") == 0
    assert opened.failures == 1
    opened.close()
    assert record_once(settings, hardened(1), "policy_changed", "applied", switch="x") == 0


def test_checkpoints_removed_and_the_chain_rehashed_are_named(tmp_path: Path) -> None:
    t = trail(tmp_path, checkpoint_every=8)
    for n in range(30):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    assert verify_trail(t.directory, checkpoint_every=8).problem is None
    ((_, path),) = segments(t.directory)
    kept = [row for row in rows_of(path) if row["kind"] != "head_signed"]
    path.write_bytes(rechained(kept, 1, "0" * 64))
    (t.directory / "head").unlink()  # a head to match, as the next writer rebuilds it
    again = trail(tmp_path, checkpoint_every=8)
    again._log.close()
    problem = verify_trail(t.directory, checkpoint_every=8).problem
    assert problem is not None and problem.kind == "checkpoint_missing" and problem.seq == 8


def test_a_segment_must_end_signed(tmp_path: Path) -> None:
    t = trail(tmp_path, segment_bytes=2048, keep_segments=8)
    for n in range(30):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    (first, path), (second, newer) = segments(t.directory)[:2]
    rows = rows_of(path)
    assert rows[-1]["kind"] == "head_signed"
    kept = rechained(rows[:-1], first, "0" * 64)
    path.write_bytes(kept)  # its checkpoint dropped, the next segment renamed to follow on
    following = rows_of(newer)
    newer.unlink()
    prev = json.loads(kept.splitlines()[-1])["hash"]
    (t.directory / f"seg-{second - 1:012d}.jsonl").write_bytes(
        rechained(following, second - 1, prev)
    )
    problem = verify_trail(t.directory).problem
    assert (
        problem is not None and problem.kind == "checkpoint_missing" and problem.seq == second - 2
    )


def test_a_writer_that_died_before_its_checkpoint_is_signed_for_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = trail(tmp_path, checkpoint_every=4)
    for n in range(3):
        t.record("tool_called", "ok", name=f"t{n}")
    monkeypatch.setattr(AuditTrail, "_sign", lambda self, head, sync: head)  # dies before it
    t.record("tool_called", "ok", name="t3")  # seq 4: due, never signed
    t._log.close()
    monkeypatch.undo()
    again = trail(tmp_path, checkpoint_every=4)
    assert again.record("tool_called", "ok", name="next") == 6  # 5 signs 4
    again.close()
    assert verify_trail(again.directory, checkpoint_every=4).problem is None


def test_an_anchor_made_from_a_checkpoint_does_not_verify(tmp_path: Path) -> None:
    t = trail(tmp_path, checkpoint_every=8)
    for n in range(30):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    ((_, path),) = segments(t.directory)
    rows = rows_of(path)
    signed = next(row["facts"] for row in rows if row["kind"] == "head_signed" and row["seq"] > 16)
    anchor = {key: signed[f"signed_{key}"] for key in ("seq", "hash")}
    anchor |= {"node_id": signed["node_id"], "signature": signed["signature"], "at_ms": 1}
    (t.directory / "anchor.json").write_bytes(canonical(anchor))  # no key needed: all public
    kept = [row for row in rows if row["seq"] > anchor["seq"]]
    path.unlink()
    renamed = t.directory / f"seg-{anchor['seq'] + 1:012d}.jsonl"
    renamed.write_bytes(b"".join(canonical(row) + b"\n" for row in kept))
    problem = verify_trail(t.directory, checkpoint_every=8).problem
    assert problem is not None and problem.kind == "edited" and "anchor" in problem.detail


def test_a_segment_whose_name_is_not_its_first_seq_is_named(tmp_path: Path) -> None:
    t = trail(tmp_path)
    t.record("tool_called", "ok", name="a")
    t.close()
    ((_, path),) = segments(t.directory)
    path.rename(t.directory / "seg-000000000002.jsonl")
    problem = verify_trail(t.directory).problem
    assert problem is not None and problem.kind == "edited" and "name" in problem.detail


def test_a_segment_put_below_the_anchor_is_named_and_never_shown(tmp_path: Path) -> None:
    t = trail(tmp_path, segment_bytes=2048, keep_segments=8)
    for n in range(40):
        t.record("tool_called", "ok", name=f"t{n}")
    (_, oldest), (second, _) = segments(t.directory)[:2]
    last = rows_of(oldest)[-1]
    (t.directory / "anchor.json").write_bytes(canonical(t._anchor(last["seq"], last["hash"])))
    t.close()  # as a rotation that died before it unlinked the dropped segment
    assert verify_trail(t.directory).problem is None
    assert next(entries(t.directory))["seq"] == second
    forged = [row | {"outcome": "forged"} for row in rows_of(oldest)]
    oldest.write_bytes(b"".join(canonical(row) + b"\n" for row in forged[:-1]))
    assert all(e["outcome"] != "forged" for e in entries(t.directory))
    problem = verify_trail(t.directory).problem
    assert problem is not None and problem.kind == "edited" and oldest.name in problem.detail


def test_a_wiped_trail_is_named_and_a_new_empty_one_is_not(tmp_path: Path) -> None:
    fresh = trail(tmp_path / "fresh")
    fresh.close()  # opened, nothing recorded
    report = verify_trail(fresh.directory)
    assert report.problem is None and report.entries == 0
    t = trail(tmp_path / "wiped")
    for n in range(3):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    for _, path in segments(t.directory):
        path.unlink()
    (t.directory / "head").unlink()
    problem = verify_trail(t.directory).problem
    assert problem is not None and problem.kind == "head_missing"


def test_a_line_that_is_not_canonical_json_is_named(tmp_path: Path) -> None:
    t = trail(tmp_path)
    for n in range(3):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    ((_, path),) = segments(t.directory)
    lines = path.read_bytes().split(b"\n")
    lines[1] = b'{"kind":"policy_changed","outcome":"capability_disabled",' + lines[1][1:]
    path.write_bytes(b"\n".join(lines))  # a grep sees policy_changed; json.loads the last key
    problem = verify_trail(t.directory).problem
    assert problem is not None and problem.kind == "edited" and problem.seq == 2


def test_a_head_lost_right_after_a_rotation_goes_on_from_the_segment_before(
    tmp_path: Path,
) -> None:
    t = trail(tmp_path, segment_bytes=2048, keep_segments=8)
    for n in range(40):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    last = rows_of(segments(t.directory)[-1][1])[-1]
    (t.directory / f"seg-{last['seq'] + 1:012d}.jsonl").touch()  # as a rotation leaves it
    (t.directory / "head").unlink()
    again = trail(tmp_path, segment_bytes=2048, keep_segments=8)
    assert again.record("tool_called", "ok", name="next") == last["seq"] + 1
    again.close()
    assert next(entries(again.directory, last["seq"]))["prev"] == last["hash"]
    assert verify_trail(again.directory).problem is None


@pytest.mark.parametrize("lose_newline_only", [0, 1])
def test_a_write_cut_short_is_mended_before_the_next_entry(
    tmp_path: Path, lose_newline_only: int
) -> None:
    t = trail(tmp_path)
    for n in range(3):
        t.record("tool_called", "ok", name=f"t{n}")
    t.close()
    ((_, path),) = segments(t.directory)
    data = path.read_bytes()
    if lose_newline_only:
        path.write_bytes(data[:-1])  # the close's checkpoint lost only its newline
    else:
        path.write_bytes(data + b'{"at_ms":1,"facts":{"na')  # a crash mid-write
    assert verify_trail(t.directory).problem is not None
    again = trail(tmp_path)
    assert again.record("tool_called", "ok", name="next") == 5  # the cut entry is lost
    again.close()
    assert verify_trail(again.directory).problem is None
    assert [e["seq"] for e in entries(again.directory)] == [1, 2, 3, 4, 5, 6]
