"""The station directory (relay.house.stations): listing, filters, nearness, its own record.

Coroutines run with ``asyncio.run`` (no pytest-asyncio).
"""

from __future__ import annotations

import math
import os
from typing import Any, TypeVar

import pytest

from macula.services.house import LIST_STATIONS
from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.identity import Identity
from macula.wire.records import RecordType, validate_payload
from relay.builtins.outcome import Outcome
from relay.house.stations import (
    MAX_KNOWN_STATIONS,
    StationDirectory,
    StationEntry,
    StationInfo,
    haversine_km,
)
from support.housekit import assert_no_booleans, ok, refused
from support.running import run

T = TypeVar("T")

NOW_MS = 1_767_225_600_000
BAD = ErrorCode.UNKNOWN_ERROR
STATION_ID = bytes(range(100, 132))
ALICE = Identity.generate(os.urandom)


# --- the station directory --------------------------------------------------------------------

BERLIN = StationInfo("berlin.example", 4433, "Berlin", "DE", "Europe", 52.52, 13.405)
STATIONS = {
    bytes([1]) * 32: StationInfo("paris.example", 4433, "Paris", "FR", "Europe", 48.8566, 2.3522),
    bytes([2]) * 32: StationInfo("hamburg.example", 443, "Hamburg", "DE", "Europe", 53.55, 9.99),
    bytes([3]) * 32: StationInfo("tokyo.example", 4433, "Tokyo", "JP", "Asia", 35.68, 139.69),
    bytes([4]) * 32: StationInfo(
        "nyc.example", 4433, "New York", "US", "North America", 40.71, -74
    ),
    bytes([5]) * 32: StationInfo("nowhere.example", 4433, country="DE"),
}


def station_directory() -> StationDirectory:
    directory = StationDirectory(STATION_ID, BERLIN)
    for node_id, info in STATIONS.items():
        assert directory.add_known(StationEntry(node_id, info))
    return directory


def list_stations(directory: StationDirectory, payload: object) -> Outcome:
    return run(directory.handle(LIST_STATIONS, payload, ALICE.node_id, NOW_MS))


def hosts(result: Any) -> list[str]:
    assert result["count"] == len(result["stations"])
    return [station["host"] for station in result["stations"]]


@pytest.mark.parametrize("payload", [None, {}, {"unknown": 1}])
def test_list_stations_without_filters_lists_every_station_own_first(payload: object) -> None:
    result = ok(list_stations(station_directory(), payload))
    assert hosts(result) == [
        "berlin.example",
        "paris.example",
        "hamburg.example",
        "tokyo.example",
        "nyc.example",
        "nowhere.example",
    ]
    own = result["stations"][0]
    assert own == {
        "node_id": STATION_ID.hex(),
        "host": "berlin.example",
        "port": 4433,
        "city": "Berlin",
        "country": "DE",
        "continent": "Europe",
        "lat": 52.52,
        "lng": 13.405,
    }
    assert result["stations"][-1]["lat"] is None
    assert_no_booleans(result)
    cbor.encode(result)  # the result travels as CBOR


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"country": "de"}, ["berlin.example", "hamburg.example", "nowhere.example"]),
        ({"country": "DE", "city": "HAMBURG"}, ["hamburg.example"]),
        ({"continent": "europe"}, ["berlin.example", "paris.example", "hamburg.example"]),
        ({"continent": "north america"}, ["nyc.example"]),
        ({"city": "Ber"}, []),  # exact, not a prefix
        ({"country": "FR", "continent": "Asia"}, []),
        ({"country": None, "city": "tokyo"}, ["tokyo.example"]),  # null is absent
    ],
)
def test_list_stations_filters_match_case_insensitively_and_exactly(
    payload: dict[str, object], expected: list[str]
) -> None:
    assert hosts(ok(list_stations(station_directory(), payload))) == expected


