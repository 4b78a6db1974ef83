"""The DHT's record shelf: validation on every store, the caps, newest per signer, garbage."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from macula.services.house import HOUSE_PROCEDURES
from macula.wire import cbor
from macula.wire.identity import ZERO_REALM, Identity
from macula.wire.record_keys import realm_stations_key, station_endpoint_key
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.federation.dht.storage import (
    DhtLimits,
    DhtRefused,
    RecordShelf,
    check_record,
    decode_value,
    dht_id,
    dht_storage_key,
    encode_value,
    newest_per_signer,
)
from support.dhtkit import digest

NOW = 1_767_225_600_000
ALICE = Identity(bytes(range(1, 33)))
BOB = Identity(bytes(range(33, 65)))
STATION = Identity(bytes(range(100, 132)))


def record(
    who: Identity,
    created: int = NOW,
    *,
    subject: bytes | None = b"s",
    payload: dict[str, Any] | None = None,
    record_type: int = 0x21,
    ttl_ms: int = 3_600_000,
) -> Record:
    version = record_version(created, created.to_bytes(10, "big"))
    return new_record(
        who,
        record_type,
        {"x": "y"} if payload is None else payload,
        now_ms=created,
        version=version,
        ttl_ms=ttl_ms,
        subject_id=subject if record_type >= 0x20 else None,
    )


def shelf(**limits: int) -> RecordShelf:
    return RecordShelf(DhtLimits(**limits), lambda: NOW)


def refusal(rec: Record, dkey: bytes | None = None, **limits: int) -> str:
    with pytest.raises(DhtRefused) as caught:
        check_record(rec, digest(rec) if dkey is None else dkey, NOW, DhtLimits(**limits))
    return caught.value.reason


def test_ids_are_160_bits_of_sha256_for_node_ids_and_storage_keys() -> None:
    assert len(dht_id(ALICE.node_id)) == 20
    assert dht_id(ALICE.node_id) != dht_id(BOB.node_id)
    with pytest.raises(ValueError):
        dht_id(b"short")


def test_a_good_record_passes() -> None:
    rec = record(ALICE)
    assert check_record(rec, digest(rec), NOW, DhtLimits()) == len(cbor.encode(rec.to_wire()))


def test_a_forged_signature_is_refused() -> None:
    rec = record(ALICE)
    forged = dataclasses.replace(rec, payload={"x": "z"})
    assert refusal(forged) == "bad_signature"


def test_an_expired_record_is_refused() -> None:
    rec = record(ALICE, NOW - 10_000, ttl_ms=5_000)
    assert refusal(rec) == "expired"


def test_an_over_long_lifetime_and_a_future_record_are_refused() -> None:
    assert refusal(record(ALICE, ttl_ms=10_000), max_ttl_ms=5_000) == "ttl_too_long"
    assert refusal(record(ALICE, NOW + 600_000)) == "clock_skew"


def test_an_over_size_record_is_refused() -> None:
    big = record(ALICE, payload={"blob": "a" * 8_000})
    assert refusal(big) == "too_large"
    assert refusal(record(ALICE, payload={"blob": "a" * 600}), max_record_bytes=512) == "too_large"


def test_a_record_under_another_key_is_refused() -> None:
    rec = record(ALICE)
    assert refusal(rec, dht_id(bytes(32))) == "wrong_key"


def test_a_station_endpoint_not_signed_by_its_station_is_refused() -> None:
    payload = {"quic_port": 4433, "host_advertised": [b"127.0.0.1"]}
    by_alice = record(ALICE, record_type=RecordType.STATION_ENDPOINT, payload=payload)
    station_slot = dht_id(station_endpoint_key(STATION.node_id))
    assert refusal(by_alice, station_slot) == "wrong_key"
    own = record(STATION, record_type=RecordType.STATION_ENDPOINT, payload=payload)
    check_record(own, station_slot, NOW, DhtLimits())


def test_trust_rules_the_record_proves() -> None:
    advert = {
        "procedure_uri": "org.example.echo_v1",
        "advertiser_node": BOB.node_id,
        "serving_station": STATION.node_id,
    }
    rec = record(ALICE, record_type=RecordType.PROCEDURE_ADVERTISEMENT, payload=advert)
    assert refusal(rec) == "foreign_advertiser"
    house = sorted(HOUSE_PROCEDURES)[0]
    advert = {**advert, "procedure_uri": house, "advertiser_node": ALICE.node_id}
    rec = record(ALICE, record_type=RecordType.PROCEDURE_ADVERTISEMENT, payload=advert)
    assert refusal(rec) == "house_foreign_signer"
    content = {
        "announcer_node": BOB.node_id,
        "mcid": bytes(34),
        "endpoint": "quic://127.0.0.1:4433",
    }
    rec = record(ALICE, record_type=RecordType.CONTENT_ANNOUNCEMENT, payload=content)
    assert refusal(rec) == "foreign_announcer"


def test_realm_stations_live_under_the_station_set_key_of_their_realm() -> None:
    rec = record(STATION, record_type=RecordType.REALM_STATIONS, payload={"realm": ZERO_REALM})
    assert dht_storage_key(rec) == realm_stations_key(ZERO_REALM)
    check_record(rec, dht_id(realm_stations_key(ZERO_REALM)), NOW, DhtLimits())
    nameless = record(STATION, record_type=RecordType.REALM_STATIONS, payload={})
    assert refusal(nameless, dht_id(realm_stations_key(ZERO_REALM))) == "bad_payload"


def test_newest_per_signer_on_the_shelf() -> None:
    s = shelf()
    old, new = record(ALICE, NOW - 2_000), record(ALICE, NOW - 1_000)
    key = digest(old)
    assert s.offer(key, new, NOW) == "stored"
    assert s.offer(key, old, NOW) == "stale"
    assert s.offer(key, new, NOW) == "same"
    bob = record(BOB, NOW - 1_500)
    assert dht_storage_key(bob) != dht_storage_key(new)  # domain records are per signer
    assert s.records(key, NOW) == [new]
    assert (s.rows, s.stats["stale"]) == (1, 1)


def test_merge_keeps_the_newest_record_of_each_signer_newest_first() -> None:
    a1, a2, b1 = record(ALICE, NOW - 3_000), record(ALICE, NOW - 1_000), record(BOB, NOW - 2_000)
    assert newest_per_signer([a1, b1, a2, a1]) == [a2, b1]


def shared(who: Identity, created: int = NOW, size: int = 10) -> Record:
    """Records of many signers under one storage key: a content announcement of one MCID."""
    payload = {
        "announcer_node": who.node_id,
        "mcid": bytes(34),
        "endpoint": "quic://h:1",
        "name": "n" * size,
    }
    return record(who, created, record_type=RecordType.CONTENT_ANNOUNCEMENT, payload=payload)


def identity(i: int) -> Identity:
    return Identity(i.to_bytes(32, "big"))


def test_per_signer_caps() -> None:
    s = shelf(records_per_signer=2)
    for n in range(2):
        assert s.accept(
            digest(record(ALICE, subject=bytes([n]))), record(ALICE, subject=bytes([n])), NOW
        )
    third = record(ALICE, subject=b"\x09")
    assert not s.accept(digest(third), third, NOW)
    assert s.stats["refused_signer_records"] == 1
    # a replacement is never refused by a count cap
    newer = record(ALICE, NOW + 1, subject=b"\x00")
    assert s.accept(digest(newer), newer, NOW)
    s = shelf(bytes_per_signer=600)
    small, big = record(ALICE, subject=b"1"), record(ALICE, subject=b"2", payload={"b": "x" * 400})
    assert s.accept(digest(small), small, NOW)
    assert not s.accept(digest(big), big, NOW)
    assert s.stats["refused_signer_bytes"] == 1


def test_per_key_cap() -> None:
    s = shelf(records_per_key=3)
    key = digest(shared(ALICE))
    accepted = [s.accept(key, shared(identity(i + 1)), NOW) for i in range(5)]
    assert accepted == [True, True, True, False, False]
    assert s.stats["refused_key_records"] == 2
    assert len(s.records(key, NOW)) == 3


def test_global_caps_and_reaping_makes_room() -> None:
    s = shelf(records_total=3)
    short = record(BOB, NOW - 2_000, ttl_ms=2_500)  # expires at NOW + 500
    assert s.accept(digest(short), short, NOW)
    for i in range(2):
        rec = record(identity(i + 1))
        assert s.accept(digest(rec), rec, NOW)
    extra = record(identity(9))
    assert not s.accept(digest(extra), extra, NOW)
    assert s.stats["refused_total_records"] == 1
    assert s.accept(digest(extra), extra, NOW + 1_000)  # the expired one was reaped first
    assert s.stats["reaped"] == 1
    one = len(cbor.encode(record(ALICE).to_wire()))
    s = shelf(bytes_total=2 * one + one // 2)
    accepted = [s.accept(digest(r), r, NOW) for r in (record(identity(i + 1)) for i in range(3))]
    assert accepted == [True, True, False]
    assert s.stats["refused_total_bytes"] == 1
    assert s.bytes <= 2 * one + one // 2


def test_many_signers_cannot_take_more_than_the_global_cap() -> None:
    s = shelf(records_total=50)
    key = digest(shared(ALICE))
    taken = sum(s.accept(key, shared(identity(i + 1)), NOW) for i in range(80))
    assert taken == 50 and s.rows == 50 and s.stats["refused_total_records"] == 30


def test_peer_values_that_are_garbage_are_counted_never_raised() -> None:
    s = shelf()
    key = digest(record(ALICE))
    for value in (None, 7, "text", b"\xff\xfe", cbor.encode({"a": 1}), cbor.encode([1, {"t": 1}])):
        assert s.accept_value(key, value, NOW) == 0
    assert s.accept_value(b"short", encode_value([record(ALICE)]), NOW) == 0
    assert s.stats["refused_bad_value"] == 5
    assert s.stats["refused_bad_record"] == 2
    assert s.stats["refused_bad_key"] == 1
    assert s.accept_value(key, encode_value([record(ALICE), record(BOB)]), NOW) == 1
    assert s.stats["refused_wrong_key"] == 1  # Bob's record lives under another key
    stats: Any = s.stats
    assert decode_value(cbor.encode([None] * 3), DhtLimits(), stats) == []
    too_many = encode_value([record(ALICE)] * 3)
    assert decode_value(too_many, DhtLimits(max_records_per_value=2), stats) == []


def test_replies_are_bounded_and_newest_first() -> None:
    s = shelf(max_reply_bytes=1_000)
    key = digest(shared(ALICE))
    for i in range(10):
        assert s.accept(key, shared(identity(i + 1), NOW - 1_000 + i, size=100), NOW)
    stats: Any = s.stats
    reply = decode_value(s.reply_value(key, NOW), DhtLimits(), stats)
    assert 0 < len(reply) < 10
    assert len(s.reply_value(key, NOW)) <= 1_000
    assert reply == s.records(key, NOW)[: len(reply)]
    assert s.stats["reply_truncated"] == 2  # two replies, each cut


def test_istorage_view_batches_fit_one_store_request() -> None:
    s = shelf()
    key = digest(shared(ALICE))
    for i in range(40):
        s.accept(key, shared(identity(i + 1), size=400), NOW)
    batches = [value for dkey, value in s if dkey == key]
    assert len(batches) > 1 and all(len(b) < 8_000 for b in batches)
    stats: Any = s.stats
    assert sum(len(decode_value(b, DhtLimits(), stats)) for b in batches) == 40
    assert s.get(dht_id(bytes(32))) is None
    with pytest.raises(KeyError):
        s[dht_id(bytes(32))]
    s[key] = encode_value([shared(BOB)])
    assert len(s.records(key, NOW)) == 41


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        DhtLimits(records_total=0)
    with pytest.raises(ValueError):
        DhtLimits(max_record_bytes=9_000)
