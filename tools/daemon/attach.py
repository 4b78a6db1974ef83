"""``macula-mcp attach``: what a harness runs. A thin stdio <-> socket forwarder to the daemon.

It sends one preamble line (``tools.daemon.protocol``), reads the daemon's one-line reply, then
copies bytes both ways until the harness closes stdin (which detaches: the daemon keeps the node)
or the daemon closes the connection. When no daemon answers it starts one (detached, its own
session) and waits for the socket up to ``MACULA_MCP_DAEMON_START_S`` seconds.

Invariants:
- light: imports neither the MCP SDK nor the mesh library (only a failure imports them, to
  serve the error to the harness: ``fail``) (``tools.entry`` dispatches here
  before anything heavy is imported); stdout carries the daemon's bytes only, and the
  front's (``tools.stdio.front``): it reads stdin from spawn on and answers the opening
  request (the era, the handshake card) before the daemon is reached or even started;
- every failure is one line on stderr and a non-zero exit: 2 for a bad setting, 1 otherwise
  (daemon unreachable, another version, refused); a session the daemon serves with a problem
  (a bad setting, other settings than the running agent's, no station: every tool answers it,
  ``tools.server.runtime_gate``) says it in one line on stderr too, and exits so when it ends;
- a stale socket is never removed here: the daemon started in its place removes it under its
  lock, after checking that nothing answers on it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from tools.daemon import protocol
from tools.daemon.unix_socket import read_pid
from tools.settings import (
    DAEMON_START_ENV,
    HOME_ENV,
    DaemonSettingError,
    SocketSetupError,
    daemon_start_s,
    home_dir,
    socket_path,
)
from tools.stdio import front as stdio_front
from tools.stdio.front import Front

POLL_S: Final = 0.02  # interval between connection attempts while a daemon starts
CHUNK: Final = 65536
DIFFER: Final = ("daemon_settings_differ", "configuration")  # exit 2 (a setting), else 1
START_ERR: Final = "daemon-start.err"  # the starting daemon's stderr, in MACULA_HOME/logs


class AttachError(Exception):
    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def start_timeout(env: Mapping[str, str]) -> float:
    try:
        return daemon_start_s(env)
    except DaemonSettingError as exc:  # a bad setting: exit 2
        raise AttachError(str(exc), 2) from None


def connect(sock: Path) -> socket.socket | None:
    """A connection to the daemon, or None when nothing listens on ``sock``."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(sock))
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        return None
    except OSError as exc:
        conn.close()
        raise AttachError(f"cannot connect to the daemon on {sock}: {exc.strerror}") from None
    return conn


def handshake(
    conn: socket.socket, op: str, env: Mapping[str, str], ppid: int
) -> tuple[dict[str, Any], bytes]:
    """Send the preamble; the daemon's reply and any bytes that followed it."""
    conn.sendall(protocol.encode_preamble(op, env, ppid))
    buffered = b""
    while b"\n" not in buffered:
        chunk = conn.recv(CHUNK)
        if not chunk:
            raise protocol.PreambleError("the daemon closed the connection before replying")
        buffered += chunk
        if len(buffered) > protocol.MAX_PREAMBLE:
            raise protocol.PreambleError("the daemon's reply is too long")
    line, rest = buffered.split(b"\n", 1)
    return protocol.parse_reply(line), rest


def start_command() -> list[str]:
    return [sys.executable, "-m", "tools.cli", "daemon", "start", "--foreground"]


