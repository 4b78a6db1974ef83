"""The agent's own lifecycle without a station: what ``__aenter__`` opens, how presence stops."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from macula.agent import agent as agent_module
from macula.agent.agent import Agent, AgentSettings
from macula.agent.presence import Presence, Profile
from macula.node.node import Node
from macula.store.base import SqliteStore, StoreError, paths_from_env
from macula.store.roster import RosterStore
from macula.wire.identity import Identity


def _node() -> Node:
    return cast(Node, SimpleNamespace(identity=Identity.generate(os.urandom), dht=None))


def _settings(tmp_path: Path, profile: Profile | None = None) -> AgentSettings:
    return AgentSettings(
        paths=paths_from_env({"MACULA_HOME": str(tmp_path)}),
        policy_file=tmp_path / "contact_policy.json",
        profile=profile or Profile(),
    )


def _closed(store: SqliteStore | None) -> bool:
    assert store is not None
    return bool(store._closed)


def test_a_failing_start_closes_the_stores_it_opened(tmp_path: Path) -> None:
    async def scenario() -> None:
        agent = Agent(_node(), _settings(tmp_path, Profile(interval_seconds=1)))
        with pytest.raises(ValueError, match="interval_seconds"):
            await agent.__aenter__()  # Presence refuses the profile after the stores opened
        assert _closed(agent._roster) and _closed(agent._transcript) and _closed(agent._rings)

    asyncio.run(scenario())


def test_a_store_that_fails_to_open_closes_the_ones_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuse(path: object) -> SqliteStore:
        raise StoreError(f"{path}: cannot open")

    monkeypatch.setattr(agent_module.RingStore, "open", refuse)

    async def scenario() -> None:
        agent = Agent(_node(), _settings(tmp_path))
        with pytest.raises(StoreError):
            await agent.__aenter__()
        assert _closed(agent._roster) and _closed(agent._transcript) and agent._rings is None

    asyncio.run(scenario())


def test_stopping_presence_does_not_swallow_the_callers_cancellation(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await RosterStore.open(tmp_path / "roster.sqlite3") as roster:
            presence = Presence(_node(), roster, Profile(), lambda: 0)
            presence._tasks = [asyncio.create_task(asyncio.Event().wait())]
            stopping = asyncio.create_task(presence.stop_tasks())
            await asyncio.sleep(0)  # stop_tasks has cancelled its task and waits for it
            stopping.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stopping
            assert stopping.cancelled() and presence._tasks == []

    asyncio.run(scenario())
