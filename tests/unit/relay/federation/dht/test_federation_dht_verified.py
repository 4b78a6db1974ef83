"""Record bytes are verified once: the shelf's identical-record shortcut and VerifiedRecords."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from macula.wire import cbor
from macula.wire.identity import Identity
from macula.wire.records import Record, new_record, record_version
from relay.federation.dht.storage import (
    DhtLimits,
    DhtRefused,
    RecordShelf,
    VerifiedRecords,
    check_record,
)
from support.dhtkit import digest

NOW = 1_767_225_600_000
ALICE = Identity(bytes(range(1, 33)))


def note(created: int = NOW, text: str = "y", ttl_ms: int = 3_600_000) -> Record:
    return new_record(
        ALICE,
        0x21,
        {"x": text},
        now_ms=created,
        version=record_version(created, created.to_bytes(10, "big")),
        ttl_ms=ttl_ms,
        subject_id=b"s",
    )


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Record]]:
    """Every Ed25519 check of a record (Record.verify), in order."""
    seen: list[Record] = []
    real = Record.verify

    def counting(self: Record, now_ms: int) -> None:
        seen.append(self)
        real(self, now_ms)

    monkeypatch.setattr(Record, "verify", counting)
    yield seen


def test_the_same_record_offered_again_is_not_verified_again(
    verifications: list[Record],
) -> None:
    shelf = RecordShelf(DhtLimits(), lambda: NOW)
    rec = note()
    assert shelf.offer(digest(rec), rec, NOW) == "stored"
    for _ in range(5):
        assert shelf.offer(digest(rec), rec, NOW) == "same"
    assert len(verifications) == 1
    assert shelf.stats["same"] == 5


def test_bytes_checked_once_are_not_verified_by_another_shelf_sharing_the_cache(
    verifications: list[Record],
) -> None:
    cache = VerifiedRecords(16)
    rec = note()
    one = RecordShelf(DhtLimits(), lambda: NOW, cache)
    two = RecordShelf(DhtLimits(), lambda: NOW, cache)
    assert one.accept(digest(rec), rec, NOW)
    assert two.accept(digest(rec), rec, NOW)
    assert check_record(rec, digest(rec), NOW, DhtLimits(), verified=cache) > 0
    assert len(verifications) == 1
    assert cache.hits == 2
    newer = note(NOW + 1, "z")  # new bytes: every check again
    assert one.offer(digest(newer), newer, NOW + 1) == "stored"
    assert len(verifications) == 2


def test_new_bytes_get_every_check_even_when_similar_bytes_passed() -> None:
    cache = VerifiedRecords(16)
    rec = note()
    check_record(rec, digest(rec), NOW, DhtLimits(), verified=cache)
    forged = dataclasses.replace(rec, payload={"x": "forged"})  # the old signature
    with pytest.raises(DhtRefused) as caught:
        check_record(forged, digest(rec), NOW, DhtLimits(), verified=cache)
    assert caught.value.reason == "bad_signature"
    with pytest.raises(DhtRefused) as caught:  # the same bytes under another digest
        check_record(rec, bytes(20), NOW, DhtLimits(), verified=cache)
    assert caught.value.reason == "wrong_key"


def test_a_cached_record_is_still_refused_once_expired() -> None:
    cache = VerifiedRecords(16)
    rec = note(ttl_ms=1_000)
    check_record(rec, digest(rec), NOW, DhtLimits(), verified=cache)
    with pytest.raises(DhtRefused) as caught:
        check_record(rec, digest(rec), NOW + 1_000, DhtLimits(), verified=cache)
    assert caught.value.reason == "expired"
    shelf = RecordShelf(DhtLimits(), lambda: NOW, cache)
    assert not shelf.accept(digest(rec), rec, NOW + 5_000)
    assert shelf.stats["refused_expired"] == 1


def test_a_refused_record_is_not_remembered_as_checked(verifications: list[Record]) -> None:
    cache = VerifiedRecords(16)
    rec = note()
    for _ in range(2):
        with pytest.raises(DhtRefused):
            check_record(rec, digest(rec), NOW, DhtLimits(max_ttl_ms=1), verified=cache)
    assert len(cache) == 0
    assert len(verifications) == 2


def test_the_cache_is_bounded_and_forgets_the_oldest_first() -> None:
    cache = VerifiedRecords(2)
    records = [note(NOW + i, str(i)) for i in range(3)]
    for rec in records:
        cache.add(digest(rec), cbor.encode(rec.to_wire()))
    assert len(cache) == 2
    wires = [(digest(r), cbor.encode(r.to_wire())) for r in records]
    assert wires[0] not in cache
    assert wires[1] in cache and wires[2] in cache
    off = VerifiedRecords(0)
    off.add(*wires[0])
    assert len(off) == 0
    with pytest.raises(ValueError):
        VerifiedRecords(-1)
