"""The agent's stores stay bounded whatever peers send: transcript rows per room and age, rings
rows and age, pruned by themselves as rows arrive; the bounds come from the environment.

Real SQLite files under ``tmp_path``; coroutines run with ``asyncio.run``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import TypeVar, cast

import pytest

from macula.agent.agent import Agent, AgentSettings
from macula.errors import ConfigError
from macula.node.node import Node
from macula.store import Bounds, RingStore, TranscriptStore
from macula.store.base import DAY_MS
from macula.store.rings import DEFAULT_BOUNDS as RINGS_DEFAULT
from macula.store.transcript import DEFAULT_BOUNDS as TRANSCRIPT_DEFAULT
from macula.wire.identity import Identity
from support.running import run

T = TypeVar("T")
NOW = 1_767_225_600_000
ALICE = bytes(range(1, 33))
LOBBY = "agents.lobby"
ROOM = "agents.room.0123456789abcdef0123456789abcdef"


async def say(transcript: TranscriptStore, message_id: str, room: str, at: int) -> bool:
    return await transcript.record(
        room_topic=room,
        message_id=message_id,
        from_hex=ALICE.hex(),
        kind="remark_made",
        sent_at=at,
        received_ms=at,
        envelope=json.dumps({"message_id": message_id}),
    )


def rows(path: Path, table: str) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_defaults_and_bad_bounds() -> None:
    assert (TRANSCRIPT_DEFAULT.max_rows, TRANSCRIPT_DEFAULT.max_age_ms) == (10_000, 30 * DAY_MS)
    assert (RINGS_DEFAULT.max_rows, RINGS_DEFAULT.max_age_ms) == (10_000, 30 * DAY_MS)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="max_rows"):
            Bounds(max_rows=bad, max_age_ms=1)  # type: ignore[arg-type]


def test_a_flooded_room_keeps_its_newest_rows_and_other_rooms_are_untouched(
    tmp_path: Path,
) -> None:
    """A hostile sender floods the lobby, with sender clocks far in the future; the room stays
    within its bound plus one prune interval, keeps what arrived last, and a quiet room
    (an honest conversation) loses nothing."""

    async def main() -> None:
        path = tmp_path / "t.sqlite3"
        async with await TranscriptStore.open(path) as transcript:
            transcript.bounds = Bounds(max_rows=50, max_age_ms=DAY_MS, prune_every=10, batch=64)
            for i in range(5):
                assert await say(transcript, f"honest{i}", ROOM, NOW + i)
            for i in range(500):
                await transcript.record(
                    room_topic=LOBBY,
                    message_id=f"flood{i}",
                    from_hex=ALICE.hex(),
                    kind="remark_made",
                    sent_at=NOW + 10**12,  # a lying clock cannot keep a message in
                    received_ms=NOW + i,
                    envelope="{}",
                )
                assert rows(path, "messages") <= 5 + 50 + 10
            kept = [m.message_id for m in await transcript.messages(LOBBY, limit=1000)]
            assert kept[-1] == "flood499" and "flood0" not in kept
            assert len(kept) <= 60
            honest = [m.message_id for m in await transcript.messages(ROOM)]
            assert honest == [f"honest{i}" for i in range(5)]
            await transcript.prune(NOW + 500)
            assert len(await transcript.messages(LOBBY, limit=1000)) == 50

    run(main())


def test_transcript_age_bound_and_bounded_work(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "t.sqlite3"
        async with await TranscriptStore.open(path) as transcript:
            transcript.bounds = Bounds(max_rows=1000, max_age_ms=DAY_MS, prune_every=1000, batch=7)
            for i in range(20):
                await say(transcript, f"old{i}", ROOM, NOW)
            await say(transcript, "fresh", ROOM, NOW + DAY_MS)
            assert await transcript.prune(NOW + DAY_MS + 1) == 7  # at most one batch per prune
            assert await transcript.prune(NOW + DAY_MS + 1) == 7
            assert await transcript.prune(NOW + DAY_MS + 1) == 6
            assert [m.message_id for m in await transcript.messages(ROOM)] == ["fresh"]

    run(main())


def test_public_rooms_seen_are_bounded(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            transcript.bounds = Bounds(max_rows=3, max_age_ms=DAY_MS)
            for i in range(10):
                await transcript.note_public_room(f"agents.room.{i}", ALICE.hex(), None, NOW + i)
            await transcript.prune(NOW + 10)
            seen = [r.room_topic for r in await transcript.seen_rooms()]
            assert seen == ["agents.room.9", "agents.room.8", "agents.room.7"]

    run(main())


def test_rings_are_bounded_and_live_ones_go_last(tmp_path: Path) -> None:
    """Many callers ring: the table stays within its bound; settled rings go before pending
    ones, and a pending ring from an honest caller placed last survives."""

    async def main() -> None:
        path = tmp_path / "rings.sqlite3"
        async with await RingStore.open(path) as rings:
            rings.bounds = Bounds(max_rows=20, max_age_ms=DAY_MS, prune_every=5, batch=100)
            for i in range(10):
                await rings.add(f"settled{i}", "incoming", ALICE, NOW + i, answer=2)
            for i in range(100):
                peer = i.to_bytes(32, "big")
                assert await rings.add(f"spam{i}", "incoming", peer, NOW + 100 + i) == "added"
                assert rows(path, "rings") <= 20 + 5
            await rings.add("honest", "incoming", ALICE, NOW + 300)
            await rings.prune(NOW + 300)
            assert rows(path, "rings") == 20
            assert await rings.get("settled9") is None
            honest = await rings.get("honest", NOW + 301)
            assert honest is not None and honest.state == "pending"

    run(main())


def test_settled_rings_age_out_and_live_pending_ones_stay(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            rings.bounds = Bounds(max_rows=100, max_age_ms=DAY_MS)
            await rings.add("old", "outgoing", ALICE, NOW, answer=1)
            await rings.add("live", "incoming", ALICE, NOW, expires_ms=NOW + 3 * DAY_MS)
            await rings.add("recent", "outgoing", ALICE, NOW + DAY_MS, answer=2)
            assert await rings.prune(NOW + DAY_MS + 1) == 1
            assert await rings.get("old") is None
            assert await rings.get("live") is not None and await rings.get("recent") is not None

    run(main())


def test_bounds_from_the_environment(tmp_path: Path) -> None:
    env = {"MACULA_HOME": str(tmp_path)}
    settings = AgentSettings.from_env(env)
    assert settings.transcript_bounds == TRANSCRIPT_DEFAULT
    assert settings.rings_bounds == RINGS_DEFAULT
    settings = AgentSettings.from_env(
        env
        | {
            "MACULA_MCP_TRANSCRIPT_MAX_ROWS": "500",
            "MACULA_MCP_TRANSCRIPT_MAX_AGE_DAYS": "7",
            "MACULA_MCP_RINGS_MAX_ROWS": " 40 ",
            "MACULA_MCP_RINGS_MAX_AGE_DAYS": "2",
        }
    )
    assert (settings.transcript_bounds.max_rows, settings.transcript_bounds.max_age_ms) == (
        500,
        7 * DAY_MS,
    )
    assert (settings.rings_bounds.max_rows, settings.rings_bounds.max_age_ms) == (40, 2 * DAY_MS)
    for name in (
        "MACULA_MCP_TRANSCRIPT_MAX_ROWS",
        "MACULA_MCP_TRANSCRIPT_MAX_AGE_DAYS",
        "MACULA_MCP_RINGS_MAX_ROWS",
        "MACULA_MCP_RINGS_MAX_AGE_DAYS",
    ):
        for bad in ("0", "-3", "ten", "", "1.5"):
            with pytest.raises(ConfigError, match=name):
                AgentSettings.from_env(env | {name: bad})


def test_the_agent_bounds_its_stores_and_prunes_on_opening(tmp_path: Path) -> None:
    settings = AgentSettings.from_env({"MACULA_HOME": str(tmp_path)})
    settings = dataclasses.replace(
        settings,
        transcript_bounds=Bounds(max_rows=3, max_age_ms=DAY_MS),
        rings_bounds=Bounds(max_rows=2, max_age_ms=DAY_MS),
    )
    node = cast(Node, SimpleNamespace(identity=Identity.generate(os.urandom), dht=None))

    async def main() -> None:
        async with await TranscriptStore.open(settings.paths.transcript) as transcript:
            for i in range(10):
                await say(transcript, f"m{i}", ROOM, NOW + i * DAY_MS // 4)
        async with await RingStore.open(settings.paths.rings) as rings:
            for i in range(5):
                await rings.add(f"r{i}", "outgoing", ALICE, NOW + i, answer=1)
        async with Agent(node, settings, clock=lambda: NOW + 3 * DAY_MS) as agent:
            assert agent.rooms.transcript.bounds == settings.transcript_bounds
            kept = [m.message_id for m in await agent.rooms.transcript.messages(ROOM)]
            assert kept == ["m8", "m9"]  # older than a day before the clock: gone
        assert rows(settings.paths.rings, "rings") == 0  # settled and older than a day

    run(main())
