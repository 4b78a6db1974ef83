"""The daemon itself (``macula-mcp daemon start --foreground``): a Unix socket server whose
``attach`` connections are MCP sessions over the runtimes of ``tools.daemon.hosts``.

Invariants:
- logs go to ``$MACULA_HOME/logs/daemon.log`` (rotating: ``MACULA_MCP_DAEMON_LOG_BYTES``,
  ``MACULA_MCP_DAEMON_LOG_FILES``), never to stdio; the daemon's files are private (umask 077);
- a session's identity is computed from the environment its attach forwarded; with no
  ``MACULA_MCP_IDENTITY``, ``MACULA_MCP_AGENT`` or harness session id it is the attach's
  parent's (the harness's), as for plain ``macula-mcp``;
- ``status`` and ``stop`` are answered whatever the client's version; an ``attach`` of another
  version is refused (``version_mismatch``) before anything is opened;
- the daemon exits on ``stop``, SIGTERM/SIGINT, or after ``MACULA_MCP_DAEMON_IDLE_S`` (default
  24 h) with nothing hosted and no session; on exit every node says goodbye, the socket and pid
  file are removed, and the lock is released last.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import logging.handlers
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, cast

from macula.config import AGENT_ENV, HOME_ENV, IDENTITY_ENV, SESSION_ENV, identity_path
from macula.errors import ConfigError, MaculaError
from macula.logformat import KeyValueFormatter
from macula.quic.event_loop import run as run_loop
from tools.daemon import protocol
from tools.daemon.hosts import Hosted, Hosts, IdleClock
from tools.daemon.unix_socket import (
    DaemonRunningError,
    acquire_lock,
    bind,
    claim_socket,
    pid_path,
    prepare_folder,
)
from tools.server.runtime import Runtime
from tools.settings import (
    DAEMON_MAX_LINE_ENV,
    SOCKET_ENV,
    DaemonSettingError,
    DaemonSettings,
    SocketSetupError,
    channel_text,
    home_dir,
    log_level,
    terse_text,
)

log = logging.getLogger("macula.daemon")


def session_env(preamble: protocol.Preamble, home: Path) -> dict[str, str]:
    """The environment plain ``macula-mcp`` would have seen, for this session's runtime."""
    env = dict(preamble.env)
    theirs = home_dir(env)
    if theirs != home:
        raise ConfigError(
            f"{HOME_ENV}: this daemon serves {home}, the session asked for {theirs} "
            f"({SOCKET_ENV} is shared between two homes: give each its own)"
        )
    env[HOME_ENV] = str(home)
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
            log.warning("a message longer than %s bytes ended its session", DAEMON_MAX_LINE_ENV)
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
    def __init__(
        self,
        settings: DaemonSettings,
        clock: Callable[[], float] = time.monotonic,
        mcp_app: Any = None,
        env: Mapping[str, str] | None = None,
    ):
        self.settings = settings
        self.clock = clock
        self.env = dict(os.environ if env is None else env)  # what /mcp sessions start from
        self.mcp_app = (
            mcp_app  # MCP over Streamable HTTP at /mcp (default: tools.daemon.http.mcp's)
        )
        self.http_port = 0  # the console's loopback port, once it listens
        self.idle = IdleClock(settings.idle_timeout, clock())
        self.stopping = asyncio.Event()
        self.connections: set[asyncio.Task[Any]] = set()
        self.hosts: Hosts | None = None
        self._session_modules: asyncio.Task[list[Any]] | None = None

    async def run(self, listener: Any) -> None:
        """Serve on ``listener`` (a bound, listening socket) until stopped or idle."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        async with asyncio.TaskGroup() as group:
            self.hosts = Hosts(group, self.idle, self.clock)
            # the SDK server's modules, imported once off the loop before any session builds a
            # server and before the HTTP listener imports its own (which import them too): one
            # importer at a time, as Python's per-module import locks can hand a second thread
            # a partly initialised module on an import cycle
            self._session_modules = group.create_task(
                asyncio.to_thread(_import, SESSION_MODULES), name="imports"
            )
            server = await asyncio.start_unix_server(
                self._connection, sock=listener, limit=self.settings.max_line
            )
            log.info("daemon %s listening on %s", protocol.VERSION, self.settings.socket)
            group.create_task(self._http(), name="http")
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

    @property
    def home(self) -> Path:
        return self.settings.home

    def runtimes(self) -> list[Runtime]:
        """The open runtimes (what the console reads)."""
        hosted = [] if self.hosts is None else list(self.hosts.by_id.values())
        return [h.runtime for h in hosted if h.runtime is not None and not h.closing.is_set()]

    async def _http(self) -> None:
        """The console and /mcp on loopback (``tools.daemon.http.listener``) until the daemon stops;
        a
        listener that cannot start is logged, and the daemon goes on without it. Its modules
        (starlette, uvicorn, the agent views) are imported off the loop: an attach arriving
        meanwhile is not held up."""
        try:
            assert self._session_modules is not None
            await self._session_modules
            http, mcp, a2a = await asyncio.to_thread(_import, HTTP_MODULES)
            if self.mcp_app is None:
                self.mcp_app = mcp.mcp_http_app(
                    self.hosts, self.home, self.env,
                    max_sessions=self.settings.http_max_sessions,
                )  # fmt: skip
            door = self._door(a2a)
            sock = http.bind_home(self.home, self.settings.http_port)
            self.http_port = sock.getsockname()[1]
            app = http.build_app(self, self.mcp_app, door)
            await http.serve(app, sock, self.home, self.stopping)
        except Exception:
            log.exception("the HTTP listener (console, /mcp) failed")

    def _door(self, a2a: Any) -> Any:
        """The A2A door at ``/a2a/`` (``tools.daemon.http.a2a``), warmed for a home with A2A
        clients, and served beyond loopback too when the owner set that up."""
        assert self.hosts is not None
        mount = a2a.DoorMount(
            self.hosts, self.home, self.settings.a2a, self.hosts.group, self.stopping
        )
        mount.warm()
        if self.settings.a2a.listen is not None:
            host, port = self.settings.a2a.listen
            self.hosts.group.create_task(a2a.serve_beyond_loopback(mount, host, port))
        return mount

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
            "http_port": self.http_port,
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
        env: dict[str, str] | None = None
        try:
            env = session_env(preamble, self.settings.home)
            async with self.hosts.session(env) as hosted:
                writer.write(protocol.encode_reply({"ok": 1, "version": protocol.VERSION}))
                replied = True
                await self._mcp(hosted, env, reader, writer)
        except (MaculaError, OSError) as exc:
            if replied:
                raise
            if env is None:  # not this daemon's home: nothing here can serve it
                writer.write(_refusal("config_error", str(exc)))
                return
            await self._troubled(exc, env, reader, writer)

    async def _troubled(
        self,
        exc: MaculaError | OSError,
        env: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """The session's runtime cannot be had now (a bad setting, other settings than the
        running agent's, no station): serve MCP anyway, every tool answering the problem, and
        open it on a later call once the cause is gone (``tools.server.runtime_gate``). The reply
        carries the problem, which attach says on stderr."""
        from tools.server.runtime import station_names
        from tools.server.runtime_gate import problem_of
        from tools.server.server import build_server
        from tools.stdio.guard import serve_guarded

        assert self.hosts is not None
        hosts = self.hosts
        problem = problem_of(exc, [str(station) for station in station_names(env)])
        log.info("session served with a problem: %s", problem.detail)
        reply = {"ok": 1, "version": protocol.VERSION, "problem": problem.view()}
        writer.write(protocol.encode_reply(reply))

        @contextlib.asynccontextmanager
        async def opened() -> Any:
            async with hosts.session(env) as hosted:
                assert hosted.runtime is not None
                yield hosted.runtime

        app = build_server(env, runtime=opened, problem=problem)
        lines, sink = cast(Any, _SocketLines(reader)), cast(Any, _SocketSink(writer))
        await serve_guarded(app, lines, sink)

    async def _mcp(
        self,
        hosted: Hosted,
        env: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        if self._session_modules is not None:
            await self._session_modules
        from tools.stdio.guard import serve_guarded

        shape = _shape(env)
        app = hosted.spares.pop(shape, None) or _server(hosted, env)
        lines, sink = cast(Any, _SocketLines(reader)), cast(Any, _SocketSink(writer))
        try:
            await serve_guarded(app, lines, sink)  # a request nested too deep is answered
        finally:
            if hosted.runtime is not None and not hosted.closing.is_set():
                hosted.spares[shape] = _server(hosted, env)  # the next attach skips building


def _shape(env: Mapping[str, str]) -> str:
    """What makes two sessions' servers differ (the rest of their settings must agree): terse
    descriptions, push into this session or not, and the agent's name (its owner switches)."""
    return f"{terse_text(env)}/{channel_text(env)}/{env.get(AGENT_ENV) or ''}"


