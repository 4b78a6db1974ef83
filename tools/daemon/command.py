"""``macula-mcp daemon start|stop|status``: the long-lived local service harness sessions attach to.

One daemon per ``MACULA_HOME`` (a lock beside its socket, ``tools.daemon.unix_socket``); the daemon
itself is ``tools.daemon.server`` (``start --foreground``). This module stays light (no MCP SDK,
no mesh library): ``status`` and ``stop`` answer in a few tens of milliseconds.

Settings (each with a default): ``MACULA_MCP_DAEMON_IDLE_S`` (24 h), ``MACULA_MCP_DAEMON_MAX_LINE``
(64 MiB per MCP message), ``MACULA_MCP_DAEMON_LOG_BYTES`` (1 MiB) and ``..._LOG_FILES`` (3),
``MACULA_MCP_DAEMON_START_S`` (30 s, ``tools.daemon.attach``), ``MACULA_MCP_SOCKET``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from tools.commands import parser_for
from tools.daemon import protocol
from tools.daemon.attach import AttachError, connect, handshake, reach_daemon
from tools.daemon.unix_socket import read_pid
from tools.settings import (
    DAEMON_IDLE_ENV,
    HOME_ENV,
    DaemonSettingError,
    DaemonSettings,
    SocketSetupError,
    socket_path,
)

STOP_WAIT_S: Final = 20.0


def _ask(env: Mapping[str, str], op: str) -> tuple[Path, dict[str, Any] | None]:
    sock = socket_path(env)
    conn = connect(sock)
    if conn is None:
        return sock, None
    with conn:
        reply, _ = handshake(conn, op, env, os.getppid())
    return sock, reply


def _print_status(reply: dict[str, Any]) -> None:
    print(f"pid: {reply['pid']}\nsocket: {reply['socket']}\nversion: {reply['version']}")
    print(f"log: {reply['log']}\nidle timeout: {reply['idle_timeout_s']:g} s")
    print(f"sessions attached: {reply['sessions']}")
    print(f"identities hosted: {len(reply['identities'])}")
    for one in reply["identities"]:
        print(
            f"  {one['node_id']}  sessions {one['sessions']}  present {one['present']}  "
            f"idle {one['idle_s']:g} s"
        )


def status(env: Mapping[str, str], as_json: bool) -> int:
    sock, reply = _ask(env, "status")
    if reply is None:
        if as_json:
            print(json.dumps({"running": 0, "socket": str(sock)}))
        else:
            print(f"no daemon runs on {sock}")
        return 1
    if as_json:
        print(json.dumps({"running": 1} | {k: v for k, v in reply.items() if k != "ok"}))
    else:
        _print_status(reply)
    return 0


def stop(env: Mapping[str, str], wait: float, clock: Callable[[], float] = time.monotonic) -> int:
    sock, reply = _ask(env, "stop")
    if reply is None:
        print(f"no daemon runs on {sock}")
        return 0
    pid = reply.get("pid")
    deadline = clock() + wait
    while clock() < deadline:
        if connect(sock) is None and not _alive(pid):
            print(f"daemon stopped (pid {pid})")
            return 0
        time.sleep(0.05)  # polling interval while the nodes say goodbye
    print(f"macula-mcp daemon: pid {pid} did not exit within {wait:g} s", file=sys.stderr)
    return 1


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie (our own child, in tests) is not alive
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def start(env: dict[str, str], foreground: bool) -> int:
    if foreground:
        from tools.daemon.server import run_foreground

        return run_foreground(env)
    sock = socket_path(env)
    if connect(sock) is not None:
        print(f"a daemon already runs on {sock} (pid {read_pid(sock)})")
        return 0
    with reach_daemon(env, sock) as conn:
        reply, _ = handshake(conn, "status", env, os.getppid())
    print(f"daemon started (pid {reply['pid']}, socket {sock}, log {reply['log']})")
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = parser_for(
        "daemon",
        f"The local service harness sessions attach to (one per {HOME_ENV}): it hosts each "
        "agent's node, so an agent stays on the mesh between sessions.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, summary, example in (
        ("start", "start the daemon (detached) unless one runs", "start --idle-timeout 3600"),
        ("stop", "stop the daemon: its nodes say goodbye", "stop"),
        ("status", "pid, socket, version, identities and sessions", "status --json"),
    ):
        sub.add_parser(
            action,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}.",
            epilog=f"example:\n  macula-mcp daemon {example}",
            formatter_class=parser.formatter_class,
        )
    starting = sub.choices["start"]
    starting.add_argument("--foreground", action="store_true", help="run in this process")
    starting.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help=f"sets {DAEMON_IDLE_ENV} (default 24 h)",
    )
    sub.choices["stop"].add_argument(
        "--wait",
        type=float,
        default=STOP_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait for it to exit (default {STOP_WAIT_S:g})",
    )
    sub.choices["status"].add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        if args.action == "start":
            if args.idle_timeout is not None:
                env[DAEMON_IDLE_ENV] = repr(args.idle_timeout)
            DaemonSettings.from_env(env)  # a bad setting fails here, in one line
            code = start(env, args.foreground)
        elif args.action == "stop":
            code = stop(env, args.wait)
        else:
            code = status(env, args.json)
    except (SocketSetupError, DaemonSettingError) as exc:
        print(f"macula-mcp daemon: {exc}", file=sys.stderr)
        code = 2
    except AttachError as exc:
        print(f"macula-mcp daemon: {exc}", file=sys.stderr)
        code = exc.status
    except (protocol.PreambleError, OSError) as exc:
        print(f"macula-mcp daemon: the daemon did not answer properly: {exc}", file=sys.stderr)
        code = 1
    raise SystemExit(code)
