"""``mesh_audit``'s page (``read_page``): filters by kind, seq and time, a bounded page, and how
many entries match past it."""

from __future__ import annotations

from pathlib import Path

from macula.agent.audit import AuditTrail
from support.identities import hardened
from tools.groups.owner.audit import read_page


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


def filled(tmp_path: Path) -> Path:
    """seq 1..10: tool_called at odd seqs, task_received at even, at_ms 2,000 .. 11,000."""
    trail = AuditTrail(tmp_path / "trail", hardened(1), clock=Clock(), checkpoint_every=1000)
    for n in range(10):
        kind = "tool_called" if n % 2 == 0 else "task_received"
        trail.record(kind, "ok", n=n)
    return trail.directory


def seqs(page: list[dict[str, object]]) -> list[object]:
    return [entry["seq"] for entry in page]


def test_filters_and_remaining(tmp_path: Path) -> None:
    directory = filled(tmp_path)
    every = {"kind": None, "until_seq": None, "since_ms": None, "until_ms": None}
    page, remaining = read_page(directory, 0, **every | {"limit": 4})
    assert seqs(page) == [1, 2, 3, 4] and remaining == 6
    page, remaining = read_page(directory, 4, **every | {"limit": 4})
    assert seqs(page) == [5, 6, 7, 8] and remaining == 2
    page, remaining = read_page(directory, 0, **every | {"kind": "task_received", "limit": 50})
    assert seqs(page) == [2, 4, 6, 8, 10] and remaining == 0
    page, _ = read_page(directory, 2, **every | {"until_seq": 5, "limit": 50})
    assert seqs(page) == [3, 4, 5]
    page, _ = read_page(directory, 0, **every | {"since_ms": 4_000, "until_ms": 6_000, "limit": 50})
    assert seqs(page) == [3, 4, 5]
    assert set(page[0]) == {"seq", "at_ms", "kind", "outcome", "facts", "hash"}


def test_an_empty_trail_is_an_empty_page(tmp_path: Path) -> None:
    every = {"kind": None, "until_seq": None, "since_ms": None, "until_ms": None}
    assert read_page(tmp_path / "none", 0, **every | {"limit": 5}) == ([], 0)