SESSION_MODULES: Final = ("tools.server.server", "tools.stdio.guard")
HTTP_MODULES: Final = (
    "tools.daemon.http.listener",
    "tools.daemon.http.mcp",
    "tools.daemon.http.a2a",  # not the door itself: it loads tools.a2a.door when needed
)


def _import(names: tuple[str, ...]) -> list[Any]:
    return [importlib.import_module(name) for name in names]


def _server(hosted: Hosted, env: dict[str, str]) -> Any:
    """A server for one session, lent the runtime of ``hosted`` (single use: its lifespan
    runs once per connection)."""
    from tools.server.server import build_server

    @contextlib.asynccontextmanager
    async def lent() -> Any:
        assert hosted.runtime is not None, "the runtime closed"
        yield hosted.runtime

    return build_server(env, runtime=lent)


def _logging(settings: DaemonSettings, env: Mapping[str, str]) -> None:
    logs = settings.log_file.parent
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        settings.log_file, maxBytes=settings.log_bytes, backupCount=settings.log_files
    )
    handler.setFormatter(KeyValueFormatter())
    level = log_level(env)
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
    except (SocketSetupError, DaemonSettingError, ConfigError) as exc:
        print(f"macula-mcp daemon: {exc}", file=sys.stderr)
        return 2
    try:
        claim_socket(settings.socket)
        listener = bind(settings.socket)
        pid_path(settings.socket).write_text(f"{os.getpid()}\n")
        _logging(settings, env)
        try:
            run_loop(Daemon(settings, env=env).run(listener))
        finally:
            for path in (settings.socket, pid_path(settings.socket)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    except (SocketSetupError, DaemonSettingError, ConfigError, OSError) as exc:
        print(f"macula-mcp daemon: {exc}", file=sys.stderr)
        return 2 if not isinstance(exc, DaemonRunningError) else 1
    finally:
        lock.close()  # released last: a new daemon may claim the socket only now
    return 0
