"""Which mesh tasks were handed to an A2A agent: the link from a task to the agent's URL and the
A2A task's ids (docs/a2a.md, "Outbound").

Invariants:
- The task itself lives in the agent's own task store (``macula.store.tasks``), as a
  ``requester`` row whose ``peer`` is ``marker(url)``: 32 bytes no node can have (a SHA-256
  under a domain tag), so the per-peer bounds count per A2A agent and every task tool reads it.
  This file only says where such a task went; it never holds the task's state.
- A link is written before the A2A agent is dialled, and its A2A task id as soon as an answer
  names it: after a restart, get and wait resume from the id kept here.
- Rows are keyed by ``owner`` (node id) like the task store, in a file of their own beside it
  (``a2a_links.sqlite3``), so the library's store and its schema are untouched.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from macula.store.base import Migration, SqliteStore

FILE_NAME: Final = "a2a_links.sqlite3"
_TAG: Final = b"macula a2a agent\x00"

LINKS_V1: Final[Migration] = (
    """
    CREATE TABLE a2a_links (
        owner       BLOB NOT NULL CHECK (length(owner) = 32),
        task_id     TEXT NOT NULL,
        url         TEXT NOT NULL,
        a2a_task_id TEXT,
        context_id  TEXT,
        PRIMARY KEY (owner, task_id)
    ) WITHOUT ROWID
    """,
)


def marker(url: str) -> bytes:
    """The ``peer`` of a task handed to the A2A agent at ``url`` (normalised)."""
    return hashlib.sha256(_TAG + url.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class Link:
    task_id: str
    url: str
    a2a_task_id: str | None = None
    context_id: str | None = None


class LinkStore(SqliteStore):
    MIGRATIONS = (LINKS_V1,)

    async def add(self, owner: bytes, task_id: str, url: str) -> None:
        await self._execute(
            "INSERT OR IGNORE INTO a2a_links (owner, task_id, url) VALUES (?, ?, ?)",
            (owner, task_id, url),
        )

    async def bind(self, owner: bytes, task_id: str, a2a_task_id: str, context_id: str) -> None:
        await self._execute(
            "UPDATE a2a_links SET a2a_task_id = ?, context_id = ? WHERE owner = ? AND task_id = ?",
            (a2a_task_id, context_id or None, owner, task_id),
        )

    async def get(self, owner: bytes, task_id: str) -> Link | None:
        row = await self._fetchone(
            "SELECT task_id, url, a2a_task_id, context_id FROM a2a_links"
            " WHERE owner = ? AND task_id = ?",
            (owner, task_id),
        )
        return None if row is None else _link(row)

    async def all(self, owner: bytes) -> list[Link]:
        rows = await self._fetchall(
            "SELECT task_id, url, a2a_task_id, context_id FROM a2a_links WHERE owner = ?",
            (owner,),
        )
        return [_link(row) for row in rows]

    async def drop(self, owner: bytes, task_ids: list[str]) -> None:
        for task_id in task_ids:
            await self._execute(
                "DELETE FROM a2a_links WHERE owner = ? AND task_id = ?", (owner, task_id)
            )


def _link(row: tuple[object, ...]) -> Link:
    a2a_id, context = row[2], row[3]
    return Link(
        str(row[0]),
        str(row[1]),
        None if a2a_id is None else str(a2a_id),
        None if context is None else str(context),
    )
