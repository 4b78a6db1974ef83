"""The stores take any integer for a limit, an offset or a time bound: one past SQLite's 64-bit
range is clamped (an offset past every row finds nothing), never an OverflowError (issue 26:
mesh_task_list offset >= 2^63 was an internal_error)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import pytest

from macula.store import RingStore, TranscriptStore
from macula.store.base import page, sql_int
from macula.store.roster import RosterStore
from macula.store.tasks import Task, TaskStore
from support.running import run

T = TypeVar("T")
ME, PEER = b"\x01" * 32, b"\x02" * 32
NOW = 1_700_000_000_000
HUGE = (1 << 63, 1 << 64, 10**30)


def test_page_and_sql_int_clamp_to_sqlite_range() -> None:
    assert page(10, 20) == (10, 20)
    assert page(1 << 64, 1 << 70) == ((1 << 63) - 1, (1 << 63) - 1)
    assert sql_int(-(1 << 80)) == -(1 << 63) and sql_int(5) == 5
    with pytest.raises(ValueError, match="negative"):
        page(-1)


@pytest.mark.parametrize("huge", HUGE)
def test_task_list_with_a_huge_offset_or_limit(tmp_path: Path, huge: int) -> None:
    async def main() -> None:
        async with await TaskStore.open(tmp_path / "tasks.sqlite3") as store:
            made = Task("t1", "requester", PEER, "title", "input", "submitted", 1,
                        None, None, None, None, 0, 0, NOW, NOW)  # fmt: skip
            await store.create(ME, made, NOW, max_open_per_peer=8)
            assert await store.list_tasks(ME, offset=huge) == []
            assert [t.task_id for t in await store.list_tasks(ME, limit=huge)] == ["t1"]

    run(main())


@pytest.mark.parametrize("huge", HUGE)
def test_other_stores_with_huge_numbers(tmp_path: Path, huge: int) -> None:
    async def main() -> None:
        async with await RosterStore.open(tmp_path / "roster.sqlite3") as roster:
            assert await roster.list(NOW, limit=huge, offset=huge) == []
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            assert await rings.recent(limit=huge) == []
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            assert await transcript.messages(None, since_ms=huge, limit=huge) == []
            assert await transcript.messages(None, since_ms=-huge) == []

    run(main())
