"""Content across stations: a miss asks linked stations (a fake ``ask_peers`` here), verifies,
caches; a get carrying ``hops_remaining`` never asks anyone (relay.federation.content).

Real SQLite files under ``tmp_path``; coroutines run with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from macula.wire.codes import ErrorCode
from macula.wire.content import Manifest, raw_mcid
from macula.wire.identity import Identity
from relay.builtins.procedures import Builtins
from relay.core.actions import StationReplied
from relay.federation.content import AskPeers, peer_asker
from relay.federation.content_hops import HOPS_REMAINING, hops_refusal
from relay.stores.limits import StoreLimits
from relay.stores.records import ContentStore, RecordStore

NOW_MS = 1_767_225_600_000
STATION = Identity(bytes(range(100, 132)))
BLOCK = b"a block that lives on another station"
MCID = raw_mcid(BLOCK)


class FakePeers:
    """``ask_peers``: answers the given payloads in order and records what it was asked."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, dict[str, object]]] = []

    async def __call__(self, procedure: str, args: Mapping[str, object]) -> list[object]:
        self.asked.append((procedure, dict(args)))
        return list(self.answers)


def with_builtins(
    tmp_path: Path,
    peers: FakePeers,
    body: Callable[[Builtins], Awaitable[None]],
    limits: StoreLimits | None = None,
) -> None:
    async def main() -> None:
        records = await RecordStore.open(tmp_path / "records.sqlite3")
        content = await ContentStore.open(tmp_path / "content.sqlite3")
        try:
            builtins = Builtins(
                records, content, station_id=STATION.node_id, ask_peers=peers, limits=limits
            )
            await body(builtins)
        finally:
            await records.close()
            await content.close()

    asyncio.run(main())


async def get(builtins: Builtins, procedure: str, payload: object) -> object:
    outcome = await builtins.run(procedure, payload, NOW_MS, NOW_MS * 1000)
    assert not outcome.is_error, outcome
    return outcome.payload


def test_a_missing_block_is_fetched_verified_and_cached(tmp_path: Path) -> None:
    peers = FakePeers("not_found", BLOCK)

    async def body(b: Builtins) -> None:
        assert await get(b, "_content.get_block", {"mcid": MCID.to_bytes()}) == BLOCK
        assert peers.asked == [("_content.get_block", {"mcid": MCID.to_bytes()})]
        assert b.stats["peer_content_fetched"] == 1
        peers.answers = []  # the second get is served from the local cache
        assert await get(b, "_content.get_block", {"mcid": MCID.to_bytes()}) == BLOCK
        assert len(peers.asked) == 1
        assert await b.content.get_block(MCID.digest) == BLOCK

    with_builtins(tmp_path, peers, body)


def test_a_lying_peer_is_ignored_and_counted(tmp_path: Path) -> None:
    peers = FakePeers(b"not the block", 42, BLOCK)

    async def body(b: Builtins) -> None:
        assert await get(b, "_content.get_block", {"mcid": MCID.to_bytes()}) == BLOCK
        assert b.stats["peer_content_mismatch"] == 2
        peers.answers = [b"only liars"]
        other = raw_mcid(b"another block")
        assert await get(b, "_content.get_block", {"mcid": other.to_bytes()}) == "not_found"
        assert await b.content.get_block(other.digest) is None
        assert b.stats["peer_content_mismatch"] == 3

    with_builtins(tmp_path, peers, body)


def test_a_get_with_hops_remaining_never_asks_peers(tmp_path: Path) -> None:
    peers = FakePeers(BLOCK)

    async def body(b: Builtins) -> None:
        args = {"mcid": MCID.to_bytes(), HOPS_REMAINING: 0}
        assert await get(b, "_content.get_block", args) == "not_found"
        assert peers.asked == []
        outcome = await b.run(
            "_content.get_block", {"mcid": MCID.to_bytes(), HOPS_REMAINING: 2}, NOW_MS, 0
        )
        assert outcome.code == ErrorCode.UNKNOWN_ERROR
        assert outcome.detail is not None and HOPS_REMAINING.encode() in outcome.detail
        assert peers.asked == []

    with_builtins(tmp_path, peers, body)


