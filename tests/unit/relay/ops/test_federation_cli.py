"""``macula-relay --dht-port``: parsed, checked, passed to the station's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.ops.cli import build_parser, config_from_args
from support.stationcli import cli_config


def test_the_dht_port_defaults_to_the_stations_choice() -> None:
    parsed = config_from_args(build_parser().parse_args(["--data-dir", str(Path("/tmp/x"))]))
    assert parsed.dht_port is None


def test_a_dht_port_is_passed_on() -> None:
    parsed = config_from_args(
        build_parser().parse_args(["--data-dir", "/tmp/x", "--dht-port", "0"])
    )
    assert parsed.dht_port == 0
    parsed = config_from_args(
        build_parser().parse_args(["--data-dir", "/tmp/x", "--port", "5000", "--dht-port", "6000"])
    )
    assert (parsed.port, parsed.dht_port) == (5000, 6000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dht-port", "70000"], "--dht-port must be 0..65535"),
        (["--dht-port", "-1"], "--dht-port must be 0..65535"),
        (["--port", "5000", "--dht-port", "5000"], "cannot share the QUIC --port"),
    ],
)
def test_bad_dht_ports_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_config(*argv)
    assert message in str(exited.value)
