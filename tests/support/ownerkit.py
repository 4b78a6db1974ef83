"""The owner's capability switches from a client's side: an MCP client (official SDK, either
protocol era) that counts the ``tools/list_changed`` it receives, and the presets' tool
tables written out once for the tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp import Client
from mcp_types import ToolListChangedNotification

from .waiting import eventually

LIST_CHANGED = "notifications/tools/list_changed"


@dataclass
class Watched:
    """A connected client and the ``tools/list_changed`` it has received so far."""

    client: Client
    changes: list[Any] = field(default_factory=list)

    async def names(self) -> set[str]:
        return {tool.name for tool in (await self.client.list_tools()).tools}

    async def next_change(self, seen: int, timeout: float = 20.0) -> None:
        """Wait until more than ``seen`` changes arrived."""
        await eventually(lambda: len(self.changes) > seen, timeout, message="no list_changed")


def _is_change(message: Any) -> bool:
    root = getattr(message, "root", message)
    return isinstance(root, ToolListChangedNotification) or getattr(root, "method", "") == (
        LIST_CHANGED
    )


@contextlib.asynccontextmanager
async def watched(server: Any, mode: str) -> AsyncIterator[Watched]:
    """``Client(server, mode=mode)`` counting ``tools/list_changed``: as notifications on the
    session (2025 era: ``mode`` "legacy") or on a ``subscriptions/listen`` stream (2026-07-28)."""
    changes: list[Any] = []

    async def record(message: Any) -> None:
        if _is_change(message):
            changes.append(message)

    modern = mode not in ("legacy", "auto")
    handler = None if modern else record
    async with Client(server, mode=mode, message_handler=handler) as client:  # type: ignore[arg-type]
        seen = Watched(client, changes)
        if not modern:
            yield seen
            return
        listening = anyio.Event()

        async def listen() -> None:
            async with client.listen(tools_list_changed=True) as subscription:
                listening.set()
                async for event in subscription:
                    changes.append(event)

        async with anyio.create_task_group() as group:
            group.start_soon(listen)
            await listening.wait()
            try:
                yield seen
            finally:
                group.cancel_scope.cancel()
