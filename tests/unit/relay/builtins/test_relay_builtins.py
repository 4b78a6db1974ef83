"""The station's stores and built-in procedures (PROTOCOL.md §6.6, §10, §11, §13 #12-#15).

Real SQLite files under ``tmp_path``; coroutines run with ``asyncio.run`` (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sqlite3
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from macula.services.house import HOUSE_PROCEDURES, MEMORY_ADD
from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.content import Manifest, Mcid, assemble, digest, plan_put, raw_mcid, verify_block
from macula.wire.identity import Identity
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.builtins.procedures import (
    BUILTIN_PROCEDURES,
    MAX_BLOCK_BYTES,
    Builtins,
    Outcome,
)
from relay.stores.records import ContentStore, RecordStore, StoreError
from support.running import run
from support.vectorkit import load_vectors, typed

T = TypeVar("T")

RECORDS = load_vectors("records")
CONTENT = load_vectors("content")
PA = RECORDS["procedure_advertisement"]
SE = RECORDS["station_endpoint"]
NOW_MS = 1767225600000  # the vectors' created_at; they expire 1767398400000
NOW_US = NOW_MS * 1000 + 123
STATION = Identity(bytes(range(100, 132)))
ALICE = Identity(bytes(range(1, 33)))
BOB = Identity(bytes(range(33, 65)))
BAD = ErrorCode.UNKNOWN_ERROR


@dataclasses.dataclass
class Station:
    """The two stores and the built-ins over them, on real files in one directory."""

    directory: Path
    records: RecordStore
    content: ContentStore
    builtins: Builtins

    @classmethod
    async def open(cls, directory: Path) -> Station:
        records = await RecordStore.open(directory / "records.sqlite3")
        content = await ContentStore.open(directory / "content.sqlite3")
        return cls(
            directory, records, content, Builtins(records, content, station_id=STATION.node_id)
        )

    async def close(self) -> None:
        await self.records.close()
        await self.content.close()

    async def call(self, procedure: str, payload: object, now_ms: int = NOW_MS) -> Outcome:
        return await self.builtins.run(procedure, payload, now_ms, now_ms * 1000)


def with_station(tmp_path: Path, body: Callable[[Station], Awaitable[None]]) -> None:
    async def main() -> None:
        station = await Station.open(tmp_path / "data")
        try:
            await body(station)
        finally:
            await station.close()

    asyncio.run(main())


def assert_error(outcome: Outcome, code: int, prefix: bytes) -> None:
    assert outcome.is_error, outcome
    assert outcome.code == code
    assert outcome.detail is not None and outcome.detail.startswith(prefix), outcome.detail


def assert_result(outcome: Outcome, payload: object) -> None:
    assert not outcome.is_error, outcome
    assert outcome.payload == payload


# --- helpers: records -------------------------------------------------------------------------


def vector_record() -> dict[str, Any]:
    """The signed procedure_advertisement of records.json, RPC form."""
    rpc: dict[str, Any] = typed(PA["rpc_form"])
    return rpc


def station_endpoint_record() -> Record:
    env = typed(SE["unsigned_envelope"])
    return Record(
        env["t"], env["k"], env["v"], env["c"], env["x"], env["p"],
        signature=bytes.fromhex(SE["signature_hex"]),
    )  # fmt: skip


def advert(
    who: Identity, created: int, uri: str = "org.example.echo_v1", ttl_ms: int = 3_600_000
) -> Record:
    payload = {"procedure_uri": uri, "advertiser_node": who.node_id, "serving_station": bytes(32)}
    version = record_version(created, created.to_bytes(10, "big"))
    return new_record(
        who, RecordType.PROCEDURE_ADVERTISEMENT, payload, now_ms=created, version=version,
        ttl_ms=ttl_ms,
    )  # fmt: skip


def unchecked(who: Identity, record_type: int, payload: dict[str, Any]) -> Record:
    """A correctly signed record that ``new_record`` would refuse to build."""
    version = record_version(NOW_MS, bytes(10))
    return Record(record_type, who.node_id, version, NOW_MS, NOW_MS + 60_000, payload).signed(who)


# --- the procedure table and Outcome ----------------------------------------------------------


def test_the_nine_builtins() -> None:
    nine = {
        "_dht.put_record",
        "_dht.find_record",
        "_dht.find_records",
        "_dht.find_records_by_type",
        "_content.put_block",
        "_content.get_block",
        "_content.put_manifest",
        "_content.get_manifest",
        "_relay.ping",
    }
    assert nine == BUILTIN_PROCEDURES


def test_outcome_constructors() -> None:
    ok = Outcome.result("ok")
    assert not ok.is_error and ok.payload == "ok" and ok.code is None
    err = Outcome.error(ErrorCode.PAYLOAD_TOO_LARGE, b"x")
    assert err.is_error and err.code == 0x0D and type(err.code) is int and err.detail == b"x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ok.payload = "no"  # type: ignore[misc]


def test_builtins_refuse_a_bad_station_id(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        with pytest.raises(ValueError):
            Builtins(s.records, s.content, station_id=b"short")

    with_station(tmp_path, body)


@pytest.mark.parametrize("procedure", ["_macula.ping", "_dht.nope", "org.example.echo_v1", ""])
def test_an_unknown_procedure_is_0x01(tmp_path: Path, procedure: str) -> None:
    async def body(s: Station) -> None:
        outcome = await s.call(procedure, {})
        assert outcome.is_error and outcome.code == ErrorCode.UNKNOWN_NEXT_PEER
        assert outcome.detail is None

    with_station(tmp_path, body)


# --- _relay.ping ------------------------------------------------------------------------------


@pytest.mark.parametrize("argument", [{}, None, [], "x", b"", 7, {"anything": 1}])
def test_ping_answers_the_clock_in_microseconds(tmp_path: Path, argument: object) -> None:
    async def body(s: Station) -> None:
        outcome = await s.builtins.run("_relay.ping", argument, NOW_MS, NOW_US)
        assert_result(outcome, {"ts": NOW_US})
        assert type(outcome.payload["ts"]) is int  # type: ignore[index]
        cbor.encode(outcome.payload)  # sendable as is

    with_station(tmp_path, body)


# --- _dht.* -----------------------------------------------------------------------------------


def test_put_and_find_the_vector_record(tmp_path: Path) -> None:
    rpc = vector_record()
    key = bytes.fromhex(PA["storage_key_hex"])

    async def body(s: Station) -> None:
        assert_result(await s.call("_dht.put_record", rpc), "ok")
        assert_result(await s.call("_dht.find_record", {"key": key}), rpc)
        assert_result(await s.call("_dht.find_records", {"key": key, "extra": 1}), [rpc])
        assert_result(await s.call("_dht.find_records_by_type", {"type": 6}), [rpc])
        assert_result(await s.call("_dht.find_records_by_type", {"type": 0}), [])
        found = await s.call("_dht.find_record", {"key": key})
        Record.from_rpc(found.payload).verify(NOW_MS)  # raises if not authentic

    with_station(tmp_path, body)


def test_put_the_station_endpoint_vector(tmp_path: Path) -> None:
    record = station_endpoint_record()

    async def body(s: Station) -> None:
        assert_result(await s.call("_dht.put_record", record.to_rpc()), "ok")
        key = bytes.fromhex(SE["storage_key_hex"])
        assert_result(await s.call("_dht.find_records", {"key": key}), [record.to_rpc()])

    with_station(tmp_path, body)


def test_find_misses(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        assert_result(await s.call("_dht.find_record", {"key": bytes(32)}), "not_found")
        assert_result(await s.call("_dht.find_records", {"key": bytes(32)}), [])
        assert_result(await s.call("_dht.find_records_by_type", {"type": 255}), [])

    with_station(tmp_path, body)


@pytest.mark.parametrize("procedure", ["_dht.find_record", "_dht.find_records"])
@pytest.mark.parametrize(
    "argument",
    [None, [], "key", b"\x00" * 32, {}, {"key": bytes(31)}, {"key": bytes(33)}, {"key": "aa"},
     {"key": None}, {"k": bytes(32)}],
)  # fmt: skip
def test_find_bad_arguments(tmp_path: Path, procedure: str, argument: object) -> None:
    async def body(s: Station) -> None:
        assert_error(await s.call(procedure, argument), BAD, b"bad_request: ")

    with_station(tmp_path, body)


@pytest.mark.parametrize(
    "argument",
    [None, [], {}, {"type": -1}, {"type": 256}, {"type": "6"}, {"type": 6.0}, {"type": True},
     {"type": b"\x06"}],
)  # fmt: skip
def test_find_by_type_bad_arguments(tmp_path: Path, argument: object) -> None:
    async def body(s: Station) -> None:
        assert_error(await s.call("_dht.find_records_by_type", argument), BAD, b"bad_request: ")

    with_station(tmp_path, body)


def _drop(name: str) -> Callable[[dict[str, Any]], object]:
    return lambda rpc: {k: v for k, v in rpc.items() if k != name}


def _set(name: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda rpc: {**rpc, name: value}


@pytest.mark.parametrize(
    ("mutate", "prefix"),
    [
        (lambda rpc: [rpc], b"bad_request: "),
        (lambda rpc: "record", b"bad_request: "),
        (lambda rpc: None, b"bad_request: "),
        (_drop("signature"), b"bad_signature"),
        (_drop("key"), b"bad_signature"),
        (_set("signature", bytes(63)), b"bad_signature"),
        (_set("key", "not bytes"), b"bad_signature"),
        (_drop("type"), b"bad_request: "),
        (_drop("payload"), b"bad_request: "),
        (_drop("version"), b"bad_request: "),
        (_set("type", 0), b"bad_request: "),
        (_set("type", 300), b"bad_request: "),
        (_set("created_at", "now"), b"bad_request: "),
        (_set("payload", [1]), b"bad_request: "),
        # tampered after signing: every covered field breaks the signature
        (_set("expires_at", 1767398400001), b"bad_signature"),
        (_set("created_at", 1767225600001), b"bad_signature"),
        (_set("key", BOB.node_id), b"bad_signature"),
        (_set("signature", bytes(64)), b"bad_signature"),
    ],
)
def test_put_record_refusals(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], object], prefix: bytes
) -> None:
    async def body(s: Station) -> None:
        assert_error(await s.call("_dht.put_record", mutate(vector_record())), BAD, prefix)
        assert await s.records.count() == 0

    with_station(tmp_path, body)


def test_a_tampered_payload_is_refused(tmp_path: Path) -> None:
    rpc = vector_record()
    rpc["payload"] = {**rpc["payload"], "procedure_uri": "org.example.evil_v1"}

    async def body(s: Station) -> None:
        assert_error(await s.call("_dht.put_record", rpc), BAD, b"bad_signature")
        assert await s.records.count() == 0

    with_station(tmp_path, body)


def test_an_expired_record_is_refused(tmp_path: Path) -> None:
    later = PA["expires_at"]

    async def body(s: Station) -> None:
        assert_error(await s.call("_dht.put_record", vector_record(), later), BAD, b"expired: ")

    with_station(tmp_path, body)


def test_a_type_without_storage_rule_is_bad_request(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        for record_type in (0x02, 0x07, 0x13, 0x04):  # 0x04: its key needs the realm id
            rpc = unchecked(ALICE, record_type, {"x": 1}).to_rpc()
            assert_error(await s.call("_dht.put_record", rpc), BAD, b"bad_request: ")
        assert await s.records.count() == 0

    with_station(tmp_path, body)


def test_a_bad_payload_is_bad_request(tmp_path: Path) -> None:
    missing_uri = {"advertiser_node": ALICE.node_id, "serving_station": bytes(32)}
    wrong_kind = {"quic_port": 4433, "host_advertised": ["text, not bytes"]}

    async def body(s: Station) -> None:
        for record_type, payload in ((0x06, missing_uri), (0x12, wrong_kind)):
            rpc = unchecked(ALICE, record_type, payload).to_rpc()
            assert_error(await s.call("_dht.put_record", rpc), BAD, b"bad_request: ")
        assert await s.records.count() == 0

    with_station(tmp_path, body)


def test_a_record_over_64_kib_is_payload_too_large(tmp_path: Path) -> None:
    big = unchecked(ALICE, 0x20, {"blob": bytes(64 * 1024)})
    fits = unchecked(ALICE, 0x21, {"blob": bytes(60 * 1024)})

    async def body(s: Station) -> None:
        outcome = await s.call("_dht.put_record", big.to_rpc())
        assert_error(outcome, ErrorCode.PAYLOAD_TOO_LARGE, b"payload_too_large: ")
        assert_result(await s.call("_dht.put_record", fits.to_rpc()), "ok")

    with_station(tmp_path, body)


def test_newest_record_per_signer_wins(tmp_path: Path) -> None:
    old, new = advert(ALICE, NOW_MS - 1000), advert(ALICE, NOW_MS)
    key = old.storage_key()

    async def body(s: Station) -> None:
        assert_result(await s.call("_dht.put_record", new.to_rpc()), "ok")
        stale = await s.call("_dht.put_record", old.to_rpc())
        assert_error(stale, BAD, b"stale: ")
        assert_result(await s.call("_dht.find_records", {"key": key}), [new.to_rpc()])
        assert_result(await s.call("_dht.put_record", new.to_rpc()), "ok")  # a retry is fine
        assert await s.records.count() == 1

    with_station(tmp_path, body)


def test_a_house_procedure_advertisement_is_the_stations_alone(tmp_path: Path) -> None:
    """Issue 11: nobody but the station may announce a house procedure, in any realm."""
    forged = [advert(ALICE, NOW_MS, uri) for uri in sorted(HOUSE_PROCEDURES)]
    posing = advert(ALICE, NOW_MS, MEMORY_ADD)  # claims the station as advertiser and server
    posing = new_record(
        ALICE,
        RecordType.PROCEDURE_ADVERTISEMENT,
        posing.payload | {"advertiser_node": STATION.node_id, "serving_station": STATION.node_id},
        now_ms=NOW_MS,
        version=posing.version,
    )
    own = advert(STATION, NOW_MS, MEMORY_ADD)

    async def body(s: Station) -> None:
        for record in [*forged, posing]:
            refused = await s.call("_dht.put_record", record.to_rpc())
            assert_error(refused, BAD, b"reserved_procedure: ")
        assert await s.records.count() == 0
        assert_result(await s.call("_dht.put_record", own.to_rpc()), "ok")
        honest = advert(ALICE, NOW_MS, "org.example.echo_v1")
        assert_result(await s.call("_dht.put_record", honest.to_rpc()), "ok")

    with_station(tmp_path, body)


def test_a_newer_record_replaces_the_older(tmp_path: Path) -> None:
    old, new = advert(ALICE, NOW_MS - 1000), advert(ALICE, NOW_MS)

    async def body(s: Station) -> None:
        assert_result(await s.call("_dht.put_record", old.to_rpc()), "ok")
        assert_result(await s.call("_dht.put_record", new.to_rpc()), "ok")
        assert_result(await s.call("_dht.find_record", {"key": new.storage_key()}), new.to_rpc())
        assert await s.records.count() == 1

    with_station(tmp_path, body)


def test_same_created_at_is_ordered_by_version(tmp_path: Path) -> None:
    low = advert(ALICE, NOW_MS)
    high_version = bytes(low.version[:-1]) + bytes((low.version[-1] + 1,))
    high = dataclasses.replace(low, version=high_version).signed(ALICE)

    async def body(s: Station) -> None:
        assert await s.records.put(high, high.storage_key(), NOW_MS) == "stored"
        assert await s.records.put(low, low.storage_key(), NOW_MS) == "stale"
        assert await s.records.find(low.storage_key(), NOW_MS) == [high]

    with_station(tmp_path, body)


def test_one_record_per_signer_newest_first(tmp_path: Path) -> None:
    alice, bob = advert(ALICE, NOW_MS - 5000), advert(BOB, NOW_MS)
    key = alice.storage_key()
    assert bob.storage_key() == key

    async def body(s: Station) -> None:
        for record in (alice, bob):
            assert_result(await s.call("_dht.put_record", record.to_rpc()), "ok")
        expected = [bob.to_rpc(), alice.to_rpc()]
        assert_result(await s.call("_dht.find_records", {"key": key}), expected)
        assert_result(await s.call("_dht.find_record", {"key": key}), bob.to_rpc())
        assert_result(await s.call("_dht.find_records_by_type", {"type": 6}), expected)

    with_station(tmp_path, body)


def test_an_expired_record_is_never_returned(tmp_path: Path) -> None:
    short = advert(ALICE, NOW_MS, ttl_ms=1000)
    key = short.storage_key()
    later = NOW_MS + 1000  # expires_at <= now: expired

    async def body(s: Station) -> None:
        assert_result(await s.call("_dht.put_record", short.to_rpc()), "ok")
        assert_result(await s.call("_dht.find_record", {"key": key}, NOW_MS + 999), short.to_rpc())
        assert_result(await s.call("_dht.find_record", {"key": key}, later), "not_found")
        assert_result(await s.call("_dht.find_records", {"key": key}, later), [])
        assert_result(await s.call("_dht.find_records_by_type", {"type": 6}, later), [])
        assert await s.records.find(key, later) == []
        assert await s.records.find_by_type(6, later) == []
        assert await s.records.count() == 1  # held until reaped

    with_station(tmp_path, body)


def test_an_expired_record_does_not_block_an_older_put(tmp_path: Path) -> None:
    expired = advert(ALICE, NOW_MS, ttl_ms=1000)
    older_but_alive = advert(ALICE, NOW_MS - 10, ttl_ms=10_000)
    now = NOW_MS + 2000

    async def body(s: Station) -> None:
        assert_result(await s.call("_dht.put_record", expired.to_rpc()), "ok")
        assert_result(await s.call("_dht.put_record", older_but_alive.to_rpc(), now), "ok")
        assert await s.records.find(expired.storage_key(), now) == [older_but_alive]

    with_station(tmp_path, body)


def test_reap_deletes_only_expired_records(tmp_path: Path) -> None:
    short = advert(ALICE, NOW_MS, uri="a.short_v1", ttl_ms=1000)
    long = advert(ALICE, NOW_MS, uri="a.long_v1", ttl_ms=100_000)

    async def body(s: Station) -> None:
        for record in (short, long):
            assert await s.records.put(record, record.storage_key(), NOW_MS) == "stored"
        assert await s.records.reap(NOW_MS + 999) == 0
        assert await s.records.reap(NOW_MS + 1000) == 1
        assert await s.records.count() == 1
        assert await s.records.find(long.storage_key(), NOW_MS + 1000) == [long]
        assert await s.records.reap(NOW_MS + 100_000) == 1
        assert await s.records.count() == 0

    with_station(tmp_path, body)


def test_find_by_type_limit(tmp_path: Path) -> None:
    records = [advert(ALICE, NOW_MS + i, uri=f"p.n{i}_v1") for i in range(5)]

    async def body(s: Station) -> None:
        for record in records:
            await s.records.put(record, record.storage_key(), NOW_MS)
        assert await s.records.find_by_type(6, NOW_MS, limit=2) == records[:-3:-1]
        assert await s.records.find_by_type(6, NOW_MS) == records[::-1]

    with_station(tmp_path, body)


def test_huge_timestamps_fit_the_store(tmp_path: Path) -> None:
    far = (1 << 64) - 1
    version = record_version(NOW_MS, bytes(10))
    record = Record(0x20, ALICE.node_id, version, far - 1, far, {"a": 1}).signed(ALICE)

    async def body(s: Station) -> None:
        # the built-in refuses such a clock (test_relay_store_limits); the store still holds it
        assert await s.records.put(record, record.storage_key(), NOW_MS) == "stored"
        assert await s.records.find(ALICE.node_id, NOW_MS) == [record]
        assert await s.records.reap(NOW_MS) == 0

    with_station(tmp_path, body)


def test_an_unreadable_row_is_skipped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = advert(ALICE, NOW_MS)
    key = good.storage_key()

    async def body(s: Station) -> None:
        await s.records.put(good, key, NOW_MS)
        with sqlite3.connect(s.records.path) as raw:
            raw.execute(
                "INSERT INTO records VALUES (?, ?, 6, ?, ?, ?, ?, 8)",
                (key, BOB.node_id, NOW_MS + 5, NOW_MS + 10_000, b"\xff" * 24, b"\xa1garbage"),
            )
        with caplog.at_level(logging.WARNING, logger="macula.relay.store"):
            assert await s.records.find(key, NOW_MS) == [good]
            assert await s.records.find_by_type(6, NOW_MS) == [good]
        assert "unreadable record row" in caplog.text

    with_station(tmp_path, body)


def test_store_put_refuses_a_bad_storage_key(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        with pytest.raises(ValueError):
            await s.records.put(advert(ALICE, NOW_MS), b"short", NOW_MS)

    with_station(tmp_path, body)


# --- _content.* -------------------------------------------------------------------------------


async def put_data(s: Station, data: bytes, name: str = "f.bin") -> Mcid:
    """Store ``data`` the way a client does (§11.5): blocks, then the manifest if any."""
    plan = plan_put(data, name, created=NOW_MS // 1000)
    for mcid, view in plan.blocks:
        put = await s.call("_content.put_block", {"mcid": mcid.to_bytes(), "payload": bytes(view)})
        assert_result(put, "ok")
    if plan.manifest is not None:
        manifest = {"manifest": plan.manifest.to_wire()}
        assert_result(await s.call("_content.put_manifest", manifest), "ok")
    return plan.mcid


async def get_data(s: Station, mcid: Mcid) -> bytes:
    """Fetch and verify like a client (§11.5)."""
    if not mcid.is_manifest:
        got = await s.call("_content.get_block", {"mcid": mcid.to_bytes()})
        assert isinstance(got.payload, bytes)
        verify_block(mcid, got.payload)
        return got.payload
    got = await s.call("_content.get_manifest", {"mcid": mcid.to_bytes()})
    assert isinstance(got.payload, dict) and type(got.payload["name"]) is str
    manifest = Manifest.from_wire(got.payload)
    manifest.verify_mcid(mcid)
    blocks = []
    for info in manifest.chunks:
        block = await s.call("_content.get_block", {"mcid": info.mcid.to_bytes()})
        assert isinstance(block.payload, bytes)
        blocks.append(block.payload)
    return assemble(manifest, blocks)


@pytest.mark.parametrize("size", [1, 256 * 1024, 5 * 1024 * 1024])
def test_content_round_trip(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)

    async def body(s: Station) -> None:
        mcid = await put_data(s, data)
        assert mcid.is_manifest == (size > 256 * 1024)
        assert await get_data(s, mcid) == data
        stats = await s.content.stats()
        assert stats.bytes == size and stats.manifests == int(mcid.is_manifest)

    with_station(tmp_path, body)


def test_put_block_is_idempotent(tmp_path: Path) -> None:
    data = b"hello"
    argument = {"mcid": raw_mcid(data).to_bytes(), "payload": data, "replicate": "false"}

    async def body(s: Station) -> None:
        for _ in range(3):
            assert_result(await s.call("_content.put_block", argument), "ok")
        assert await s.content.stats() == type(await s.content.stats())(1, 5, 0)
        assert await s.content.has_block(digest(data))
        assert not await s.content.has_block(digest(b"other"))

    with_station(tmp_path, body)


def test_the_empty_block(tmp_path: Path) -> None:
    empty = CONTENT["blocks"][0]
    mcid = bytes.fromhex(empty["mcid_hex"])

    async def body(s: Station) -> None:
        put = {"mcid": mcid, "payload": b"", "replicate": "true"}
        assert_result(await s.call("_content.put_block", put), "ok")
        assert_result(await s.call("_content.get_block", {"mcid": mcid}), b"")

    with_station(tmp_path, body)


def test_hash_mismatch_is_a_result(tmp_path: Path) -> None:
    mcid = raw_mcid(b"what was promised").to_bytes()
    sha_mcid = raw_mcid(b"sha", "sha256").to_bytes()

    async def body(s: Station) -> None:
        for argument in (
            {"mcid": mcid, "payload": b"something else"},
            {"mcid": sha_mcid, "payload": b"sha"},  # §13 #15: BLAKE3 only
        ):
            outcome = await s.call("_content.put_block", argument)
            assert_result(outcome, "hash_mismatch")
            assert_result(
                await s.call("_content.get_block", {"mcid": argument["mcid"]}), "not_found"
            )
        assert (await s.content.stats()).blocks == 0

    with_station(tmp_path, body)


GOOD_MCID = raw_mcid(b"x").to_bytes()
MANIFEST_MCID = bytes.fromhex(CONTENT["manifests"][0]["manifest_mcid_hex"])


@pytest.mark.parametrize(
    "argument",
    [
        None,
        [GOOD_MCID, b"x"],
        {},
        {"payload": b"x"},
        {"mcid": GOOD_MCID},
        {"mcid": GOOD_MCID[:33], "payload": b"x"},
        {"mcid": GOOD_MCID + b"\x00", "payload": b"x"},
        {"mcid": b"\x02" + GOOD_MCID[1:], "payload": b"x"},  # version 2
        {"mcid": b"\x01\x70" + GOOD_MCID[2:], "payload": b"x"},  # unknown codec
        {"mcid": MANIFEST_MCID, "payload": b"x"},  # a manifest id is not a block id
        {"mcid": GOOD_MCID.hex(), "payload": b"x"},
        {"mcid": GOOD_MCID, "payload": "x"},
        {"mcid": GOOD_MCID, "payload": None},
        {"mcid": GOOD_MCID, "payload": b"x", "replicate": "yes"},
        {"mcid": GOOD_MCID, "payload": b"x", "replicate": 1},
        {"mcid": GOOD_MCID, "payload": b"x", "replicate": None},
    ],
)
def test_put_block_bad_arguments(tmp_path: Path, argument: object) -> None:
    async def body(s: Station) -> None:
        assert_error(await s.call("_content.put_block", argument), BAD, b"bad_request: ")
        assert (await s.content.stats()).blocks == 0

    with_station(tmp_path, body)


def test_a_block_over_4_mib_is_payload_too_large(tmp_path: Path) -> None:
    big = bytes(MAX_BLOCK_BYTES + 1)
    edge = bytes(MAX_BLOCK_BYTES)

    async def body(s: Station) -> None:
        outcome = await s.call(
            "_content.put_block", {"mcid": raw_mcid(big).to_bytes(), "payload": big}
        )
        assert_error(outcome, ErrorCode.PAYLOAD_TOO_LARGE, b"payload_too_large: ")
        put = {"mcid": raw_mcid(edge).to_bytes(), "payload": edge}
        assert_result(await s.call("_content.put_block", put), "ok")

    with_station(tmp_path, body)


@pytest.mark.parametrize(
    "argument",
    [None, "mcid", {}, {"mcid": GOOD_MCID[:-1]}, {"mcid": b"\x02" + GOOD_MCID[1:]},
     {"mcid": MANIFEST_MCID}, {"mcid": 5}],
)  # fmt: skip
def test_get_block_bad_arguments(tmp_path: Path, argument: object) -> None:
    async def body(s: Station) -> None:
        assert_error(await s.call("_content.get_block", argument), BAD, b"bad_request: ")

    with_station(tmp_path, body)


def test_get_block_miss(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        assert_result(await s.call("_content.get_block", {"mcid": GOOD_MCID}), "not_found")

    with_station(tmp_path, body)


@pytest.mark.parametrize("vector", CONTENT["manifests"], ids=lambda v: v["input_description"][:30])
def test_put_and_get_the_vector_manifests(tmp_path: Path, vector: dict[str, Any]) -> None:
    wire = typed(vector["manifest_wire"])
    mcid = bytes.fromhex(vector["manifest_mcid_hex"])

    async def body(s: Station) -> None:
        assert_result(await s.call("_content.put_manifest", {"manifest": wire}), "ok")
        assert_result(await s.call("_content.put_manifest", {"manifest": wire}), "ok")
        assert_result(await s.call("_content.get_manifest", {"mcid": mcid}), wire)

    with_station(tmp_path, body)


def test_put_manifest_accepts_a_bytes_name_and_returns_text(tmp_path: Path) -> None:
    wire = typed(CONTENT["manifests"][0]["manifest_wire"])
    as_bytes = {**wire, "name": wire["name"].encode()}

    async def body(s: Station) -> None:
        assert_result(await s.call("_content.put_manifest", {"manifest": as_bytes}), "ok")
        got = await s.call("_content.get_manifest", {"mcid": wire["mcid"]})
        assert_result(got, wire)

    with_station(tmp_path, body)


def _other_mcid(wire: dict[str, Any]) -> dict[str, Any]:
    return {**wire, "mcid": bytes.fromhex(CONTENT["manifests"][1]["manifest_mcid_hex"])}


@pytest.mark.parametrize(
    ("mutate", "prefix"),
    [
        (_other_mcid, b"mcid_mismatch: "),
        (lambda w: {**w, "name": "renamed.bin"}, b"mcid_mismatch: "),
        (lambda w: {**w, "size": w["size"] - 1, "chunks": w["chunks"]}, b"bad_request: "),
        (lambda w: {**w, "root_hash": bytes(32)}, b"mcid_mismatch: "),
        (
            lambda w: {**w, "chunks": [{**w["chunks"][0], "hash": bytes(32)}, *w["chunks"][1:]]},
            b"bad_request: ",  # the chunks do not fold to root_hash
        ),
        (_drop("chunks"), b"bad_request: "),
        (_drop("mcid"), b"bad_request: "),
        (lambda w: {**w, "mcid": GOOD_MCID}, b"bad_request: "),  # a block id
        (lambda w: {**w, "mcid": w["mcid"][:33]}, b"bad_request: "),
        (lambda w: {**w, "name": 7}, b"bad_request: "),
        (lambda w: {**w, "name": b"\xff\xfe"}, b"bad_request: "),
        (lambda w: {**w, "version": 2}, b"bad_request: "),
        (lambda w: {**w, "chunk_count": 9}, b"bad_request: "),
        (lambda w: [w], b"bad_request: "),
        (lambda w: None, b"bad_request: "),
    ],
)
def test_put_manifest_refusals(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], object], prefix: bytes
) -> None:
    wire = typed(CONTENT["manifests"][0]["manifest_wire"])

    async def body(s: Station) -> None:
        argument = {"manifest": mutate(wire)}
        assert_error(await s.call("_content.put_manifest", argument), BAD, prefix)
        assert (await s.content.stats()).manifests == 0

    with_station(tmp_path, body)


@pytest.mark.parametrize("argument", [None, [], {}, {"manifest_": {}}, "manifest"])
def test_put_manifest_bad_arguments(tmp_path: Path, argument: object) -> None:
    async def body(s: Station) -> None:
        assert_error(await s.call("_content.put_manifest", argument), BAD, b"bad_request: ")

    with_station(tmp_path, body)


@pytest.mark.parametrize(
    "argument",
    [None, {}, {"mcid": MANIFEST_MCID[:-1]}, {"mcid": GOOD_MCID}, {"mcid": MANIFEST_MCID.hex()}],
)
def test_get_manifest_bad_arguments(tmp_path: Path, argument: object) -> None:
    async def body(s: Station) -> None:
        assert_error(await s.call("_content.get_manifest", argument), BAD, b"bad_request: ")

    with_station(tmp_path, body)


def test_get_manifest_miss(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        assert_result(await s.call("_content.get_manifest", {"mcid": MANIFEST_MCID}), "not_found")

    with_station(tmp_path, body)


def test_an_unreadable_manifest_row_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(s: Station) -> None:
        with sqlite3.connect(s.content.path) as raw:
            raw.execute("INSERT INTO manifests VALUES (?, ?)", (MANIFEST_MCID[2:], b"\xa0"))
        with caplog.at_level(logging.WARNING, logger="macula.relay.store"):
            assert await s.content.get_manifest(MANIFEST_MCID[2:]) is None
            got = await s.call("_content.get_manifest", {"mcid": MANIFEST_MCID})
        assert_result(got, "not_found")
        assert "unreadable manifest row" in caplog.text

    with_station(tmp_path, body)


# --- failures inside a built-in ---------------------------------------------------------------


def _boom(*args: object, **kwargs: object) -> Any:
    raise OSError("disk on fire")


@pytest.mark.parametrize(
    ("procedure", "argument", "method"),
    [
        ("_dht.put_record", None, "put"),
        ("_dht.find_record", {"key": bytes(32)}, "find"),
        ("_content.put_block", {"mcid": GOOD_MCID, "payload": b"x"}, "put_block"),
        ("_content.get_manifest", {"mcid": MANIFEST_MCID}, "get_manifest"),
    ],
)
def test_a_crash_is_0x02_and_logged(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    procedure: str,
    argument: object,
    method: str,
) -> None:
    if argument is None:
        argument = vector_record()

    async def body(s: Station) -> None:
        store = s.records if procedure.startswith("_dht") else s.content
        monkeypatch.setattr(store, method, _boom)
        with caplog.at_level(logging.ERROR, logger="macula.relay.builtins"):
            outcome = await s.call(procedure, argument)
        assert outcome == Outcome.error(ErrorCode.TEMPORARY_RELAY_FAILURE, None)
        assert outcome.code == 0x02
        logged = [r for r in caplog.records if r.name == "macula.relay.builtins"]
        assert logged and logged[0].exc_info is not None
        assert procedure in logged[0].getMessage()

    with_station(tmp_path, body)


def test_bad_input_never_touches_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """§13 #13: validation before state; with every store method broken, bad input is 0x0F."""

    async def body(s: Station) -> None:
        for name in ("put", "find", "find_by_type", "reap", "count"):
            monkeypatch.setattr(s.records, name, _boom)
        for name in ("put_block", "get_block", "has_block", "put_manifest", "get_manifest"):
            monkeypatch.setattr(s.content, name, _boom)
        for procedure in sorted(BUILTIN_PROCEDURES - {"_relay.ping"}):
            for argument in (None, {}, {"key": 1, "mcid": 1, "type": "x", "manifest": 1}):
                outcome = await s.call(procedure, argument)
                assert outcome.code == BAD, (procedure, argument, outcome)
                # a put_record without key/signature is reported as bad_signature (§10.4)
                assert outcome.detail is not None
                assert outcome.detail.startswith((b"bad_request: ", b"bad_signature: "))

    with_station(tmp_path, body)


