"""``macula-mcp daemon start|stop|status``: the long-lived local service harness sessions attach to.

One daemon per ``MACULA_HOME`` (a lock beside its socket, ``tools.daemon_socket``). Each
connection starts with a preamble (``tools.daemon_protocol``); an ``attach`` connection is then
one MCP session (the SDK server over the socket's streams) bound to the runtime of the identity
plain ``macula-mcp`` would have given it (``tools.daemon_hosts``).

Invariants:
- logs go to ``$MACULA_HOME/logs/daemon.log`` (rotating: ``MACULA_MCP_DAEMON_LOG_BYTES``,
  ``MACULA_MCP_DAEMON_LOG_FILES``), never to stdio; the daemon's files are private (umask 077);
- a session's identity is computed from the environment its attach forwarded; with no
  ``MACULA_MCP_IDENTITY``, ``MACULA_MCP_AGENT`` or harness session id it is the attach's
  parent's (the harness's), as for plain ``macula-mcp``;
- the daemon exits on ``stop``, SIGTERM/SIGINT, or after ``MACULA_MCP_DAEMON_IDLE_S`` (default
  24 h) with nothing hosted and no session; on exit every node says goodbye, the socket and pid
  file are removed, and the lock is released last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import logging.handlers
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from macula.config import AGENT_ENV, IDENTITY_ENV, SESSION_ENV, identity_path
from macula.errors import ConfigError, MaculaError
from tools import daemon_protocol as protocol
from tools.attach import AttachError, connect, handshake, reach_daemon
from tools.daemon_hosts import Hosted, Hosts, IdleClock
from tools.daemon_socket import (
    DaemonRunningError,
    SocketSetupError,
    acquire_lock,
    bind,
    claim_socket,
    home_dir,
    pid_path,
    prepare_folder,
    read_pid,
    socket_path,
)

log = logging.getLogger("macula.daemon")

IDLE_ENV: Final = "MACULA_MCP_DAEMON_IDLE_S"
DEFAULT_IDLE_S: Final = 24 * 3600.0
MAX_LINE_ENV: Final = "MACULA_MCP_DAEMON_MAX_LINE"
DEFAULT_MAX_LINE: Final = 64 * 1024 * 1024  # bytes of one MCP message on the socket
LOG_BYTES_ENV: Final = "MACULA_MCP_DAEMON_LOG_BYTES"
LOG_FILES_ENV: Final = "MACULA_MCP_DAEMON_LOG_FILES"
DEFAULT_LOG_BYTES: Final = 1024 * 1024
DEFAULT_LOG_FILES: Final = 3
STOP_WAIT_S: Final = 20.0


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ConfigError(f"{name} must be a number in [{low:g}, {high:g}], not {raw!r}")
    return value


@dataclass(frozen=True)
class DaemonSettings:
    home: Path
    socket: Path
    idle_timeout: float
    max_line: int
    log_bytes: int
    log_files: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DaemonSettings:
        return cls(
            home=home_dir(env),
            socket=socket_path(env),
            idle_timeout=_number(env, IDLE_ENV, DEFAULT_IDLE_S, 0.01, 10 * 365 * 86400.0),
            max_line=int(_number(env, MAX_LINE_ENV, DEFAULT_MAX_LINE, 4096, 2**31)),
            log_bytes=int(_number(env, LOG_BYTES_ENV, DEFAULT_LOG_BYTES, 4096, 2**31)),
            log_files=int(_number(env, LOG_FILES_ENV, DEFAULT_LOG_FILES, 1, 100)),
        )

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "daemon.log"


def session_env(preamble: protocol.Preamble, home: Path) -> dict[str, str]:
    """The environment plain ``macula-mcp`` would have seen, for this session's runtime."""
    env = dict(preamble.env)
    theirs = home_dir(env)
    if theirs != home:
        raise ConfigError(
            f"MACULA_HOME: this daemon serves {home}, the session asked for {theirs} "
            f"(MACULA_MCP_SOCKET is shared between two homes: give each its own)"
        )
    env["MACULA_HOME"] = str(home)
    if not (env.get(IDENTITY_ENV) or env.get(AGENT_ENV) or env.get(SESSION_ENV)):
        harness = {**env, SESSION_ENV: f"ppid-{preamble.ppid}"}
        env[IDENTITY_ENV] = str(identity_path(harness))  # the harness's own, as without daemon
    return env


