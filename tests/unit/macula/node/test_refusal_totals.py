"""``Refusals`` (``macula.node.stats``): what a ``Node`` learns from the station's refusal
counters (issue 38): totals that only grow, across connections whose counters restart at 0,
each rise told once; an answer from a connection no longer current is returned, not kept."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from macula.node.stats import NodeStats, Refusal, Refusals
from macula.services.refusals import ADVERTISE_TAKEN, PUBLISH_RATE_LIMITED, SUBSCRIPTION_QUOTA


def ping(**counts: object) -> dict[str, object]:
    return {"pong": 1, "refused": counts}


def test_a_rise_is_added_to_the_totals_and_told_once() -> None:
    refusals = Refusals()
    heard: list[Refusal] = []
    refusals.on_refusal(heard.append)
    assert refusals.learned(ping()) == {}
    assert refusals.learned(ping(advertise_taken=2)) == {ADVERTISE_TAKEN: 2}
    assert refusals.learned(ping(advertise_taken=2)) == {ADVERTISE_TAKEN: 2}  # no rise
    refusals.learned(ping(advertise_taken=3, subscription_quota=1))
    assert heard == [
        Refusal(ADVERTISE_TAKEN, 2),
        Refusal(ADVERTISE_TAKEN, 1),
        Refusal(SUBSCRIPTION_QUOTA, 1),
    ]
    assert refusals.total == {ADVERTISE_TAKEN: 3, SUBSCRIPTION_QUOTA: 1}


def test_totals_carry_over_a_new_connection_whose_counters_start_at_zero() -> None:
    refusals = Refusals()
    refusals.learned(ping(publish_rate_limited=4))
    since = Counter(refusals.total)
    refusals.reconnecting()
    assert refusals.current == {}
    refusals.learned(ping(publish_rate_limited=1))  # the new connection's first
    assert refusals.total == {PUBLISH_RATE_LIMITED: 5}
    assert refusals.risen(since) == [PUBLISH_RATE_LIMITED]
    assert refusals.risen(since, frozenset({ADVERTISE_TAKEN})) == []


def test_an_answer_from_an_old_connection_is_returned_not_kept() -> None:
    refusals = Refusals()
    assert refusals.learned(ping(advertise_taken=1), current=False) == {ADVERTISE_TAKEN: 1}
    assert refusals.total == {}
    assert refusals.current == {}


@pytest.mark.parametrize("answer", [None, [], {"refused": [1]}, ping(x="1", y=True, z=2)])
def test_a_malformed_answer_counts_only_its_int_counters(answer: object) -> None:
    refusals = Refusals()
    counts = refusals.learned(answer)
    assert counts == ({"z": 2} if isinstance(answer, dict) and "z" in answer["refused"] else {})


def test_a_listener_that_raises_is_logged_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = Refusals()
    heard: list[Refusal] = []

    def broken(refusal: Refusal) -> None:
        raise RuntimeError("listener bug")

    refusals.on_refusal(broken)
    refusals.on_refusal(heard.append)
    with caplog.at_level(logging.ERROR, logger="macula.node.node"):
        refusals.learned(ping(advertise_taken=1))
    assert heard == [Refusal(ADVERTISE_TAKEN, 1)]
    assert "refusal listener failed" in caplog.text


def test_the_stats_show_the_current_connections_counters() -> None:
    stats = NodeStats()
    stats.refusals.learned(ping(subscription_quota=2))
    assert stats.refused == {SUBSCRIPTION_QUOTA: 2}
