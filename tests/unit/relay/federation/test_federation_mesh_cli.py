"""``macula-relay``'s federation knobs: parsed, checked, passed to the station's config."""

from __future__ import annotations

import pytest

from relay.core.policy import StationPolicy
from relay.federation.dht.storage import DhtLimits
from support.stationcli import cli_config


def test_the_defaults_are_the_stations() -> None:
    parsed, policy, limits = cli_config(), StationPolicy(), DhtLimits()
    assert parsed.policy.max_inbound_links == policy.max_inbound_links == 64
    assert parsed.policy.quotas.station_event_rate == policy.quotas.station_event_rate
    assert parsed.policy.replay_cache_per_link == policy.replay_cache_per_link
    assert parsed.discover_interval_s == 30.0 and parsed.known_peers_max == 256
    assert parsed.dht.limits == limits


def test_every_federation_flag_reaches_the_config() -> None:
    parsed = cli_config(
        *("--max-inbound-links", "3", "--discover-interval", "2.5"),
        *("--known-peers-max", "0", "--station-event-rate", "500"),
        *("--replay-cache-per-link", "1000", "--replay-signers-per-link", "100"),
        *("--dht-max-records", "10", "--dht-max-bytes", "20000"),
        *("--dht-max-records-per-signer", "5", "--dht-max-bytes-per-signer", "9000"),
    )
    policy = parsed.policy
    assert policy.max_inbound_links == 3 and parsed.discover_interval_s == 2.5
    assert parsed.known_peers_max == 0
    assert (policy.quotas.station_event_rate, policy.quotas.station_event_burst) == (500, 1000)
    assert (policy.replay_cache_per_link, policy.replay_signers_per_link) == (1000, 100)
    limits = parsed.dht.limits
    assert (limits.records_total, limits.bytes_total) == (10, 20000)
    assert (limits.records_per_signer, limits.bytes_per_signer) == (5, 9000)


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-inbound-links", "0"],
        ["--discover-interval", "0"],
        ["--discover-interval", "soon"],
        ["--station-event-rate", "-1"],
        ["--replay-cache-per-link", "0"],
        ["--dht-max-records", "0"],
    ],
)
def test_bad_values_are_refused_naming_the_flag(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli_config(*argv)
    assert argv[0] in capsys.readouterr().err


def test_a_negative_known_peers_max_is_refused() -> None:
    with pytest.raises(SystemExit, match="--known-peers-max must be >= 0"):
        cli_config("--known-peers-max", "-1")
