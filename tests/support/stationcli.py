"""The station's command line, parsed as ``macula-relay`` parses it (data dir ``/tmp/x``)."""

from __future__ import annotations

from relay.ops.cli import build_parser, config_from_args


def cli_config(*argv: str) -> object:
    """The ``StationConfig`` ``macula-relay --data-dir /tmp/x ARGV`` runs with."""
    return config_from_args(build_parser().parse_args(["--data-dir", "/tmp/x", *argv]))
