"""The ``macula-mcp`` entry point: ``attach`` and ``daemon`` are dispatched before anything heavy
is imported (attach must start in a few tens of milliseconds); the rest goes to ``tools.cli``.
The server itself starts its stdio front first (``tools.stdio.front``), so the harness's
opening request is answered while the SDK is still being imported."""

from __future__ import annotations

import os
import sys


def main() -> None:
    if sys.argv[1:] in ([], ["serve"]):  # the MCP server: read stdin before anything heavy
        from tools.stdio import front as stdio_front

        stdio_front.start(os.environ)
    from macula.errors import ConfigError

    try:
        _dispatch()
    except ConfigError as exc:  # a bad MACULA_QUIC surfaces while the modules are imported
        print(f"macula-mcp: {exc}", file=sys.stderr)
        sys.exit(2)


def _dispatch() -> None:
    if sys.argv[1:] in (["attach", "-h"], ["attach", "--help"]):  # argparse only for help
        from tools.commands import parser_for

        parser_for("attach").parse_args(["--help"])
    if sys.argv[1:2] == ["attach"]:
        from tools.daemon.attach import main as attach

        attach(sys.argv[2:])
        return
    if sys.argv[1:2] == ["daemon"]:  # status and stop stay fast too
        from tools.daemon.command import main as daemon

        daemon(sys.argv[2:])
        return
    from tools.cli import main as cli

    cli()