def test_error_details_are_bounded(tmp_path: Path) -> None:
    async def body(s: Station) -> None:
        outcome = await s.call("_dht.find_records_by_type", {"type": "x" * 100_000})
        assert_error(outcome, BAD, b"bad_request: ")
        assert outcome.detail is not None and len(outcome.detail) <= 300
        rpc = {**vector_record(), "type": "t" * 100_000}
        outcome = await s.call("_dht.put_record", rpc)
        assert outcome.detail is not None and len(outcome.detail) <= 300

    with_station(tmp_path, body)


# --- durability and files ---------------------------------------------------------------------


def test_restart_keeps_everything(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    rpc = vector_record()
    key = bytes.fromhex(PA["storage_key_hex"])

    async def main() -> None:
        first = await Station.open(tmp_path / "data")
        assert_result(await first.call("_dht.put_record", rpc), "ok")
        mcid = await put_data(first, data)
        await first.close()

        second = await Station.open(tmp_path / "data")
        try:
            assert_result(await second.call("_dht.find_record", {"key": key}), rpc)
            assert await get_data(second, mcid) == data
            assert await second.records.count() == 1
            assert await second.records.schema_version() == 2
            assert await second.content.schema_version() == 2
        finally:
            await second.close()

    asyncio.run(main())


def test_files_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"

    async def main() -> None:
        async with await RecordStore.open(directory / "records.sqlite3") as records:
            await records.put(advert(ALICE, NOW_MS), advert(ALICE, NOW_MS).storage_key(), NOW_MS)
            for suffix in ("", "-wal", "-shm"):
                path = directory / f"records.sqlite3{suffix}"
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, suffix
        with sqlite3.connect(directory / "records.sqlite3") as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)

    old = os.umask(0o022)
    try:
        asyncio.run(main())
    finally:
        os.umask(old)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "records.sqlite3").stat().st_mode) == 0o600


def test_an_existing_loose_file_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "content.sqlite3"
    path.touch(mode=0o644)
    os.chmod(path, 0o644)

    async def main() -> None:
        async with await ContentStore.open(path) as content:
            assert await content.put_block(digest(b"a"), b"a")
            assert not await content.put_block(digest(b"a"), b"a")

    asyncio.run(main())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "records.sqlite3"
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA user_version = 99")

    with pytest.raises(StoreError, match="schema version 99"):
        run(RecordStore.open(path))


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "content.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)

    with pytest.raises(StoreError, match="not a database"):
        run(ContentStore.open(path))


def test_content_store_digest_checks(tmp_path: Path) -> None:
    async def main() -> None:
        async with await ContentStore.open(tmp_path / "c.sqlite3") as content:
            with pytest.raises(ValueError):
                await content.put_block(b"short", b"x")
            assert await content.get_block(bytes(32)) is None
            assert await content.get_manifest(bytes(32)) is None

    asyncio.run(main())
