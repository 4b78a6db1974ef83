"""The trail against damage and tampering: a damaged file never fails the agent, and
``verify`` names every forgery that needs no witness outside the trail."""

from __future__ import annotations

from pathlib import Path

import pytest

from macula.agent.audit import AuditSettings, AuditTrail, UnwritableTrail, audit_dir, record_once
from macula.agent.audit_verify import verify_trail
from macula.store.audit_log import AuditLog, segments
from support.identities import hardened


def trail(tmp_path: Path, **options: int) -> AuditTrail:
    identity = hardened(1)
    return AuditTrail(audit_dir(tmp_path, identity.node_id), identity, clock=lambda: 1, **options)


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
