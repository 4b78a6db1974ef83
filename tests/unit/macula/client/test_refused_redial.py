"""``macula.client.station_choice`` and ``macula.client.backoff``: a station refused by ICMP "port
unreachable"
(its host up, its process down: restarting) is redialled every 0.25-0.5 s for at most 120 s,
instead of the doubling backoff; failover to the other stations of the list still comes first."""

from __future__ import annotations

import pytest

from macula.client.backoff import Backoff
from macula.client.station_choice import StationChoice
from macula.errors import ConfigError

# no jitter: the middle of each range (backoff 1, 2, 4, 8 s; a redial 0.375 s)
STEADY = Backoff(initial_s=1.0, factor=2.0, max_s=8.0, jitter=0.2, uniform=lambda a, b: (a + b) / 2)
QUICK = 0.375


def settled(count: int = 1) -> StationChoice:
    """A choice over ``count`` stations, connected to the first since t=0, settled at t=60."""
    choice = StationChoice(count, STEADY, settle_s=10)
    choice.connected(0.0)
    return choice


def test_a_single_station_refused_after_a_settled_connection_is_redialled_quickly() -> None:
    choice = settled()
    step = choice.lost(60.0, refused=True)  # the probe met ICMP: the process is down
    assert (step.index, step.wait_s, step.quick, step.round_failed) == (0, QUICK, 1, 1)
    assert step.rounds_failed == 0  # a quick round is not a failed round
    for second in range(61, 180):  # refused again and again: quick while the window is open
        step = choice.failed(float(second), refused=True)
        assert (step.wait_s, step.quick, step.rounds_failed) == (QUICK, 1, 0)
    step = choice.failed(180.0, refused=True)  # 120 s after the first refusal: the backoff
    assert (step.wait_s, step.quick, step.rounds_failed) == (1.0, 0, 1)
    waits = [choice.failed(181.0 + n, refused=True).wait_s for n in range(4)]
    assert waits == [2.0, 4.0, 8.0, 8.0]  # doubling to its cap, as for any failure


def test_a_refused_station_lets_the_node_move_on_to_the_next_at_once() -> None:
    choice = settled(3)
    step = choice.lost(60.0, refused=True)
    assert (step.index, step.wait_s, step.quick) == (1, 0.0, 0)  # failover first, no wait
    step = choice.failed(60.0, refused=True)
    assert (step.index, step.wait_s, step.quick) == (2, 0.0, 0)
    step = choice.failed(60.1, refused=True)  # every station refused: the short wait
    assert (step.index, step.wait_s, step.quick, step.round_failed) == (0, QUICK, 1, 1)
    steps = [choice.failed(61.0, refused=True) for _ in range(3)]  # round robin, as before
    assert [(s.index, s.wait_s) for s in steps] == [(1, 0.0), (2, 0.0), (0, QUICK)]


def test_a_round_with_a_silent_station_waits_the_backoff() -> None:
    choice = settled(2)
    choice.lost(60.0, refused=True)
    step = choice.failed(70.0)  # station 1 timed out silently: not known to be restarting
    assert (step.wait_s, step.quick, step.rounds_failed) == (1.0, 0, 1)
    choice.failed(71.0)  # the other way round: silent first, refused last
    step = choice.failed(71.0, refused=True)
    assert (step.wait_s, step.quick, step.rounds_failed) == (2.0, 0, 2)
    choice.failed(72.0, refused=True)  # a round refused everywhere: quick again (window open)
    step = choice.failed(72.0, refused=True)
    assert (step.wait_s, step.quick, step.rounds_failed) == (QUICK, 1, 2)


def test_a_silent_loss_then_refused_dials_are_quick() -> None:
    choice = settled()
    step = choice.lost(60.0)  # noticed by unanswered pings: the backoff
    assert (step.wait_s, step.quick) == (1.0, 0)
    step = choice.failed(61.0, refused=True)  # the dial meets ICMP: the process is down
    assert (step.wait_s, step.quick) == (QUICK, 1)


def test_before_the_first_connection_a_refusal_is_a_failure_like_any() -> None:
    choice = StationChoice(1, STEADY)
    steps = [choice.failed(float(n), refused=True) for n in range(3)]
    assert [(s.wait_s, s.quick, s.rounds_failed) for s in steps] == [
        (1.0, 0, 1),
        (2.0, 0, 2),
        (4.0, 0, 3),
    ]  # so ``Node.__aenter__`` still gives up after ``first_connect_attempts`` rounds


