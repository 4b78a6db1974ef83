"""``macula-mcp http-token [--agent NAME]`` and ``macula-mcp mcp-config --http``: the bearer
token of the daemon's ``/mcp`` (made on first use), and the HTTP entry to paste into a harness.

Both print a secret on stdout, on purpose (it is what was asked for) and nothing else there;
what is said about it goes to stderr. ``register --http`` writes the entry instead
(``tools.harness.register``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from macula.config import STATIONS_ENV, macula_home
from macula.errors import ConfigError
from tools.commands import parser_for
from tools.daemon.http.tokens import agent_token, check_agent_name
from tools.harness.http_register import http_target, mcp_config_http

COMMANDS = ("http-token", "mcp-config")


def _http_token(argv: Sequence[str]) -> int:
    parser = parser_for(
        "http-token",
        "Print the bearer token of the daemon's HTTP /mcp endpoint (made on first use) on "
        "stdout: a secret, keep it out of shared files.",
    )
    parser.add_argument("--agent", help="this agent's token (default: the home's)")
    args = parser.parse_args(argv)
    from tools.daemon.http.home_token import home_token

    home = macula_home(os.environ)
    if args.agent is None:
        print(home_token(home))
    else:
        print(agent_token(home, check_agent_name(args.agent)))
    print("macula-mcp http-token: a secret: keep it out of shared files", file=sys.stderr)
    return 0


def mcp_config_parser() -> argparse.ArgumentParser:
    """``macula-mcp mcp-config``: the stdio forms (``tools.cli``) and ``--http`` (here)."""
    parser = parser_for(
        "mcp-config",
        "Print the entry to paste into an MCP client's configuration (JSON, under "
        f"mcpServers.macula). {STATIONS_ENV}, when set, is copied into its env.",
    )
    parser.add_argument(
        "--attach", action="store_true", help="the `macula-mcp attach` form (through the daemon)"
    )
    parser.add_argument(
        "--http",
        action="store_true",
        help="the daemon's http://127.0.0.1:PORT/mcp with a bearer token, instead of a command",
    )
    parser.add_argument("--agent", help="--http: this agent's token (default: the home's)")
    parser.add_argument("--port", type=int, help="--http: this port (default: the daemon's)")
    return parser


def _mcp_config(argv: Sequence[str]) -> int:
    parser = mcp_config_parser()
    args = parser.parse_args(argv)
    if not args.http or args.attach:
        parser.error("--http goes without --attach (mcp-config --attach is the stdio form)")
    target = http_target(macula_home(os.environ), args.agent, args.port)
    print(json.dumps(mcp_config_http(target), indent=2))
    print(
        "macula-mcp mcp-config: the entry holds a bearer token; keep its file private",
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str]) -> int:
    """``argv`` starts with one of ``COMMANDS``; the exit code (1 with a one-line error)."""
    command, rest = argv[0], list(argv[1:])
    try:
        return _http_token(rest) if command == "http-token" else _mcp_config(rest)
    except (ConfigError, OSError) as exc:
        print(f"macula-mcp {command}: {exc}", file=sys.stderr)
        return 1