def test_near_sorts_by_great_circle_distance_and_skips_unplaced_stations() -> None:
    directory = station_directory()
    result = ok(list_stations(directory, {"near": {"lat": 50.11, "lng": 8.68}}))  # Frankfurt
    assert hosts(result) == [
        "hamburg.example",
        "berlin.example",
        "paris.example",
        "nyc.example",
        "tokyo.example",
    ]
    distances = [station["distance_km"] for station in result["stations"]]
    assert distances == sorted(distances)
    assert 420 < distances[1] < 430  # Frankfurt-Berlin is about 424 km
    assert distances[1] == round(haversine_km(50.11, 8.68, 52.52, 13.405), 3)
    assert_no_booleans(result)

    limited = ok(list_stations(directory, {"near": {"lat": 35, "lng": 139, "limit": 2}}))
    assert hosts(limited) == ["tokyo.example", "berlin.example"]
    filtered = ok(list_stations(directory, {"near": {"lat": 0, "lng": 0}, "country": "de"}))
    assert hosts(filtered) == ["berlin.example", "hamburg.example"]
    no_near = ok(list_stations(directory, {"country": "JP"}))
    assert "distance_km" not in no_near["stations"][0]


def test_near_cuts_to_ten_by_default() -> None:
    directory = StationDirectory(STATION_ID, BERLIN)
    for n in range(1, 15):
        info = StationInfo(f"s{n}.example", 4433, lat=n / 10, lng=0.0)
        directory.add_known(StationEntry(bytes([15 - n]) * 32, info))
    result = ok(list_stations(directory, {"near": {"lat": 0, "lng": 0}}))
    assert hosts(result) == [f"s{n}.example" for n in range(1, 11)]


def test_haversine_known_distances() -> None:
    assert haversine_km(0, 0, 0, 0) == 0
    assert math.isclose(haversine_km(0, 0, 0, 180), math.pi * 6371.0088)
    assert math.isclose(haversine_km(90, 0, -90, 0), math.pi * 6371.0088)
    assert math.isclose(haversine_km(51.5074, -0.1278, 48.8566, 2.3522), 343.5, abs_tol=1)


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ([1, 2], "the argument must be a map, got array"),
        ("near", "the argument must be a map, got text"),
        ({"near": [52, 13]}, "'near' must be a map, got array"),
        ({"near": {"lng": 13}}, "missing 'near.lat'"),
        ({"near": {"lat": 52}}, "missing 'near.lng'"),
        ({"near": {"lat": "52", "lng": 13}}, "'near.lat' must be a number -90..90, got text"),
        ({"near": {"lat": 91, "lng": 13}}, "'near.lat' must be a number -90..90, got int 91"),
        ({"near": {"lat": 1, "lng": -180.5}}, "'near.lng' must be a number -180..180"),
        ({"near": {"lat": True, "lng": 13}}, "'near.lat' must be a number -90..90, got bool"),
        ({"near": {"lat": math.nan, "lng": 13}}, "'near.lat' must be a number"),
        ({"near": {"lat": 1, "lng": math.inf}}, "'near.lng' must be a number"),
        ({"near": {"lat": 1, "lng": 1, "limit": 0}}, "'near.limit' must be an int 1..100"),
        ({"near": {"lat": 1, "lng": 1, "limit": 101}}, "'near.limit' must be an int 1..100"),
        ({"near": {"lat": 1, "lng": 1, "limit": 2.0}}, "'near.limit' must be an int 1..100"),
        ({"near": {"lat": 1, "lng": 1, "limit": False}}, "'near.limit' must be an int 1..100"),
        ({"country": 49}, "'country' must be 1..100 characters of text, got int 49"),
        ({"city": ""}, "'city' must be 1..100 characters of text, got text(0 chars)"),
        ({"continent": "x" * 101}, "'continent' must be 1..100 characters of text"),
        ({"city": b"Berlin"}, "'city' must be 1..100 characters of text, got bytes(6)"),
        ({"city": "\ud800"}, "'city' must be 1..100 characters of text"),
    ],
)
def test_list_stations_refuses_bad_arguments_naming_the_problem(
    payload: object, named: str
) -> None:
    detail = refused(list_stations(station_directory(), payload), "bad_request")
    assert named in detail