def test_a_station_restarting_in_a_loop_gets_quick_redials_for_the_window_only() -> None:
    choice = settled()
    choice.lost(60.0, refused=True)  # the window opens at 60
    for second in range(61, 300, 2):  # accepted, then down again within settle_s, again
        choice.connected(float(second))
        step = choice.lost(second + 1.0, refused=True)
        assert step.quick == (second + 1 - 60 < 120)


def test_a_new_outage_after_a_settled_connection_opens_a_new_window() -> None:
    choice = settled()
    choice.lost(60.0, refused=True)
    assert choice.failed(200.0, refused=True).quick == 0  # that window has closed
    choice.connected(201.0)
    assert not choice.redialling(201.0)  # connecting does not reopen it: a settled loss does
    step = choice.lost(300.0, refused=True)  # up 99 s: a new outage
    assert (step.wait_s, step.quick, step.rounds_failed) == (QUICK, 1, 0)
    assert choice.redialling(419.0) and not choice.redialling(420.0)


def test_a_stateless_reset_still_redials_at_once_and_closes_the_window() -> None:
    choice = settled()
    choice.lost(60.0, refused=True)
    choice.connected(61.0)
    step = choice.ended(80.0, up=True, restarted=True, refused=True)  # the reset wins
    assert (step.index, step.wait_s, step.quick) == (0, 0.0, 0)
    assert not choice.redialling(80.0)


def test_ended_is_lost_when_it_was_up_and_failed_when_not() -> None:
    up = settled()
    assert up.ended(60.0, up=True, restarted=False, refused=True).quick == 1
    never = StationChoice(1, STEADY)
    assert never.ended(60.0, up=False, restarted=False, refused=True).quick == 0


def test_a_refused_station_gets_at_most_four_dials_a_second_from_one_node() -> None:
    fastest = Backoff(uniform=lambda a, b: a)  # the low end of every range: as fast as it goes
    choice = StationChoice(1, fastest, settle_s=10)
    choice.connected(0.0)
    now, dials = 60.0, 0
    step = choice.lost(now, refused=True)
    while step.quick:
        assert 0.25 <= step.wait_s <= 0.5
        now += step.wait_s
        dials += 1
        step = choice.failed(now, refused=True)
    assert now - 60.0 == pytest.approx(120.0, abs=0.5)
    assert dials / (now - 60.0) <= 4.0  # dials a second; each dial is one Initial datagram


def test_the_redial_is_jittered_by_the_injected_randomness_and_bounded() -> None:
    drawn: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high))
        return high + 5  # a careless source cannot push it past the bound

    backoff = Backoff(redial_min_s=0.2, redial_max_s=0.4, uniform=uniform)
    assert backoff.redial_delay() == 0.4
    assert drawn == [(0.2, 0.4)]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"redial_min_s": 0.0}, "redial_min_s"),
        ({"redial_min_s": -1.0}, "redial_min_s"),
        ({"redial_min_s": 1.0, "redial_max_s": 0.5}, "redial_max_s"),
        ({"redial_window_s": -1.0}, "redial_window_s"),
    ],
)
def test_bad_redial_settings_are_refused_naming_them(fields: dict[str, float], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Backoff(**fields)  # type: ignore[arg-type]


def test_a_zero_window_turns_the_quick_redial_off() -> None:
    choice = StationChoice(1, Backoff(redial_window_s=0.0, uniform=lambda a, b: (a + b) / 2))
    choice.connected(0.0)
    step = choice.lost(60.0, refused=True)
    assert (step.wait_s, step.quick) == (1.0, 0)


def test_the_short_redial_is_never_slower_than_a_shorter_backoff() -> None:
    brisk = Backoff(initial_s=0.05, max_s=0.2, jitter=0.0)  # as tests configure nodes
    choice = StationChoice(1, brisk, settle_s=10)
    choice.connected(0.0)
    steps = [choice.lost(60.0, refused=True)] + [
        choice.failed(60.0, refused=True) for _ in range(4)
    ]
    assert [(s.wait_s, s.quick) for s in steps] == [
        (0.05, 0),
        (0.1, 0),
        (0.2, 0),
        (0.2, 0),
        (0.2, 0),
    ]
