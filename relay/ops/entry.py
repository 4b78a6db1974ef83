"""The ``macula-relay`` entry point: a bad ``MACULA_QUIC`` is found while the station's modules
are imported (the QUIC backend is chosen then), before ``relay.ops.cli`` can parse anything, so it
is reported here as one line and exit 2, not a traceback."""

from __future__ import annotations

import sys

from macula.errors import ConfigError


def main() -> None:
    try:
        from relay.ops.cli import main as cli
    except ConfigError as exc:
        print(f"macula-relay: {exc}", file=sys.stderr)
        sys.exit(2)
    cli()
