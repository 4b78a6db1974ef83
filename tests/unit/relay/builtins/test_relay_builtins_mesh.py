"""The ``_dht.*`` built-ins with the DHT among stations injected (a fake mesh here)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from macula.wire.identity import Identity
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.builtins.outcome import Outcome
from relay.builtins.procedures import Builtins
from relay.stores.records import ContentStore, RecordStore

NOW = 1_767_225_600_000
STATION = Identity(bytes(range(100, 132)))
ALICE = Identity(bytes(range(1, 33)))
BOB = Identity(bytes(range(33, 65)))


def announcement(who: Identity, created: int) -> Record:
    payload = {"announcer_node": who.node_id, "mcid": bytes(34), "endpoint": "quic://h:1"}
    version = record_version(created, created.to_bytes(10, "big"))
    return new_record(
        who, RecordType.CONTENT_ANNOUNCEMENT, payload, now_ms=created, version=version
    )


class FakeMesh:
    def __init__(self, held: list[Record] | None = None, *, delay: float = 0.0) -> None:
        self.held = held or []
        self.delay = delay
        self.put_records: list[Record] = []
        self.fail: Exception | None = None

    async def put(self, record: Record) -> int:
        await asyncio.sleep(self.delay)  # a slow mesh, simulated (the bounded wait is tested)
        if self.fail is not None:
            raise self.fail
        self.put_records.append(record)
        return 3

    async def find(self, storage_key: bytes) -> list[Record]:
        await asyncio.sleep(self.delay)  # a slow mesh, simulated (the bounded wait is tested)
        if self.fail is not None:
            raise self.fail
        return [r for r in self.held if r.storage_key() == storage_key]


def with_builtins(
    tmp_path: Path, mesh: FakeMesh, body: Callable[[Builtins], Awaitable[None]]
) -> None:
    async def main() -> None:
        records = await RecordStore.open(tmp_path / "records.sqlite3")
        content = await ContentStore.open(tmp_path / "content.sqlite3")
        try:
            builtins = Builtins(
                records, content, station_id=STATION.node_id, dht=mesh, mesh_wait_s=0.2
            )
            await body(builtins)
        finally:
            await records.close()
            await content.close()

    asyncio.run(main())


async def call(builtins: Builtins, procedure: str, payload: object) -> Outcome:
    return await builtins.run(procedure, payload, NOW, NOW * 1000)


def test_a_put_is_stored_here_and_in_the_mesh(tmp_path: Path) -> None:
    mesh = FakeMesh()
    rec = announcement(ALICE, NOW - 1_000)

    async def body(b: Builtins) -> None:
        assert (await call(b, "_dht.put_record", rec.to_rpc())).payload == "ok"
        assert mesh.put_records == [rec]
        assert await b.records.find(rec.storage_key(), NOW) == [rec]
        stale = announcement(ALICE, NOW - 2_000)
        assert (await call(b, "_dht.put_record", stale.to_rpc())).is_error
        assert mesh.put_records == [rec]  # a refused put goes nowhere

    with_builtins(tmp_path, mesh, body)


def test_finds_merge_the_local_store_with_the_mesh_newest_per_signer(tmp_path: Path) -> None:
    local_alice, mesh_alice = announcement(ALICE, NOW - 3_000), announcement(ALICE, NOW - 1_000)
    mesh_bob = announcement(BOB, NOW - 2_000)
    mesh = FakeMesh([mesh_alice, mesh_bob])

    async def body(b: Builtins) -> None:
        await b.records.put(local_alice, local_alice.storage_key(), NOW)
        key = {"key": local_alice.storage_key()}
        found = await call(b, "_dht.find_records", key)
        assert found.payload == [mesh_alice.to_rpc(), mesh_bob.to_rpc()]
        assert (await call(b, "_dht.find_record", key)).payload == mesh_alice.to_rpc()
        by_type = await call(b, "_dht.find_records_by_type", {"type": 0x11})
        assert by_type.payload == [local_alice.to_rpc()]  # by type stays local

    with_builtins(tmp_path, mesh, body)


def test_a_slow_or_failing_mesh_answers_from_the_local_store(tmp_path: Path) -> None:
    rec = announcement(ALICE, NOW - 1_000)
    mesh = FakeMesh([announcement(BOB, NOW - 500)], delay=5.0)

    async def body(b: Builtins) -> None:
        assert (await call(b, "_dht.put_record", rec.to_rpc())).payload == "ok"
        assert b.stats["dht_put_timeout"] == 1
        key = {"key": rec.storage_key()}
        assert (await call(b, "_dht.find_records", key)).payload == [rec.to_rpc()]
        assert b.stats["dht_find_timeout"] == 1
        mesh.delay, mesh.fail = 0.0, RuntimeError("mesh down")
        assert (await call(b, "_dht.find_record", key)).payload == rec.to_rpc()
        assert b.stats["dht_find_failed"] == 1
        newer = announcement(ALICE, NOW - 100)
        assert (await call(b, "_dht.put_record", newer.to_rpc())).payload == "ok"
        assert b.stats["dht_put_failed"] == 1

    with_builtins(tmp_path, mesh, body)


def test_expired_mesh_records_are_not_answered(tmp_path: Path) -> None:
    old = new_record(
        BOB,
        RecordType.CONTENT_ANNOUNCEMENT,
        {"announcer_node": BOB.node_id, "mcid": bytes(34), "endpoint": "quic://h:1"},
        now_ms=NOW - 10_000,
        version=bytes(16),
        ttl_ms=5_000,
    )
    mesh = FakeMesh([old])

    async def body(b: Builtins) -> None:
        found = await call(b, "_dht.find_records", {"key": old.storage_key()})
        assert found.payload == []
        assert (await call(b, "_dht.find_record", {"key": old.storage_key()})).payload == (
            "not_found"
        )

    with_builtins(tmp_path, mesh, body)
