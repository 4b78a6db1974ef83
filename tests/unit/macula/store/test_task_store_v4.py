"""Schema step 4 of the task store (issue 39): a file of step 3 keeps its tasks and its
full-text index, and takes the ``pending_owner_approval`` state."""

from __future__ import annotations

from pathlib import Path

import pytest

from macula.store.search import SEARCH_TASKS_V3
from macula.store.task_rows import TASKS_V1, TASKS_V2
from macula.store.tasks import Task, TaskStore

pytestmark = pytest.mark.anyio

ME, PEER = b"\x01" * 32, b"\x02" * 32


class StepThreeStore(TaskStore):
    MIGRATIONS = (TASKS_V1, TASKS_V2, SEARCH_TASKS_V3)


async def indexed(store: TaskStore, word: str) -> int:
    rows = await store._fetchall("SELECT count(*) FROM tasks_fts WHERE tasks_fts MATCH ?", (word,))
    return int(rows[0][0])


async def test_a_step_three_file_is_rebuilt_keeping_tasks_and_index(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    async with await StepThreeStore.open(path) as old:
        await old.create(
            ME, Task.new("a" * 32, "requester", PEER, "unicorn", {"k": 1}), 5, max_open_per_peer=9
        )
        assert await old.schema_version() == 3
    async with await TaskStore.open(path) as store:
        assert await store.schema_version() == 4
        kept = await store.get(ME, "a" * 32)
        assert kept is not None and (kept.title, kept.input) == ("unicorn", {"k": 1})
        assert await indexed(store, "unicorn") == 1
        body = {"state": "pending_owner_approval", "state_seq": 2, "note": "held"}
        changed, applied = await store.apply_remote(ME, PEER, "a" * 32, body, 6)
        assert applied == 1 and changed is not None and changed.state == "pending_owner_approval"
        await store.create(
            ME,
            Task.new("b" * 32, "assignee", PEER, "griffin", "x"),
            7,
            max_open_per_peer=9,
            state_seq=3,
        )
        fresh = await store.get(ME, "b" * 32)
        assert fresh is not None and (fresh.state, fresh.state_seq) == ("submitted", 3)
        assert await indexed(store, "griffin") == 1  # the triggers were made again
        assert await store.integrity_check() == "ok"


def test_the_v4_migration_allows_exactly_the_states_of_today() -> None:
    """The migration's CHECK is written out; until a later state needs a migration of its own,
    it lists every state (in ``STATES``' order)."""
    from macula.store.task_rows import V4_STATES
    from macula.store.task_states import STATES

    assert tuple(V4_STATES) == tuple(STATES)