def spawn_daemon(env: Mapping[str, str]) -> tuple[Any, Path]:
    """Start a daemon detached from this process (its own session), its early stderr kept in
    ``MACULA_HOME/logs/daemon-start.err``; the process and that file."""
    import subprocess  # only on a cold start

    logs = home_dir(env) / "logs"
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    err_path = logs / START_ERR
    fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        process = subprocess.Popen(
            start_command(),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)
    return process, err_path


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def reach_daemon(
    env: Mapping[str, str],
    sock: Path,
    *,
    start: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> socket.socket:
    """A connection to the daemon of ``sock``, starting one when none answers."""
    conn = connect(sock)
    if conn is not None or not start:
        if conn is None:
            raise AttachError(f"no daemon runs on {sock}")
        return conn
    timeout = start_timeout(env)
    process, err_path = spawn_daemon(env)
    deadline = clock() + timeout
    while clock() < deadline:
        conn = connect(sock)
        if conn is not None:
            return conn
        status = process.poll()
        if status not in (None, 0):  # 0: another daemon won the race; keep connecting
            said = _tail(err_path) or f"exited with status {status}"
            raise AttachError(f"the daemon did not start: {said}", 2 if status == 2 else 1)
        time.sleep(POLL_S)  # polling interval while the daemon binds its socket
    pid = read_pid(sock)
    holder = f" (pid {pid} holds its lock)" if pid else ""
    raise AttachError(
        f"no daemon answered on {sock} within {timeout:g} s{holder}; see "
        f"{home_dir(env) / 'logs'} ({DAEMON_START_ENV} sets the wait)"
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def forward(
    conn: socket.socket,
    pending: bytes,
    stdin: int = 0,
    stdout: int = 1,
    front: Front | None = None,
) -> bool:
    """Copy stdin -> socket and socket -> stdout until the session ends; True when it ended
    because stdin closed (the harness detached), False when the daemon closed first. With a
    ``front`` (which read stdin from spawn on), its lines and writer are used instead."""
    if front is not None:
        return _forward_front(conn, pending, front)
    stdin_closed = threading.Event()

    def upstream() -> None:
        try:
            while chunk := os.read(stdin, CHUNK):
                conn.sendall(chunk)
        except OSError:
            return  # the daemon went away: the main loop sees the socket close
        stdin_closed.set()
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)  # the daemon ends the session and closes

    threading.Thread(target=upstream, name="attach-stdin", daemon=True).start()
    try:
        if pending:
            _write_all(stdout, pending)
        while chunk := conn.recv(CHUNK):
            _write_all(stdout, chunk)
    except BrokenPipeError:
        return True  # the harness is gone
    except OSError:
        pass
    return stdin_closed.is_set()


def _forward_front(conn: socket.socket, pending: bytes, front: Front) -> bool:
    stdin_closed = threading.Event()

    def deliver(line: bytes | None) -> None:  # on the front's thread, in order
        if line is None:
            stdin_closed.set()
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)  # the daemon ends the session and closes
            return
        with contextlib.suppress(OSError):  # the daemon went away: the loop below sees it
            conn.sendall(line)

    front.connect(deliver)
    partial = b""
    try:
        chunk = pending
        while True:
            if front.watching:  # the reply to the opening request is yet to pass: by lines
                *lines, partial = (partial + chunk).split(b"\n")
                out = b"".join(
                    kept for line in lines if (kept := front.from_backend(line + b"\n")) is not None
                )
                if not front.watching:
                    out, partial = out + partial, b""
            else:
                out = chunk
            if out:
                front.write(out)
            chunk = conn.recv(CHUNK)
            if not chunk:
                break
    except BrokenPipeError:
        return True  # the harness is gone
    except OSError:
        pass
    return stdin_closed.is_set()


def fail(message: str, status: int, front: Front | None = None) -> NoReturn:
    """Say it in one line; with the ``front`` (the harness is there), serve MCP anyway until
    the harness closes stdin, every tool answering it (``tools.stdio.fronted.serve_problem``)."""
    print(f"macula-mcp attach: {message}", file=sys.stderr, flush=True)
    if front is not None:
        code = "configuration" if status == 2 else "daemon_unavailable"
        fix = "read detail and do what it says, then reconnect this MCP server"
        try:
            from tools.stdio.fronted import serve_problem

            serve_problem(front, dict(os.environ), code, message, fix)
        except Exception as exc:  # the message is said already: never hide it behind this
            print(f"macula-mcp attach: could not serve the error: {exc}", file=sys.stderr)
    raise SystemExit(status)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[2:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        print(
            f"usage: macula-mcp attach\n\nServe MCP on stdio through this {HOME_ENV}'s daemon "
            "(started when none runs); closing stdin detaches, the agent stays on the mesh."
        )
        return
    if args:
        fail(f"unexpected arguments {' '.join(args)!r} (attach takes none)", 2)
    env = dict(os.environ)
    front = stdio_front.start(env)  # answers the opening request while the daemon starts
    try:
        sock = socket_path(env)
        conn = reach_daemon(env, sock)
        reply, pending = handshake(conn, "attach", env, os.getppid())
    except SocketSetupError as exc:
        fail(str(exc), 2, front)
    except AttachError as exc:
        fail(str(exc), exc.status, front)
    except (protocol.PreambleError, OSError) as exc:
        fail(f"the daemon on {sock} did not complete the handshake: {exc}", 1, front)
    if not reply["ok"]:
        fail(str(reply["detail"]), 2 if reply.get("code") == "config_error" else 1, front)
    problem = reply.get("problem")
    if isinstance(problem, dict):  # served anyway: every tool answers it until it is gone
        said = f"{problem.get('detail')}; {problem.get('next_action')}"
        print(f"macula-mcp attach: {said}", file=sys.stderr, flush=True)
    if not forward(conn, pending, front=front):
        fail(f"the daemon closed the session (stopped or crashed; see {home_dir(env)}/logs)", 1)
    if isinstance(problem, dict):
        raise SystemExit(2 if problem.get("code") in DIFFER else 1)
