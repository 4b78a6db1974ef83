"""The DHT's guard (issue 26), sans-I/O: return-address tokens, linked stations, per-source
budgets, and the shelf's per-source caps (a flood displaces only its own records)."""

from __future__ import annotations

import pytest

from macula.wire import cbor
from macula.wire.identity import Identity
from macula.wire.records import Record, new_record, record_version
from relay.federation.dht.checks import is_challenge, parse_request
from relay.federation.dht.guard import DhtGuard, GuardLimits
from relay.federation.dht.station import DhtConfig
from relay.federation.dht.storage import LOCAL, DhtLimits, RecordShelf, dht_id

NOW = 1_767_225_600_000
SECRET = bytes(range(32))
ADDR = ("192.0.2.7", 4001)
STATION = bytes(range(32))


def guard(**limits: int) -> DhtGuard:
    return DhtGuard(SECRET, GuardLimits(**limits))


def test_a_token_is_good_at_its_address_for_its_window_and_the_next() -> None:
    g = guard(token_window_ms=1_000)
    token = g.token(ADDR, NOW)
    assert len(token) == 16
    assert g.proven(ADDR, token, NOW + 999)
    assert g.proven(ADDR, token, NOW + 1_999)  # the next window
    assert not g.proven(ADDR, token, NOW + 2_000)
    assert not g.proven(("192.0.2.8", 4001), token, NOW)
    assert not g.proven(("192.0.2.7", 4002), token, NOW)
    assert not g.proven(ADDR, None, NOW)
    assert not DhtGuard(bytes(32), GuardLimits(token_window_ms=1_000)).proven(ADDR, token, NOW)


def test_an_unproven_source_is_answered_at_most_three_times_what_it_sent() -> None:
    g = guard()
    assert g.reply_allowed(100, 300)
    assert not g.reply_allowed(100, 301)


def test_a_linked_station_is_bound_at_its_link_address_or_its_endpoint_records() -> None:
    endpoints: dict[bytes, list[tuple[str, int]]] = {STATION: [("198.51.100.1", 9)]}
    g = DhtGuard(SECRET, endpoints=lambda node_id: endpoints.get(node_id, []))
    key = dht_id(STATION)
    assert not g.bound(key, ADDR)
    g.link_up(STATION, *ADDR)
    g.link_up(STATION, ADDR[0], 0)  # a second link, its DHT port not told
    assert g.linked(key) and g.bound(key, ADDR)
    assert g.bound(key, ("198.51.100.1", 9))  # its own signed station_endpoint names it
    assert not g.bound(key, ("198.51.100.1", 10))
    assert not g.bound(dht_id(bytes(32)), ADDR)  # another station at that address
    g.link_down(STATION)
    assert g.bound(key, ADDR)  # one link still up
    g.link_down(STATION)
    assert not g.linked(key) and not g.bound(key, ADDR)
    g.link_down(STATION)  # more downs than ups: nothing to forget


def test_linked_stations_and_budgets_are_bounded() -> None:
    g = guard(max_linked=2, max_sources=2)
    for i in range(3):
        g.link_up(bytes([i]) * 32, "192.0.2.1", 1 + i)
    assert not g.linked(dht_id(bytes(32)))  # the oldest forgotten
    assert g.linked(dht_id(bytes([2]) * 32))
    for source in (b"a", b"b", b"c"):
        g.charge(source, 1, 1, NOW)
    assert len(g._budgets) == 2


def test_a_source_spends_its_budget_per_window() -> None:
    g = guard(budget_window_ms=1_000, records_per_source_window=3, bytes_per_source_window=100)
    assert g.allows(b"s", NOW)
    g.charge(b"s", 2, 10, NOW)
    assert g.allows(b"s", NOW + 1)
    g.charge(b"s", 1, 10, NOW + 1)
    assert not g.allows(b"s", NOW + 2)  # 3 new records this window
    assert g.allows(b"other", NOW + 2)  # each source its own budget
    g.charge(b"other", 0, 100, NOW + 2)
    assert not g.allows(b"other", NOW + 3)  # bytes too
    assert g.allows(b"s", NOW + 1_000)  # a new window


def test_the_guard_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        GuardLimits(reply_ratio=0)
    with pytest.raises(ValueError):
        DhtGuard(b"short")
    for bad in ({"find_pages": 0}, {"token_reuse_s": 0}):
        with pytest.raises(ValueError):
            DhtConfig(**bad)  # type: ignore[arg-type]
    for field in ("records_per_source", "bytes_per_source"):
        with pytest.raises(ValueError):
            DhtLimits(**{field: 0})


def test_a_request_carries_an_optional_token_after_its_arguments() -> None:
    me, key, token = b"n" * 20, b"k" * 20, b"t" * 16
    assert parse_request(["find_value", [me, key]]) == ("find_value", [me, key], None)
    assert parse_request(["find_value", [me, key, token]]) == ("find_value", [me, key], token)
    assert parse_request(["token", [me]]) == ("token", [me], None)
    assert parse_request(["find_value", [me, key, b"short"]]) is None
    assert parse_request(["find_value", [me, key, token, token]]) is None
    assert parse_request(["stun", []]) is None
    assert is_challenge({"token": token})
    assert not is_challenge({"token": token, "value": b""}) and not is_challenge(token)


# --- the shelf: per-source caps, room made from the fattest source --------------------------


def note(who: Identity, subject: bytes) -> Record:
    return new_record(
        who,
        0x21,
        {"x": "y"},
        now_ms=NOW,
        version=record_version(NOW, bytes(10)),
        ttl_ms=3_600_000,
        subject_id=subject,
    )


FLOODER, HONEST = b"f" * 20, b"h" * 20
WHO = Identity(bytes(range(1, 33)))


def offer(s: RecordShelf, subject: bytes, source: bytes) -> bool:
    rec = note(WHO, subject)
    return s.accept(dht_id(rec.storage_key()), rec, NOW, source)


def test_one_source_holds_at_most_its_share() -> None:
    one = len(cbor.encode(note(WHO, b"0").to_wire()))
    s = RecordShelf(DhtLimits(records_per_source=3, bytes_per_source=10 * one), lambda: NOW)
    assert [offer(s, bytes([i]), FLOODER) for i in range(5)] == [True] * 3 + [False] * 2
    assert s.stats["refused_source_records"] == 2
    assert offer(s, b"h", HONEST) and offer(s, b"l", LOCAL)
    s = RecordShelf(DhtLimits(bytes_per_source=2 * one + 1), lambda: NOW)
    assert [offer(s, bytes([i]), FLOODER) for i in range(3)] == [True, True, False]
    assert s.stats["refused_source_bytes"] == 1


def test_a_full_shelf_makes_room_from_the_fattest_source_never_from_the_honest() -> None:
    s = RecordShelf(DhtLimits(records_total=6), lambda: NOW)
    assert offer(s, b"h", HONEST)
    assert all(offer(s, bytes([i]), FLOODER) for i in range(5))  # the shelf is full
    assert offer(s, b"l", LOCAL)  # this station's own put: the flooder's oldest goes
    assert s.records(dht_id(note(WHO, bytes([0])).storage_key()), NOW) == []
    assert offer(s, b"h2", HONEST)  # a smaller source: the flooder's next oldest goes
    assert not offer(s, b"more", FLOODER)  # the fattest source displaces no one
    assert s.stats["refused_total_records"] == 1 and s.stats["dropped_for_room"] == 2
    for subject in (b"h", b"h2", b"l"):
        assert s.records(dht_id(note(WHO, subject).storage_key()), NOW)
    assert s.rows == 6
