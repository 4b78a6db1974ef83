"""``macula.client.station_choice``: round robin failover, backoff only after a whole round
failed."""

from __future__ import annotations

import pytest

from macula.client.backoff import Backoff
from macula.client.station_choice import StationChoice, StationInfo, station_list
from macula.errors import ConfigError, MaculaError
from macula.stations import StationAddress

# no jitter: the factor drawn is always the middle of the range
STEADY = Backoff(initial_s=1.0, factor=2.0, max_s=8.0, jitter=0.2, uniform=lambda a, b: (a + b) / 2)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_lost_station_moves_to_the_next_at_once() -> None:
    clock = FakeClock()
    choice = StationChoice(3, STEADY, settle_s=10)
    choice.connected(clock())
    clock.now += 60  # a settled connection
    step = choice.lost(clock())
    assert (step.index, step.wait_s, step.round_failed) == (1, 0.0, 0)
    choice.connected(clock())
    clock.now += 60
    assert choice.lost(clock()).index == 2  # onwards from where it failed, not back to 0
    choice.connected(clock())
    clock.now += 60
    assert choice.lost(clock()).index == 0  # and round the list


def test_it_waits_only_after_every_station_failed_and_the_wait_grows_to_its_cap() -> None:
    clock = FakeClock()
    choice = StationChoice(3, STEADY)
    choice.connected(clock())
    clock.now += 60
    assert choice.lost(clock()).wait_s == 0  # station 0 lost: try 1
    assert choice.failed(clock()).wait_s == 0  # 1 failed: try 2
    step = choice.failed(clock())  # 2 failed: all three failed in a row
    assert (step.index, step.wait_s, step.round_failed, step.rounds_failed) == (0, 1.0, 1, 1)
    waits = []
    for _ in range(5):  # five more whole rounds fail
        steps = [choice.failed(clock()) for _ in range(3)]
        assert [s.wait_s for s in steps[:2]] == [0, 0]  # never inside a round
        waits.append(steps[2].wait_s)
    assert waits == [2.0, 4.0, 8.0, 8.0, 8.0]  # doubling, capped at max_s


def test_jitter_comes_from_the_injected_randomness() -> None:
    drawn: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high))
        return high

    choice = StationChoice(1, Backoff(initial_s=1.0, jitter=0.25, uniform=uniform))
    assert choice.failed(0).wait_s == 1.25
    assert drawn == [(0.75, 1.25)]


def test_a_settled_connection_starts_a_fresh_round() -> None:
    clock = FakeClock()
    choice = StationChoice(2, STEADY, settle_s=10)
    for _ in range(3):  # three failed rounds: the next wait would be 8 s
        choice.failed(clock())
        choice.failed(clock())
    assert choice.rounds_failed == 3
    choice.connected(clock())  # station 0 accepts and stays up
    clock.now += 10
    step = choice.lost(clock())
    assert (step.index, step.wait_s) == (1, 0.0)
    step = choice.failed(clock())  # station 1 fails too: the first wait again, not the fourth
    assert (step.index, step.wait_s, step.rounds_failed) == (0, 1.0, 1)


def test_a_station_that_drops_us_at_once_cannot_make_the_node_spin() -> None:
    clock = FakeClock()
    choice = StationChoice(2, STEADY, settle_s=10)
    waits = []
    for _ in range(4):  # both stations accept, then drop us within a second
        choice.connected(clock())
        clock.now += 0.5
        waits.append(choice.lost(clock()).wait_s)
    assert waits == [0.0, 1.0, 0.0, 2.0]  # a short-lived connection is a failure


def test_a_single_station_waits_before_every_retry() -> None:
    choice = StationChoice(1, STEADY)
    assert [choice.failed(0).wait_s for _ in range(3)] == [1.0, 2.0, 4.0]
    assert choice.index == 0


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(MaculaError):
        StationChoice(0, STEADY)
    with pytest.raises(MaculaError):
        StationChoice(1, STEADY, settle_s=-1)


def test_station_lists_keep_the_single_address_form_and_name_a_bad_entry() -> None:
    assert station_list("127.0.0.1:9") == [StationAddress("127.0.0.1", 9)]
    one = StationAddress("h", 1)
    assert station_list(one) == [one]
    assert station_list(["h:1", one.__class__("h", 2)]) == [one, StationAddress("h", 2)]
    with pytest.raises(ConfigError, match=r"^stations: .*at least one"):
        station_list([])
    with pytest.raises(ConfigError, match=r"'zz@h:3': node id is not hex"):
        station_list(["h:1", "zz@h:3"])
    with pytest.raises(ConfigError, match=r"entry 3 \(h:1\) names the same station as entry 1"):
        station_list(["H:1", "h:2", "h:1"], source="here")


def test_station_info_gives_the_pinned_endpoint() -> None:
    key = bytes(range(32))
    info = StationInfo(key, StationAddress("::1", 4433), 1)
    assert info.endpoint == f"{key.hex()}@[::1]:4433"
