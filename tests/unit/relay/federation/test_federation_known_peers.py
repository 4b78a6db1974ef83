"""Known peer stations on disk (relay.federation.known_peers) and how the link manager uses
them after a restart (kept until discovery names another station)."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from relay.federation.known_peers import FILE_NAME, MAX_FILE_BYTES, KnownPeers
from relay.federation.links import LinkManager, LinkTarget

ME = bytes([1]) * 32
P1, P2, P3 = (LinkTarget(bytes([n]) * 32, "127.0.0.1", 4000 + n) for n in (2, 3, 4))


def known(tmp_path: Path, max_count: int = 8, now: list[int] | None = None) -> KnownPeers:
    clock = now if now is not None else [1_000]
    return KnownPeers(tmp_path / FILE_NAME, ME, max_count=max_count, clock=lambda: clock[0])


def test_stations_seen_are_saved_privately_and_read_back_newest_first(tmp_path: Path) -> None:
    now = [1_000]
    peers = known(tmp_path, now=now)
    assert peers.load() == []  # no file yet
    assert peers.saw([P1, P2])
    now[0] = 2_000
    assert not peers.saw([P1])  # seen again, nothing new: not written (yet) ...
    assert peers.targets() == [P1, P2]  # ... but now the newest
    assert peers.saw([P3])  # a new one: written, with what was seen meanwhile
    path = tmp_path / FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not (tmp_path / (FILE_NAME + ".tmp")).exists()
    again = known(tmp_path, now=[3_000])
    assert again.load() == [P3, P1, P2]
    moved = LinkTarget(P2.node_id, "10.0.0.2", 4003)
    assert again.saw([moved])  # a station's new address is written
    assert known(tmp_path).load() == [moved, P3, P1]


def test_the_count_is_bounded_and_this_station_is_never_kept(tmp_path: Path) -> None:
    now = [0]
    peers = known(tmp_path, max_count=2, now=now)
    for target in (P1, P2, P3, LinkTarget(ME, "127.0.0.1", 1)):
        now[0] += 1
        peers.saw([target])
    assert peers.targets() == [P3, P2]
    assert known(tmp_path, max_count=2).load() == [P3, P2]
    assert known(tmp_path, max_count=1).load() == [P3]  # a smaller bound applies on read
    assert not known(tmp_path, max_count=0).saw([P1])  # 0: nothing remembered


@pytest.mark.parametrize(
    "content",
    [
        b"not json at all",
        b"\xff\xfe\x00garbage",
        b'["a", "list"]',
        b'{"version": 2, "stations": []}',
        b'{"version": 1, "stations": {"not": "a list"}}',
    ],
)
def test_a_corrupt_file_is_logged_and_ignored(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="macula.relay"):
        assert known(tmp_path).load() == []
    assert "ignored" in caplog.text


def test_an_oversized_file_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / FILE_NAME).write_bytes(b" " * (MAX_FILE_BYTES + 1))
    with caplog.at_level(logging.WARNING, logger="macula.relay"):
        assert known(tmp_path).load() == []
    assert "larger than" in caplog.text


def test_bad_entries_are_skipped_and_good_ones_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = {"node_id": P1.node_id.hex(), "host": "127.0.0.1", "quic_port": 4002, "seen_ms": 5}
    bad = [
        "a string",
        {**good, "node_id": "zz" * 32},
        {**good, "node_id": "ab"},
        {**good, "quic_port": 0},
        {**good, "quic_port": 70_000},
        {**good, "quic_port": "4002"},
        {**good, "host": ""},
        {**good, "host": "a b"},
        {**good, "host": "h" * 300},
        {**good, "seen_ms": None},
        {**good, "node_id": ME.hex()},  # this station itself
    ]
    document = {"version": 1, "stations": [*bad, good]}
    (tmp_path / FILE_NAME).write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="macula.relay"):
        assert known(tmp_path).load() == [P1]
    assert f"{len(bad)} invalid entries skipped" in caplog.text


def test_a_save_that_fails_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    peers = KnownPeers(tmp_path / "missing" / FILE_NAME, ME, max_count=4, clock=lambda: 1)
    with caplog.at_level(logging.WARNING, logger="macula.relay"):
        assert not peers.saw([P1])
    assert "could not save" in caplog.text


# --- the link manager dials them ------------------------------------------------------------


@pytest.mark.anyio
async def test_remembered_stations_are_dialled_and_kept_until_discovery_knows_the_mesh() -> None:
    dialled: list[bytes] = []
    rounds: list[Sequence[LinkTarget]] = [[], [], [P2]]  # the DHT knows nobody at first

    async def run_link(target: LinkTarget) -> None:
        dialled.append(target.node_id)
        raise ConnectionRefusedError("nothing listens there")

    async def discover() -> Sequence[LinkTarget]:
        return rounds.pop(0) if len(rounds) > 1 else rounds[0]

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(0)  # the injected sleep: one loop turn instead of the backoff

    links = LinkManager(
        ME,
        run_link=run_link,
        has_link=lambda node: False,
        remembered=[P1],
        discover=discover,
        sleep=sleep,
        jitter=lambda: 1.0,
    )
    links.start()
    for _ in range(2_000):
        if len(rounds) == 1 and P1.node_id not in links.targets:
            break
        assert len(rounds) == 1 or P1.node_id in links.targets  # kept while the DHT is empty
        await asyncio.sleep(0)  # a polled predicate, bounded in loop turns
    await links.stop()
    assert P1.node_id in dialled and P2.node_id in dialled
    assert P1.node_id not in links.targets  # dropped once discovery named another station
