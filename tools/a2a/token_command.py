"""``macula-mcp a2a-token create|list|revoke``: the owner's A2A clients (``tools.a2a.tokens``).

``create`` prints the token on stdout, once (it is stored hashed: it cannot be shown again), and
nothing else there; what is said about it goes to stderr. ``list`` shows no secret.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from macula.clock import now_ms
from macula.config import macula_home
from macula.errors import ConfigError
from tools.a2a import tokens
from tools.commands import parser_for
from tools.daemon.http.tokens import DEFAULT_AGENT


def main(argv: Sequence[str]) -> int:
    """The exit code (1 with a one-line error on stderr)."""
    parser = parser_for(
        "a2a-token",
        "Make, list or revoke the bearer tokens of A2A clients: each reaches one agent of this "
        "home through the daemon's A2A door (/a2a/AGENT/), as a mesh identity of its own.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    made = sub.add_parser("create", help="a new client; its token is printed once, on stdout")
    made.add_argument("name", help="the client's name (1-64 letters, digits, - or _)")
    made.add_argument(
        "--agent", default=DEFAULT_AGENT, help="the agent it reaches (default: the home's)"
    )
    sub.add_parser("list", help="every client: name, agent, node id (no secret)")
    gone = sub.add_parser("revoke", help="remove a client: its token stops working at once")
    gone.add_argument("name")
    args = parser.parse_args(list(argv))
    home = macula_home(os.environ)
    try:
        if args.action == "create":
            client, token = tokens.create(home, args.name, args.agent, now_ms())
            print(token)
            print(
                f"macula-mcp a2a-token: client {client.name} reaches agent {client.agent} at "
                f"/a2a/{client.agent}/ as mesh node {client.node_id[:16]}; the token is a "
                "secret, shown only now",
                file=sys.stderr,
            )
        elif args.action == "list":
            for client in tokens.clients(home):
                print(f"{client.name}\tagent={client.agent}\tnode_id={client.node_id}")
        else:
            if not tokens.revoke(home, args.name):
                raise ConfigError(f"no A2A client {args.name!r} (see macula-mcp a2a-token list)")
            print(f"macula-mcp a2a-token: {args.name} revoked", file=sys.stderr)
    except (ConfigError, OSError) as exc:
        print(f"macula-mcp a2a-token: {exc}", file=sys.stderr)
        return 1
    return 0
