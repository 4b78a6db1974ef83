"""``macula-mcp http-token [--agent NAME]`` and ``macula-mcp mcp-config --http``: the bearer
token of the daemon's ``/mcp`` (made on first use), and the HTTP entry to paste into a harness.

Both print a secret on stdout, on purpose (it is what was asked for) and nothing else there;
what is said about it goes to stderr. ``register --http`` writes the entry instead
(``tools.register``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from macula.config import macula_home
from macula.errors import ConfigError
from tools.http_register import http_target, mcp_config_http
from tools.mcp_http_tokens import agent_token, check_agent_name

COMMANDS = ("http-token", "mcp-config")


def _http_token(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="macula-mcp http-token")
    parser.add_argument("--agent", help="this agent's token (default: the home's)")
    args = parser.parse_args(argv)
    from tools.http_token import home_token

    home = macula_home(os.environ)
    if args.agent is None:
        print(home_token(home))
    else:
        print(agent_token(home, check_agent_name(args.agent)))
    print("macula-mcp http-token: a secret: keep it out of shared files", file=sys.stderr)
    return 0


def _mcp_config(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="macula-mcp mcp-config --http")
    parser.add_argument("--http", action="store_true", required=True)
    parser.add_argument("--agent", help="this agent's token (default: the home's)")
    parser.add_argument("--port", type=int, help="this port (default: the daemon's)")
    args = parser.parse_args(argv)
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