def test_a_full_store_still_returns_the_fetched_block(tmp_path: Path) -> None:
    peers = FakePeers(BLOCK)
    limits = StoreLimits(content_bytes_total=8, content_keep_ms=10**9)

    async def body(b: Builtins) -> None:
        assert await get(b, "_content.get_block", {"mcid": MCID.to_bytes()}) == BLOCK
        assert b.stats["peer_content_not_cached"] == 1
        assert await b.content.get_block(MCID.digest) is None

    with_builtins(tmp_path, peers, body, limits)


def test_a_missing_manifest_is_fetched_only_if_it_verifies(tmp_path: Path) -> None:
    manifest = Manifest.create(b"x" * 1000, "doc", created=NOW_MS // 1000)
    wrong = Manifest.create(b"y" * 1000, "doc", created=NOW_MS // 1000)
    peers = FakePeers(wrong.to_wire(), {"garbage": 1}, manifest.to_wire())

    async def body(b: Builtins) -> None:
        args = {"mcid": manifest.mcid.to_bytes()}
        assert await get(b, "_content.get_manifest", args) == manifest.to_wire()
        assert b.stats["peer_content_mismatch"] == 2
        stored = await b.content.get_manifest(manifest.mcid.digest)
        assert stored is not None and stored.mcid == manifest.mcid

    with_builtins(tmp_path, peers, body)


def test_without_ask_peers_a_miss_is_not_found(tmp_path: Path) -> None:
    async def main() -> None:
        records = await RecordStore.open(tmp_path / "r.sqlite3")
        content = await ContentStore.open(tmp_path / "c.sqlite3")
        try:
            b = Builtins(records, content, station_id=STATION.node_id)
            assert await get(b, "_content.get_block", {"mcid": MCID.to_bytes()}) == "not_found"
        finally:
            await records.close()
            await content.close()

    asyncio.run(main())


def test_hops_rules_client_may_not_set_it_station_must_set_zero() -> None:
    assert hops_refusal("_content.get_block", {"mcid": b""}, from_station=False) is None
    assert hops_refusal("_content.get_block", {HOPS_REMAINING: 0}, from_station=False)
    assert hops_refusal("_content.get_block", {HOPS_REMAINING: 0}, from_station=True) is None
    assert hops_refusal("_content.get_block", {"mcid": b""}, from_station=True)
    assert hops_refusal("_content.get_manifest", {HOPS_REMAINING: True}, from_station=True)
    assert hops_refusal("_dht.find_record", {HOPS_REMAINING: 5}, from_station=False) is None


def test_peer_asker_asks_at_most_fanout_stations_with_hops_zero() -> None:
    called: list[tuple[bytes, str, object, float]] = []

    async def call_station(
        node_id: bytes, procedure: str, payload: object, timeout_s: float
    ) -> StationReplied:
        called.append((node_id, procedure, payload, timeout_s))
        ok = node_id != b"b"
        return StationReplied(node_id, ok, node_id if ok else None, None if ok else 7)

    async def ask(asker: AskPeers, args: Mapping[str, object]) -> list[object]:
        return await asker("_content.get_block", args)

    asker = peer_asker(lambda: [b"a", b"b", b"c", b"d"], call_station, fanout=3, timeout_s=1.5)
    answers = asyncio.run(ask(asker, {"mcid": b"m"}))
    assert answers == [b"a", b"c"]
    assert [c[0] for c in called] == [b"a", b"b", b"c"]
    assert all(c[2] == {"mcid": b"m", HOPS_REMAINING: 0} and c[3] == 1.5 for c in called)
    nobody = peer_asker(list, call_station, fanout=3, timeout_s=1)
    assert asyncio.run(ask(nobody, {})) == []