def test_unknown_procedures_and_garbage_are_refused_not_raised() -> None:
    directory = station_directory()
    detail = refused(
        run(directory.handle("macula.agents.list_v1", {}, ALICE.node_id, NOW_MS)),
        "unknown_procedure",
    )
    assert LIST_STATIONS in detail
    odd: Any = 7
    assert run(directory.handle(odd, {}, ALICE.node_id, NOW_MS)).code == BAD
    garbage: list[object] = [b"", 1.5, {1: 2}, {"near": None}, {"near": {"lat": {}, "lng": []}}]
    for payload in garbage:
        assert isinstance(list_stations(directory, payload), Outcome)


def test_own_record_payload_is_a_valid_node_record_with_text_coordinates() -> None:
    payload = station_directory().own_record_payload()
    assert payload == {
        "node_id": STATION_ID,
        "station_id": STATION_ID,
        "realms": [],
        "capabilities": 1,
        "hostname": "berlin.example",
        "endpoint": "quic://berlin.example:4433",
        "kind": "station",
        "city": "Berlin",
        "country": "DE",
        "lat": "52.52",
        "lng": "13.405",
    }
    validate_payload(RecordType.NODE_RECORD, payload)
    cbor.encode(payload)


def test_own_record_payload_omits_absent_fields_and_writes_odd_coordinates_plainly() -> None:
    bare = StationDirectory(STATION_ID, StationInfo("10.0.0.1", 4433)).own_record_payload()
    assert set(bare) == {
        "node_id",
        "station_id",
        "realms",
        "capabilities",
        "hostname",
        "endpoint",
        "kind",
    }
    assert None not in bare.values()
    validate_payload(RecordType.NODE_RECORD, bare)
    odd = StationInfo("h", 1, lat=-0.0000001, lng=180)
    placed = StationDirectory(STATION_ID, odd).own_record_payload()
    assert (placed["lat"], placed["lng"]) == ("0", "180")
    tiny = StationDirectory(STATION_ID, StationInfo("h", 1, lat=1e-5, lng=-33.8688))
    assert (tiny.own_record_payload()["lat"], tiny.own_record_payload()["lng"]) == (
        "0.00001",
        "-33.8688",
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"host": "", "port": 1},
        {"host": "h", "port": 0},
        {"host": "h", "port": 65536},
        {"host": "h", "port": True},
        {"host": "h", "port": 1, "city": ""},
        {"host": "h", "port": 1, "lat": 1.0},  # lat without lng
        {"host": "h", "port": 1, "lat": 91.0, "lng": 0.0},
        {"host": "h", "port": 1, "lat": math.nan, "lng": 0.0},
        {"host": "h", "port": 1, "lat": "1", "lng": "2"},
    ],
)
def test_station_info_refuses_bad_fields(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        StationInfo(**kwargs)


def test_add_known_replaces_by_node_id_refuses_own_and_is_capped() -> None:
    directory = StationDirectory(STATION_ID, BERLIN)
    node = bytes([9]) * 32
    directory.add_known(StationEntry(node, StationInfo("old.example", 1)))
    directory.add_known(StationEntry(node, StationInfo("new.example", 2)))
    assert [e.info.host for e in directory.entries()] == ["berlin.example", "new.example"]
    with pytest.raises(ValueError):
        directory.add_known(StationEntry(STATION_ID, BERLIN))
    with pytest.raises(ValueError):
        StationEntry(b"short", BERLIN)
    assert directory.forget(node) and not directory.forget(node)
    for n in range(MAX_KNOWN_STATIONS):
        assert directory.add_known(StationEntry(n.to_bytes(32, "big"), BERLIN))
    assert not directory.add_known(StationEntry(b"\xff" * 32, BERLIN))
    assert directory.add_known(StationEntry((5).to_bytes(32, "big"), BERLIN))  # an update
