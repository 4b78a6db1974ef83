"""The station's disk bounds (issue 11): DHT record caps, record clocks, the content cap, bounded
find replies. Each hostile input is refused or bounded, and an honest signer beside it is not.

Real SQLite files under ``tmp_path``; coroutines run with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.content import Manifest, Mcid, assemble, digest, plan_put, raw_mcid, verify_block
from macula.wire.identity import Identity
from macula.wire.records import (
    DEFAULT_TTL_MS,
    Record,
    RecordType,
    new_record,
    record_version,
)
from relay.builtins.procedures import Builtins, Outcome
from relay.ops.cli import build_parser, config_from_args
from relay.stores.content import ContentStore
from relay.stores.limits import MIB, QuotaExceeded
from relay.stores.records import RecordStore, StoreLimits

NOW = 1767225600000
STATION = Identity(bytes(range(100, 132)))
ALICE = Identity(bytes(range(1, 33)))
BOB = Identity(bytes(range(33, 65)))
MALLORY = Identity(bytes(range(65, 97)))
BAD = ErrorCode.UNKNOWN_ERROR
HOUR = 3_600_000


@dataclasses.dataclass
class Station:
    records: RecordStore
    content: ContentStore
    builtins: Builtins

    async def call(self, procedure: str, payload: object, now_ms: int = NOW) -> Outcome:
        return await self.builtins.run(procedure, payload, now_ms, now_ms * 1000)

    async def put(self, record: Record, now_ms: int = NOW) -> Outcome:
        return await self.call("_dht.put_record", record.to_rpc(), now_ms)


def with_station(
    tmp_path: Path,
    body: Callable[[Station], Awaitable[None]],
    skew_ms: int = 300_000,
    **limits: Any,
) -> None:
    async def main() -> None:
        records = await RecordStore.open(tmp_path / "records.sqlite3")
        content = await ContentStore.open(tmp_path / "content.sqlite3")
        builtins = Builtins(
            records,
            content,
            station_id=STATION.node_id,
            limits=StoreLimits(**limits),
            max_clock_skew_ms=skew_ms,
        )
        try:
            await body(Station(records, content, builtins))
        finally:
            await records.close()
            await content.close()

    asyncio.run(main())


def advert(who: Identity, uri: str, created: int = NOW, ttl_ms: int = HOUR, pad: int = 0) -> Record:
    payload: dict[str, Any] = {
        "procedure_uri": uri,
        "advertiser_node": who.node_id,
        "serving_station": bytes(32),
    }
    if pad:
        payload["session_token_hint"] = "x" * pad
    version = record_version(created, created.to_bytes(10, "big"))
    return new_record(
        who, RecordType.PROCEDURE_ADVERTISEMENT, payload, now_ms=created, version=version,
        ttl_ms=ttl_ms,
    )  # fmt: skip


def assert_refused(outcome: Outcome, reason: bytes) -> None:
    assert outcome.code == BAD, outcome
    assert outcome.detail is not None and outcome.detail.startswith(reason + b": "), outcome


def assert_ok(outcome: Outcome) -> None:
    assert not outcome.is_error, outcome
    assert outcome.payload == "ok"


# --- record caps ------------------------------------------------------------------------------


def test_a_signer_over_its_record_count_is_refused_and_others_are_not(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        mine = [advert(MALLORY, f"m.n{i}_v1") for i in range(3)]
        for record in mine:
            assert_ok(await s.put(record))
        extra = advert(MALLORY, "m.extra_v1")
        assert_refused(await s.put(extra), b"quota_exceeded")
        assert await s.records.find(extra.storage_key(), NOW) == []
        assert await s.records.count() == 3
        assert s.builtins.stats["record_quota"] == 1
        # at its cap a signer may still replace what it holds, and retry a put
        assert_ok(await s.put(advert(MALLORY, "m.n0_v1", created=NOW + 1)))
        assert_ok(await s.put(mine[1]))
        # an honest signer is unaffected
        assert_ok(await s.put(advert(ALICE, "m.extra_v1")))
        assert [r.key for r in await s.records.find(extra.storage_key(), NOW)] == [ALICE.node_id]

    with_station(tmp_path, body, records_per_signer=3)


def test_expired_records_do_not_count_against_their_signer(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        assert_ok(await s.put(advert(ALICE, "a.one_v1", ttl_ms=1000)))
        assert_refused(await s.put(advert(ALICE, "a.two_v1")), b"quota_exceeded")
        assert_ok(await s.put(advert(ALICE, "a.two_v1", created=NOW + 1000), NOW + 1000))

    with_station(tmp_path, body, records_per_signer=1)


def test_a_signer_over_its_record_bytes_is_refused(tmp_path: Path) -> None:
    small = advert(ALICE, "a.small_v1")
    size = len(cbor.encode(small.to_rpc()))

    async def body(s: Station) -> None:
        assert_ok(await s.put(small))
        assert_ok(await s.put(advert(ALICE, "a.other_v1")))
        big = advert(ALICE, "a.big_v1", pad=size)
        outcome = await s.put(big)
        assert_refused(outcome, b"quota_exceeded")
        assert outcome.detail is not None and b"this signer" in outcome.detail
        assert await s.records.find(big.storage_key(), NOW) == []
        # replacing a record within the cap is fine; growing past it is not
        assert_ok(await s.put(advert(ALICE, "a.small_v1", created=NOW + 1, pad=40)))
        grown = advert(ALICE, "a.small_v1", created=NOW + 2, pad=200)
        assert_refused(await s.put(grown), b"quota_exceeded")
        assert await s.records.find(small.storage_key(), NOW) != [grown]
        assert_ok(await s.put(advert(BOB, "a.big_v1", pad=size)))

    with_station(tmp_path, body, record_bytes_per_signer=2 * size + 100)


def test_the_station_wide_record_count(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        for i in range(2):
            assert_ok(await s.put(advert(MALLORY, f"m.n{i}_v1", ttl_ms=1000)))
        assert_ok(await s.put(advert(ALICE, "a.one_v1")))
        # the signer's cap is checked first and stops MALLORY before the station is full
        assert_refused(await s.put(advert(MALLORY, "m.n2_v1")), b"quota_exceeded")
        assert_ok(await s.put(advert(BOB, "b.one_v1")))
        outcome = await s.put(advert(BOB, "b.two_v1"))
        assert_refused(outcome, b"quota_exceeded")
        assert outcome.detail is not None and b"the station holds" in outcome.detail
        assert await s.records.count() == 4
        # expired rows are reaped to make room
        later = NOW + 1000
        assert_ok(await s.put(advert(BOB, "b.two_v1", created=later), later))
        assert await s.records.count() == 3

    with_station(tmp_path, body, records_per_signer=2, records_total=4)


def test_the_station_wide_record_bytes(tmp_path: Path) -> None:
    one = advert(ALICE, "a.one_v1")
    size = len(cbor.encode(one.to_rpc()))

    async def body(s: Station) -> None:
        assert_ok(await s.put(one))
        assert_ok(await s.put(advert(BOB, "b.one_v1")))
        assert_refused(await s.put(advert(MALLORY, "m.one_v1")), b"quota_exceeded")
        assert await s.records.count() == 2

    with_station(tmp_path, body, record_bytes_total=2 * size + 10)


def test_the_stations_own_puts_are_not_bounded(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RecordStore.open(tmp_path / "r.sqlite3") as records:
            limits = StoreLimits(records_per_signer=1, records_total=1)
            one, two = advert(STATION, "s.one_v1"), advert(STATION, "s.two_v1")
            assert await records.put(one, one.storage_key(), NOW, limits) == "stored"
            with pytest.raises(QuotaExceeded):
                await records.put(two, two.storage_key(), NOW, limits)
            assert await records.put(two, two.storage_key(), NOW) == "stored"
            assert await records.count() == 2

    asyncio.run(main())


def test_concurrent_puts_cannot_pass_the_cap_together(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        puts = [s.put(advert(MALLORY, f"m.n{i}_v1")) for i in range(20)]
        outcomes = await asyncio.gather(*puts)
        assert sum(not o.is_error for o in outcomes) == 5
        assert await s.records.count() == 5

    with_station(tmp_path, body, records_per_signer=5)


# --- record clocks ----------------------------------------------------------------------------


def test_created_at_beyond_the_skew_bound_is_refused(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        ahead = advert(MALLORY, "m.future_v1", created=NOW + 300_001)
        assert_refused(await s.put(ahead), b"clock_skew")
        assert await s.records.count() == 0
        assert_ok(await s.put(advert(ALICE, "a.fast_clock_v1", created=NOW + 300_000)))

    with_station(tmp_path, body)


def test_a_skew_bound_of_0_still_bounds_record_clocks(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        assert_refused(await s.put(advert(MALLORY, "m.v1", created=NOW + 10 * HOUR)), b"clock_skew")
        assert_ok(await s.put(advert(ALICE, "a.v1", created=NOW + 1000)))

    with_station(tmp_path, body, skew_ms=0)


def test_a_lifetime_over_the_maximum_ttl_is_refused(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        forever = advert(MALLORY, "m.forever_v1", ttl_ms=DEFAULT_TTL_MS + 1)
        assert_refused(await s.put(forever), b"ttl_too_long")
        assert await s.records.count() == 0
        # §10.7's defaults pass: 48 h for most types, 5 min for station_endpoint
        assert_ok(await s.put(advert(ALICE, "a.default_v1", ttl_ms=DEFAULT_TTL_MS)))
        endpoint = new_record(
            BOB, RecordType.STATION_ENDPOINT, {"quic_port": 4433}, now_ms=NOW,
            version=record_version(NOW, bytes(10)),
        )  # fmt: skip
        assert_ok(await s.put(endpoint))

    with_station(tmp_path, body)


def test_the_maximum_ttl_is_configurable(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        assert_refused(await s.put(advert(ALICE, "a.v1", ttl_ms=HOUR + 1)), b"ttl_too_long")
        assert_ok(await s.put(advert(ALICE, "a.v1", ttl_ms=HOUR)))

    with_station(tmp_path, body, max_record_ttl_ms=HOUR)


# --- bounded find replies ---------------------------------------------------------------------


def _signers(n: int) -> list[Identity]:
    return [Identity(i.to_bytes(2, "big") * 16) for i in range(1, n + 1)]


def test_find_records_answers_the_newest_within_the_byte_bound(tmp_path: Path) -> None:
    uri = "org.example.crowded_v1"
    crowd = [advert(who, uri, created=NOW + i, pad=2000) for i, who in enumerate(_signers(12))]
    key = crowd[0].storage_key()
    bound = 10_000

    async def body(s: Station) -> None:
        for record in crowd:
            assert_ok(await s.put(record, NOW + 20))
        outcome = await s.call("_dht.find_records", {"key": key}, NOW + 20)
        assert isinstance(outcome.payload, list)  # §6.6: still a plain array
        assert len(cbor.encode(outcome.payload)) <= bound
        newest = [r.to_rpc() for r in reversed(crowd)]
        assert outcome.payload == newest[: len(outcome.payload)]
        assert 0 < len(outcome.payload) < len(crowd)
        assert s.builtins.stats["find_truncated"] == 1
        # under the bound nothing is cut and nothing is counted
        one = await s.call("_dht.find_records", {"key": advert(ALICE, "x_v1").storage_key()})
        assert one.payload == []
        assert s.builtins.stats["find_truncated"] == 1

    with_station(tmp_path, body, max_find_reply_bytes=bound)


def test_find_records_by_type_is_bounded_by_count_and_bytes(tmp_path: Path) -> None:
    records = [advert(ALICE, f"a.n{i}_v1", created=NOW + i, pad=1000) for i in range(8)]

    async def body(s: Station) -> None:
        for record in records:
            assert_ok(await s.put(record, NOW + 10))
        found = await s.call("_dht.find_records_by_type", {"type": 6}, NOW + 10)
        assert found.payload == [r.to_rpc() for r in records[::-1][:3]]
        assert s.builtins.stats["find_truncated"] == 1

    with_station(tmp_path, body, max_find_by_type=3)

    async def small(s: Station) -> None:
        for record in records:
            assert_ok(await s.put(record, NOW + 10))
        found = await s.call("_dht.find_records_by_type", {"type": 6}, NOW + 10)
        assert isinstance(found.payload, list)
        assert len(cbor.encode(found.payload)) <= 3000
        assert found.payload == [r.to_rpc() for r in records[::-1][: len(found.payload)]]
        assert len(found.payload) == 2

    with_station(tmp_path / "small", small, max_find_reply_bytes=3000)


def test_bounded_reads_use_covering_indexes(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RecordStore.open(tmp_path / "r.sqlite3"):
            pass
        with sqlite3.connect(tmp_path / "r.sqlite3") as raw:
            for column, index in (("storage_key", "records_by_key"), ("type", "records_by_type")):
                plan = raw.execute(
                    "EXPLAIN QUERY PLAN SELECT storage_key, signer, recency, size FROM records"
                    f" WHERE {column} = ? AND expires_at > ? ORDER BY recency DESC",
                    (b"k", 0),
                ).fetchall()
                assert any(f"COVERING INDEX {index}" in str(row) for row in plan), plan

    asyncio.run(main())


# --- content ----------------------------------------------------------------------------------


def block(n: int, size: int = 1000) -> bytes:
    return n.to_bytes(4, "big") * (size // 4)


async def put_block(s: Station, data: bytes, now_ms: int) -> Outcome:
    mcid = raw_mcid(data).to_bytes()
    return await s.call("_content.put_block", {"mcid": mcid, "payload": data}, now_ms)


async def get_block(s: Station, data: bytes, now_ms: int) -> object:
    mcid = raw_mcid(data).to_bytes()
    return (await s.call("_content.get_block", {"mcid": mcid}, now_ms)).payload


def test_content_collects_the_least_recently_used(tmp_path: Path) -> None:
    a, b, c, d = (block(i) for i in range(4))

    async def body(s: Station) -> None:
        for i, data in enumerate((a, b, c)):
            assert_ok(await put_block(s, data, NOW + i))
        assert await get_block(s, a, NOW + 10) == a  # a is used again: b is now the oldest
        assert_ok(await put_block(s, d, NOW + 20))
        assert await get_block(s, b, NOW + 30) == "not_found"
        for data in (a, c, d):
            assert await get_block(s, data, NOW + 30) == data
        assert await s.content.held() <= 3000

    with_station(tmp_path, body, content_bytes_total=3000, content_keep_ms=0)


def test_content_used_recently_is_kept_and_the_put_refused(tmp_path: Path) -> None:
    a, b, c = (block(i) for i in range(3))

    async def body(s: Station) -> None:
        assert_ok(await put_block(s, a, NOW))
        assert_ok(await put_block(s, b, NOW + 1))
        outcome = await put_block(s, c, NOW + 500)
        assert_refused(outcome, b"quota_exceeded")
        assert s.builtins.stats["content_quota"] == 1
        assert await get_block(s, c, NOW + 500) == "not_found"
        assert await get_block(s, a, NOW + 500) == a  # unchanged: nothing was collected
        assert await get_block(s, b, NOW + 501) == b
        # once a is older than the keep window (its get at +500 counts), it goes first
        assert_ok(await put_block(s, c, NOW + 1600))
        assert await get_block(s, a, NOW + 1600) == "not_found"
        assert await get_block(s, b, NOW + 1600) == b

    with_station(tmp_path, body, content_bytes_total=2000, content_keep_ms=1000)


def test_a_block_bigger_than_the_whole_store_is_refused(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        assert_refused(await put_block(s, block(1, 2000), NOW), b"quota_exceeded")
        assert_ok(await put_block(s, block(2, 1000), NOW))

    with_station(tmp_path, body, content_bytes_total=1500, content_keep_ms=0)


def test_an_idempotent_put_at_the_cap_is_ok(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        assert_ok(await put_block(s, block(1), NOW))
        assert_ok(await put_block(s, block(1), NOW + 1))
        assert await s.content.held() == 1000

    with_station(tmp_path, body, content_bytes_total=1000, content_keep_ms=60_000)


async def put_file(s: Station, data: bytes, now_ms: int) -> Mcid:
    plan = plan_put(data, "f.bin", created=now_ms // 1000)
    for mcid, view in plan.blocks:
        put = {"mcid": mcid.to_bytes(), "payload": bytes(view)}
        assert_ok(await s.call("_content.put_block", put, now_ms))
    assert plan.manifest is not None
    manifest = {"manifest": plan.manifest.to_wire()}
    assert_ok(await s.call("_content.put_manifest", manifest, now_ms))
    return plan.mcid


async def get_manifest(s: Station, mcid: Mcid, now_ms: int) -> Manifest:
    got = await s.call("_content.get_manifest", {"mcid": mcid.to_bytes()}, now_ms)
    return Manifest.from_wire(got.payload)


def test_an_honest_transfer_survives_a_flood(tmp_path: Path) -> None:
    """A put, then a slow get, while another client floods the store with blocks."""
    data = bytes(range(256)) * 3000  # 768,000 bytes: three chunks
    keep = 60_000
    limits = {"content_bytes_total": 2 * MIB, "content_keep_ms": keep}

    async def flood(s: Station, start: int, now_ms: int) -> int:
        refused = 0
        for i in range(start, start + 8):
            outcome = await put_block(s, block(i, 256 * 1024), now_ms)
            refused += int(outcome.is_error)
        return refused

    async def body(s: Station) -> None:
        mcid = await put_file(s, data, NOW)
        assert await flood(s, 0, NOW + 1000) > 0  # the store is full of recent content
        manifest = await get_manifest(s, mcid, NOW + keep - 1000)  # marks its chunks used
        assert await flood(s, 100, NOW + keep + 5000) > 0  # collects the flood, not the file
        blocks = []
        for info in manifest.chunks:
            got = await s.call("_content.get_block", {"mcid": info.mcid.to_bytes()}, NOW + keep)
            assert isinstance(got.payload, bytes), got
            verify_block(info.mcid, got.payload)
            blocks.append(got.payload)
        assert assemble(manifest, blocks) == data
        assert await s.content.held() <= 2 * MIB

    with_station(tmp_path, body, **limits)


def test_manifests_count_against_the_content_cap(tmp_path: Path) -> None:
    data = bytes(300_000)

    async def body(s: Station) -> None:
        await put_file(s, data, NOW)
        stats = await s.content.stats()
        assert await s.content.held() > stats.bytes  # the manifest's bytes are counted too

    with_station(tmp_path, body)


# --- migration --------------------------------------------------------------------------------


def test_version_1_files_migrate_with_their_rows_counted(tmp_path: Path) -> None:
    from relay.stores.content import _CONTENT_V1
    from relay.stores.records import _RECORDS_V1

    one = advert(ALICE, "a.one_v1")
    rpc_body = cbor.encode(one.to_rpc())
    data = b"old block"
    with sqlite3.connect(tmp_path / "records.sqlite3") as raw:
        for statement in _RECORDS_V1:
            raw.execute(statement)
        raw.execute(
            "INSERT INTO records VALUES (?, ?, 6, ?, ?, ?, ?)",
            (one.storage_key(), ALICE.node_id, NOW, NOW + HOUR, b"\0" * 24, rpc_body),
        )
        raw.execute("PRAGMA user_version = 1")
    with sqlite3.connect(tmp_path / "content.sqlite3") as raw:
        for statement in _CONTENT_V1:
            raw.execute(statement)
        raw.execute("INSERT INTO blocks VALUES (?, ?, ?)", (digest(data), len(data), data))
        raw.execute("PRAGMA user_version = 1")

    async def body(s: Station) -> None:
        assert await s.records.schema_version() == 2
        assert await s.records.find(one.storage_key(), NOW) == [one]
        assert_refused(await s.put(advert(ALICE, "a.two_v1")), b"quota_exceeded")
        assert await s.content.held() == len(data)
        assert await get_block(s, data, NOW) == data

    with_station(tmp_path, body, records_per_signer=1)


# --- configuration ----------------------------------------------------------------------------


def test_limits_have_flags() -> None:
    args = build_parser().parse_args(
        [
            "--max-records-per-signer", "7", "--max-record-bytes-per-signer", "8",
            "--max-records", "9", "--max-record-bytes", "10", "--max-record-ttl-ms", "11",
            "--max-content-bytes", "12", "--content-keep-ms", "0",
            "--max-find-reply-bytes", "13", "--max-find-by-type", "14",
        ]
    )  # fmt: skip
    assert config_from_args(args).store_limits == StoreLimits(7, 8, 9, 10, 11, 12, 0, 13, 14)
    assert config_from_args(build_parser().parse_args([])).store_limits == StoreLimits()
    with pytest.raises(SystemExit):
        config_from_args(build_parser().parse_args(["--content-keep-ms", "-1"]))
    with pytest.raises(ValueError):
        StoreLimits(records_total=0)
