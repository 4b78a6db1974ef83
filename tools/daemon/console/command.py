"""``macula-mcp console [--open]``: the URL of this home's console, starting the daemon if needed.

Invariants:
- the daemon is reached (or started) as ``macula-mcp attach`` does (``tools.daemon.attach``), then
  asked for its status until it names the port its HTTP listener got (``http_port``);
- stdout carries the URL only, ``http://127.0.0.1:PORT/?token=…`` (the token is the home's,
  ``tools.daemon.http.home_token``); without ``--open`` no browser is started;
- failures go to stderr with exit status 1 (2 for a setting), as ``attach`` reports them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Final

from tools.commands import parser_for
from tools.daemon import protocol
from tools.daemon.attach import AttachError, handshake, reach_daemon, start_timeout
from tools.daemon.http.home_token import home_token
from tools.settings import SocketSetupError, home_dir, socket_path

POLL_S: Final = 0.05  # between status requests while the listener binds


def _port(env: Mapping[str, str], deadline: float) -> int:
    sock = socket_path(env)
    while True:
        conn = reach_daemon(env, sock)
        try:
            reply, _ = handshake(conn, "status", env, os.getppid())
        finally:
            conn.close()
        port = reply.get("http_port")
        if isinstance(port, int) and port > 0:
            return port
        if "http_port" not in reply:
            raise AttachError("the daemon running here has no console: restart it", 1)
        if time.monotonic() >= deadline:
            raise AttachError("the daemon's HTTP listener did not start; see its log", 1)
        time.sleep(POLL_S)  # the daemon binds its HTTP port right after its socket


def console_url(env: Mapping[str, str]) -> str:
    """The console's URL, the daemon started first when none runs."""
    deadline = time.monotonic() + start_timeout(env)
    port = _port(env, deadline)
    return f"http://127.0.0.1:{port}/?token={home_token(home_dir(env))}"


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> None:
    parser = parser_for("console", "Print (and with --open, open) the URL of this home's console.")
    parser.add_argument("--open", action="store_true", help="open it in the default browser")
    args = parser.parse_args(list(argv or []))
    environ = dict(os.environ if env is None else env)
    try:
        url = console_url(environ)
    except AttachError as exc:
        print(f"macula-mcp console: {exc}", file=sys.stderr)
        raise SystemExit(exc.status) from None
    except (SocketSetupError, protocol.PreambleError, OSError) as exc:
        print(f"macula-mcp console: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(url, flush=True)
    if args.open:
        import webbrowser

        webbrowser.open(url)