def _refusal(code: str, detail: str) -> bytes:
    return protocol.encode_reply({"ok": 0, "code": code, "detail": detail})


class _SocketLines:
    """The socket's incoming lines, as the SDK's stdio transport reads a file."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> _SocketLines:
        return self

    async def __anext__(self) -> str:
        try:
            line = await self.reader.readline()
        except ValueError:  # longer than the reader's limit
            log.warning("a message longer than %s bytes ended its session", MAX_LINE_ENV)
            raise StopAsyncIteration from None
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", "replace")


class _SocketSink:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode())

    async def flush(self) -> None:
        await self.writer.drain()


class Daemon:
    def __init__(self, settings: DaemonSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.clock = clock
        self.idle = IdleClock(settings.idle_timeout, clock())
        self.stopping = asyncio.Event()
        self.connections: set[asyncio.Task[Any]] = set()
        self.hosts: Hosts | None = None

    async def run(self, listener: Any) -> None:
        """Serve on ``listener`` (a bound, listening socket) until stopped or idle."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        async with asyncio.TaskGroup() as group:
            self.hosts = Hosts(group, self.idle, self.clock)
            server = await asyncio.start_unix_server(
                self._connection, sock=listener, limit=self.settings.max_line
            )
            log.info("daemon %s listening on %s", protocol.VERSION, self.settings.socket)
            try:
                await self._until_stopped()
            finally:
                server.close()
                for task in list(self.connections):
                    task.cancel()
                if self.connections:
                    await asyncio.wait(list(self.connections))
                await self.hosts.close_all()
        log.info("daemon stopped")

    async def _until_stopped(self) -> None:
        assert self.hosts is not None
        sweep = min(60.0, max(0.05, self.settings.idle_timeout / 4))
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), sweep)
            self.hosts.close_expired()
            if self.idle.daemon_expired(self.clock(), len(self.hosts.by_id), self.hosts.sessions):
                log.info("idle for %g s with nothing hosted: exiting", self.settings.idle_timeout)
                self.stopping.set()

    def status(self) -> dict[str, Any]:
        assert self.hosts is not None
        now = self.clock()
        return {
            "ok": 1,
            "pid": os.getpid(),
            "version": protocol.VERSION,
            "socket": str(self.settings.socket),
            "home": str(self.settings.home),
            "log": str(self.settings.log_file),
            "idle_timeout_s": self.settings.idle_timeout,
            "sessions": self.hosts.sessions,
            "identities": [h.view(now, self.idle) for h in self.hosts.by_id.values()],
        }

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            await self._converse(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            log.info("a connection ended early: %s", exc)
        except Exception:
            log.exception("a connection failed")
        finally:
            self.connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            preamble = protocol.parse_preamble(await reader.readline())
        except (protocol.PreambleError, ValueError) as exc:
            writer.write(_refusal("bad_preamble", str(exc)))
            return
        if preamble.op == "status":
            writer.write(protocol.encode_reply(self.status()))
            return
        if preamble.op == "stop":
            writer.write(protocol.encode_reply({"ok": 1, "pid": os.getpid(), "stopping": 1}))
            await writer.drain()
            log.info("stop requested")
            self.stopping.set()
            return
        if preamble.version != protocol.VERSION:
            detail = protocol.mismatch_detail(
                protocol.VERSION, preamble.version, str(self.settings.socket)
            )
            writer.write(_refusal("version_mismatch", detail))
            return
        await self._attach(preamble, reader, writer)

    async def _attach(
        self,
        preamble: protocol.Preamble,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        assert self.hosts is not None
        replied = False
        try:
            env = session_env(preamble, self.settings.home)
            async with self.hosts.session(env) as hosted:
                writer.write(protocol.encode_reply({"ok": 1, "version": protocol.VERSION}))
                replied = True
                await self._mcp(hosted, env, reader, writer)
        except (MaculaError, OSError) as exc:
            if replied:
                raise
            code = "config_error" if isinstance(exc, ConfigError) else "runtime_failed"
            writer.write(_refusal(code, str(exc)))

    async def _mcp(
        self,
        hosted: Hosted,
        env: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        from mcp.server.stdio import stdio_server

        from tools.server import build_server

        @contextlib.asynccontextmanager
        async def lent() -> Any:
            assert hosted.runtime is not None
            yield hosted.runtime

        app = build_server(env, runtime=lent)
        lines, sink = cast(Any, _SocketLines(reader)), cast(Any, _SocketSink(writer))
        async with stdio_server(lines, sink) as (read_stream, write_stream):
            lowlevel = app._lowlevel_server  # as MCPServer.run_stdio_async does
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


def _logging(settings: DaemonSettings, env: Mapping[str, str]) -> None:
    from relay.cli import KeyValueFormatter

    logs = settings.log_file.parent
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        settings.log_file, maxBytes=settings.log_bytes, backupCount=settings.log_files
    )
    handler.setFormatter(KeyValueFormatter())
    level = env.get("MACULA_MCP_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("quic").setLevel(logging.WARNING)


def run_foreground(env: Mapping[str, str]) -> int:
    """Be the daemon in this process; the exit status."""
    os.umask(0o077)
    try:
        settings = DaemonSettings.from_env(env)
        prepare_folder(settings.socket, env)
        lock = acquire_lock(settings.socket)
    except DaemonRunningError as exc:
        print(f"macula-mcp daemon: {exc}", file=sys.stderr)
        return 0
    except (SocketSetupError, ConfigError) as exc:
        print(f"macula-mcp daemon: {exc}", file=sys.stderr)
        return 2
    try:
        claim_socket(settings.socket)
        listener = bind(settings.socket)
        pid_path(settings.socket).write_text(f"{os.getpid()}\n")
        _logging(settings, env)
        try:
            asyncio.run(Daemon(settings).run(listener))
        finally:
            for path in (settings.socket, pid_path(settings.socket)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    except (SocketSetupError, ConfigError, OSError) as exc:
        print(f"macula-mcp daemon: {exc}", file=sys.stderr)
        return 2 if not isinstance(exc, DaemonRunningError) else 1
    finally:
        lock.close()  # released last: a new daemon may claim the socket only now
    return 0


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
    parser = argparse.ArgumentParser(
        prog="macula-mcp daemon",
        description="The local service harness sessions attach to (one per MACULA_HOME).",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    starting = sub.add_parser("start", help="start the daemon (detached) unless one runs")
    starting.add_argument("--foreground", action="store_true", help="run in this process")
    starting.add_argument(
        "--idle-timeout", type=float, metavar="SECONDS", help=f"sets {IDLE_ENV} (default 24 h)"
    )
    stopping = sub.add_parser("stop", help="stop the daemon: its nodes say goodbye")
    stopping.add_argument("--wait", type=float, default=STOP_WAIT_S, metavar="SECONDS")
    showing = sub.add_parser("status", help="pid, socket, version, identities and sessions")
    showing.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        if args.action == "start":
            if args.idle_timeout is not None:
                env[IDLE_ENV] = repr(args.idle_timeout)
            DaemonSettings.from_env(env)  # a bad setting fails here, in one line
            code = start(env, args.foreground)
        elif args.action == "stop":
            code = stop(env, args.wait)
        else:
            code = status(env, args.json)
    except (SocketSetupError, ConfigError) as exc:
        print(f"macula-mcp daemon: {exc}", file=sys.stderr)
        code = 2
    except AttachError as exc:
        print(f"macula-mcp daemon: {exc}", file=sys.stderr)
        code = exc.status
    except (protocol.PreambleError, OSError) as exc:
        print(f"macula-mcp daemon: the daemon did not answer properly: {exc}", file=sys.stderr)
        code = 1
    raise SystemExit(code)
