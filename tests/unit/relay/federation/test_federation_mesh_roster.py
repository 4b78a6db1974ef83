"""``MeshRoster``: what a linked station's station list may make this station believe (issue
37). A station's endpoint counts only from that station's own key; lists are bounded; anything
else is ignored and counted, and nothing a peer sends raises."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from macula.wire.identity import Identity
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.federation.addresses import StationAddress
from relay.federation.mesh_roster import (
    MAX_MESH_RECORDS,
    MeshRoster,
    flag,
    mesh_payload,
)
from support.identities import new_identity as identity

NOW = 1_800_000_000_000


SENDER, B, C = identity(), identity(), identity()


def endpoint(
    who: Identity,
    *,
    port: int = 4433,
    host: bytes = b"127.0.0.1",
    now: int = NOW,
    ttl_ms: int = 300_000,
    **extra: Any,
) -> Record:
    payload = {"quic_port": port, "host_advertised": [host], "alpn": "macula", "dht_port": 9}
    return new_record(
        who,
        RecordType.STATION_ENDPOINT,
        {**payload, **extra},
        now_ms=now,
        version=record_version(now, os.urandom(10)),
        ttl_ms=ttl_ms,
    )


def listing(*records: Any) -> dict[str, Any]:
    return {"records": [r.to_wire() if isinstance(r, Record) else r for r in records]}


def test_the_senders_own_record_is_kept_and_new_only_once_per_link() -> None:
    roster = MeshRoster()
    first = endpoint(SENDER)
    news = roster.take(SENDER.node_id, listing(first), NOW)
    assert news.own == first and news.stations == []
    newer = endpoint(SENDER, port=4434, now=NOW + 1)
    assert roster.take(SENDER.node_id, listing(newer), NOW + 1).own is None  # a refresh
    assert roster.record_of(SENDER.node_id, NOW + 1) == newer  # newest kept
    assert roster.take(SENDER.node_id, listing(first), NOW + 2).own is None
    assert roster.record_of(SENDER.node_id, NOW + 2) == newer  # an older one never replaces
    roster.unlinked(SENDER.node_id)
    assert roster.record_of(SENDER.node_id, NOW) is None
    assert roster.take(SENDER.node_id, listing(first), NOW).own == first  # a new link: new


def test_other_stations_count_by_their_own_records_once_each() -> None:
    roster = MeshRoster()
    news = roster.take(SENDER.node_id, listing(endpoint(B), endpoint(C, port=5), endpoint(B)), NOW)
    assert news.own is None
    assert news.stations == [
        StationAddress(B.node_id, "127.0.0.1", 4433, 9),
        StationAddress(C.node_id, "127.0.0.1", 5, 9),
    ]
    assert len(roster) == 0  # a third station's record is news, never kept as the sender's


def test_a_kept_record_that_expired_is_not_listed() -> None:
    roster = MeshRoster()
    roster.take(SENDER.node_id, listing(endpoint(SENDER, ttl_ms=1_000)), NOW)
    assert roster.record_of(SENDER.node_id, NOW + 999) is not None
    assert roster.record_of(SENDER.node_id, NOW + 1_000) is None


def resigned(record: Record, **changes: Any) -> dict[str, Any]:
    """``record``'s wire form changed after signing (so its signature no longer holds)."""
    return {**record.to_wire(), **changes}


BAD_RECORDS: list[tuple[str, object]] = [
    ("not a record", "mesh_bad_record"),
    ({"t": 18}, "mesh_bad_record"),
    ({k: v for k, v in endpoint(B).to_wire().items() if k != "s"}, "mesh_bad_record"),
    (resigned(endpoint(B), s=bytes(64)), "mesh_refused_bad_signature"),
    (resigned(endpoint(B), k=C.node_id), "mesh_refused_bad_signature"),  # B's word for C
    (endpoint(B, now=NOW - 600_000).to_wire(), "mesh_refused_expired"),
    (endpoint(B, now=NOW + 3_600_000).to_wire(), "mesh_refused_clock_skew"),
    (endpoint(B, port=0).to_wire(), "mesh_bad_endpoint"),
    (endpoint(B, host=b"").to_wire(), "mesh_bad_endpoint"),
    (endpoint(B, host=b"\xff").to_wire(), "mesh_bad_endpoint"),
    (endpoint(B, padding="x" * 8_000).to_wire(), "mesh_refused_too_large"),
    (
        new_record(
            B, RecordType.REALM_STATIONS, {"realm": bytes(32)}, now_ms=NOW,
            version=record_version(NOW, os.urandom(10)),
        ).to_wire(),
        "mesh_not_endpoint",
    ),
]  # fmt: skip


def test_each_bad_record_is_ignored_and_counted_and_the_good_ones_still_count() -> None:
    for item, counter in BAD_RECORDS:
        roster = MeshRoster()
        news = roster.take(SENDER.node_id, listing(item, endpoint(C)), NOW)
        assert roster.stats[counter] == 1, (counter, dict(roster.stats))
        assert news.refused == [counter]
        assert [s.node_id for s in news.stations] == [C.node_id], counter


def test_a_list_of_another_shape_or_too_long_is_ignored_whole() -> None:
    roster = MeshRoster()
    for payload in (None, 7, "records", [], {"records": None}, {"records": {"a": 1}}, {}):
        assert roster.take(SENDER.node_id, payload, NOW).stations == []
    assert roster.stats["mesh_bad_list"] == 7
    too_long = listing(*[endpoint(C)] * (MAX_MESH_RECORDS + 1))
    news = roster.take(SENDER.node_id, too_long, NOW)
    assert news.stations == [] and news.own is None and news.refused == ["mesh_list_too_long"]
    assert roster.stats["mesh_list_too_long"] == 1
    assert roster.stats["mesh_lists"] == 0  # none was read


def test_a_listing_is_bounded_one_per_station() -> None:
    roster = MeshRoster(max_records=2)
    records = [endpoint(B), None, endpoint(B), endpoint(C), endpoint(SENDER)]
    assert [r.key for r in roster.listing(records)] == [B.node_id, C.node_id]


def test_a_payload_round_trips_and_flags_are_ints_one_only() -> None:
    payload = mesh_payload([endpoint(B)], more=1, first=0)
    assert flag(payload, "more") and not flag(payload, "first")
    assert MeshRoster().take(SENDER.node_id, payload, NOW).stations[0].node_id == B.node_id
    for value in (True, "1", 1.0, 2, None):
        assert not flag({"more": value}, "more")
    assert not flag("more", "more")


scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=40)
cbor_like = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=9)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(payload=cbor_like, records=st.lists(cbor_like, max_size=5))
def test_arbitrary_payloads_never_raise_and_never_name_a_station(
    payload: object, records: list[object]
) -> None:
    roster = MeshRoster()
    for value in (payload, {"records": records}):
        news = roster.take(SENDER.node_id, value, NOW)
        assert news.stations == [] and news.own is None
