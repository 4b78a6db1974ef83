"""MCP over Streamable HTTP from the daemon: the ASGI app the daemon mounts at ``/mcp``.

Each request's bearer token picks an identity (``tools.daemon.http.tokens``); what it reaches is
the same MCP server a stdio attach gets (``tools.server.server.build_server``), lent that identity's
runtime from the daemon's ``Hosts``: every tool, resource and prompt, progress notifications,
channel push (legacy era).

The eras, as over stdio (``tools.stdio.front``):
- a request without a modern ``MCP-Protocol-Version`` header is the 2025 era: a session
  (``Mcp-Session-Id``) opened by ``initialize``, with its own server (so channel push reaches
  it) and its own bounded event store (``Last-Event-ID`` resumes a dropped stream); ``DELETE``
  ends it, as does ``idle_timeout`` without a request; later requests for it get 404;
- a request with a 2026-07-28 header is served on its own (no session) by a server of the
  identity kept for such requests (channel push off: that era has no standalone stream). With
  channel push on, ``server/discover`` is declined with -32022 naming the handshake versions,
  so an auto client settles on the 2025 era (where Claude Code keeps ``claude/channel``).

Invariants:
- Host and Origin are checked first (``tools.daemon.http.guard``), then the token: nothing is
  opened for a refused request; a session is reachable only with the token that opened it
  (another token gets 404, as for a session that does not exist);
- a session holds its identity's runtime (``Hosts.session``) for as long as it lives; at most
  ``max_sessions`` sessions are open. Harnesses often never send ``DELETE`` (``claude mcp
  list`` opens one per run), so a new session that finds the table full ends the least
  recently used session that is idle (no request in flight, no open GET stream), as a
  ``DELETE`` would (its later requests get 404: a client opens a new session); only when
  every session is busy is it refused (503). A request body is at most ``MAX_BODY`` bytes
  (413); an agent whose runtime cannot be opened (other settings, a failure) gets 503 with
  the reason;
- servers are built off the event loop (about half a second each); a spare is built ahead as
  each session opens, so the next session of that agent starts without building;
- the token is never logged nor echoed.

Mounting (the daemon's HTTP app): ``Route("/mcp", endpoint=mcp_http_app(hosts, home, env))``
among its routes, and ``async with app.lifespan():`` inside its lifespan.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp.server._streamable_http_modern import handle_modern_request
from mcp.server.runner import serve_loop
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.transport_security import RequestBodyLimitMiddleware
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import Receive, Scope, Send

from macula.errors import MaculaError
from tools.daemon.hosts import Hosted, Hosts
from tools.daemon.http.events import DEFAULT_LIMIT, BoundedEventStore
from tools.daemon.http.guard import bearer_token, host_allowed, origin_allowed, refusal
from tools.daemon.http.tokens import Bearer, TokenBook
from tools.settings import CHANNEL_ENV, DEFAULT_HTTP_MAX_SESSIONS
from tools.stdio.front import channel_on, opening

log = logging.getLogger("macula.daemon.http")

IDLE_TIMEOUT_S: Final = 30 * 60.0
MAX_SESSIONS: Final = DEFAULT_HTTP_MAX_SESSIONS
MAX_BODY: Final = 4 * 1024 * 1024
LEGACY_SPARE: Final = "http/legacy"  # Hosted.spares key: a session server built ahead
MODERN_POOL: Final = "http/modern"  # Hosted.spares key: idle servers for 2026 requests


@dataclass(eq=False)
class HttpSession:
    """One 2025-era session: whose it is, its transport and its event store; ``in_flight``
    counts its requests being served (an open GET stream is one until it closes)."""

    sid: str
    agent: str
    transport: StreamableHTTPServerTransport
    events: BoundedEventStore
    ended: anyio.Event = field(default_factory=anyio.Event)
    in_flight: int = 0


def least_recent_idle(sessions: Mapping[str, HttpSession]) -> HttpSession | None:
    """The first session in ``sessions`` (kept least recently used first) with nothing in
    flight, or None when every one is busy."""
    return next((s for s in sessions.values() if not s.in_flight), None)


async def _answer(send: Send, status: int, headers: Mapping[str, str], body: bytes) -> None:
    """A whole response with its Content-Length (see ``tools.daemon.http.listener._refuse``)."""
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode("ascii")))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, status: int, message: str, presented: bool = False) -> None:
    await _answer(send, *refusal(status, message, presented))


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _build(hosted: Hosted, env: dict[str, str]) -> Any:
    """A server lent the runtime of ``hosted`` (as ``daemon_server._server`` builds for an
    attach); its lifespan may run once per session."""
    from tools.server.server import build_server

    @contextlib.asynccontextmanager
    async def lent() -> Any:
        if hosted.runtime is None:
            raise RuntimeError("the runtime closed")
        yield hosted.runtime

    return build_server(env, runtime=lent)


class McpHttp:
    """The ``/mcp`` ASGI app over the daemon's ``hosts`` (enter ``lifespan()`` around its use,
    or serve it alone: it answers the ASGI lifespan protocol itself)."""

    def __init__(
        self,
        hosts: Hosts,
        home: Path,
        env: Mapping[str, str],
        *,
        idle_timeout: float = IDLE_TIMEOUT_S,
        max_sessions: int = MAX_SESSIONS,
        max_events: int = DEFAULT_LIMIT,
    ) -> None:
        self.hosts, self.home, self.env = hosts, home, dict(env)
        self.tokens = TokenBook(home)
        self.idle_timeout, self.max_sessions, self.max_events = (
            idle_timeout,
            max_sessions,
            max_events,
        )
        self.sessions: dict[str, HttpSession] = {}  # least recently used first
        self._group: TaskGroup | None = None
        self._limited = RequestBodyLimitMiddleware(self._http, MAX_BODY)  # 413 past it

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[McpHttp]:
        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield self
            finally:
                self._group = None
                for session in list(self.sessions.values()):
                    await self._discard(session)
                group.cancel_scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._asgi_lifespan(receive, send)
        elif scope["type"] == "http":
            await self._limited(scope, receive, send)

    async def _asgi_lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        async with self.lifespan():
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        if not host_allowed(headers.get("host")):
            await _refuse(send, 421, "the Host must be a loopback address")
            return
        if not origin_allowed(headers.get("origin")):
            await _refuse(send, 403, "cross-origin requests are refused (Origin not loopback)")
            return
        presented = bearer_token(headers)
        try:
            bearer = await anyio.to_thread.run_sync(self.tokens.identify, presented)
        except (MaculaError, OSError) as exc:
            log.warning("token check failed: %s", exc)
            await _refuse(send, 500, "the daemon could not read its tokens: see its log")
            return
        if bearer is None:
            await _refuse(send, 401, "a bearer token is required", presented is not None)
            return
        if self._group is None:
            await _refuse(send, 503, "the daemon is stopping")
            return
        env = bearer.session_env(self.env, self.home)
        version = headers.get(MCP_PROTOCOL_VERSION_HEADER.lower())
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            await self._modern(env, scope, receive, send)
        elif (sid := headers.get(MCP_SESSION_ID_HEADER)) is not None:
            await self._existing(bearer, sid, scope, receive, send)
        elif scope["method"] == "POST":
            await self._open(bearer, env, scope, receive, send)
        else:
            await _refuse(send, 400, "no Mcp-Session-Id: open a session with initialize first")

    # -- the 2025 era: sessions ----------------------------------------------------------------

    async def _existing(
        self, bearer: Bearer, sid: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        session = self.sessions.get(sid)
        if session is None or session.agent != bearer.agent:
            await _refuse(send, 404, "session not found")
            return
        async with self._using(session):
            await session.transport.handle_request(scope, receive, send)
        if session.transport.is_terminated:  # DELETE: forget it now
            await self._discard(session)

    @contextlib.asynccontextmanager
    async def _using(self, session: HttpSession) -> AsyncIterator[None]:
        """One request of ``session`` in flight: it is busy meanwhile, and most recently used
        when the request starts and when it ends."""
        session.in_flight += 1
        self._touch(session)
        try:
            yield
        finally:
            session.in_flight -= 1
            self._touch(session)

    def _touch(self, session: HttpSession) -> None:
        if self.sessions.get(session.sid) is session:
            self.sessions[session.sid] = self.sessions.pop(session.sid)  # to the end

    async def _make_room(self) -> bool:
        """Below ``max_sessions`` again, ending idle sessions least recently used first; False
        when every open session is busy."""
        while len(self.sessions) >= self.max_sessions:
            victim = least_recent_idle(self.sessions)
            if victim is None:
                return False
            log.info(
                "http session %s of %s ended to make room (%d open, the least recently used "
                "idle one)", victim.sid[:8], victim.agent, len(self.sessions),
            )  # fmt: skip
            await self._discard(victim)  # it leaves the table before this awaits anything
        return True

    async def _open(
        self, bearer: Bearer, env: dict[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        if not await self._make_room():
            await _refuse(
                send, 503, f"{self.max_sessions} sessions are open and all are in use: end one"
            )
            return
        events = BoundedEventStore(self.max_events)
        sid = uuid.uuid4().hex
        transport = StreamableHTTPServerTransport(
            mcp_session_id=sid, event_store=events, idle_timeout=self.idle_timeout
        )
        session = HttpSession(sid, bearer.agent, transport, events, in_flight=1)  # opening
        self.sessions[sid] = session
        assert self._group is not None
        try:
            try:
                await self._group.start(self._serve, session, env)
            except Exception as exc:  # the agent's runtime could not be opened
                self.sessions.pop(sid, None)
                await _refuse(send, 503, f"the agent could not be opened: {exc}")
                return
            status = await _status_of(transport, scope, receive, send)
        finally:
            session.in_flight -= 1
        if status is None or status >= 400:  # nothing was established
            await self._discard(session)

    async def _serve(
        self, session: HttpSession, env: dict[str, str], *, task_status: TaskStatus[None]
    ) -> None:
        started = False
        try:
            async with self.hosts.session(env) as hosted:
                server = await self._server_for(hosted, env)
                low = server._lowlevel_server
                async with session.transport.connect() as (read, write), low.lifespan(low) as state:
                    task_status.started()
                    started = True
                    log.info("http session %s of %s opened", session.sid[:8], session.agent)
                    with session.transport.idle_scope or anyio.CancelScope():
                        await serve_loop(
                            low, read, write, lifespan_state=state, session_id=session.sid
                        )
        except Exception:
            if not started:
                raise  # to the request that opened it
            log.exception("http session %s failed", session.sid[:8])
        finally:
            await self._discard(session)
            session.ended.set()
            log.info("http session %s ended", session.sid[:8])

    async def _server_for(self, hosted: Hosted, env: dict[str, str]) -> Any:
        """The server of a new session: the spare built ahead, or one built now (off the
        event loop: it takes about half a second); the next session's is built meanwhile."""
        server = hosted.spares.pop(LEGACY_SPARE, None)
        if server is None:
            server = await anyio.to_thread.run_sync(_build, hosted, env)
        assert self._group is not None
        self._group.start_soon(self._build_spare, hosted, env)
        return server

    async def _build_spare(self, hosted: Hosted, env: dict[str, str]) -> None:
        if LEGACY_SPARE in hosted.spares:
            return
        try:
            server = await anyio.to_thread.run_sync(_build, hosted, env)
        except Exception:  # the next session builds its own
            log.exception("building a spare server failed")
            return
        if hosted.runtime is not None and not hosted.closing.is_set():
            hosted.spares.setdefault(LEGACY_SPARE, server)

    async def _discard(self, session: HttpSession) -> None:
        self.sessions.pop(session.sid, None)
        if not session.transport.is_terminated:
            with anyio.CancelScope(shield=True):
                await session.transport.terminate()

    # -- the 2026-07-28 era: one request at a time ---------------------------------------------

    async def _modern(
        self, env: dict[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        body = await _body(receive)
        if body is None:
            await _refuse(send, 413, f"a request body is at most {MAX_BODY} bytes")
            return
        declined = _declined_discover(body, env)
        if declined is not None:
            status = ERROR_CODE_HTTP_STATUS.get(declined["error"]["code"], 400)
            await _answer(
                send, status, {"content-type": "application/json"}, json.dumps(declined).encode()
            )
            return
        async with contextlib.AsyncExitStack() as stack:
            try:
                hosted = await stack.enter_async_context(self.hosts.session(env))
            except Exception as exc:  # the agent's runtime could not be opened
                await _refuse(send, 503, f"the agent could not be opened: {exc}")
                return
            pool: list[Any] = hosted.spares.setdefault(MODERN_POOL, [])
            quiet = {**env, CHANNEL_ENV: "0"}  # no standalone stream to push on in this era
            server = pool.pop() if pool else await anyio.to_thread.run_sync(_build, hosted, quiet)
            try:
                low = server._lowlevel_server
                async with low.lifespan(low) as state:
                    replay = _replaying(body, receive)
                    await handle_modern_request(low, None, False, state, scope, replay, send)
            finally:
                pool.append(server)


def _declined_discover(body: bytes, env: Mapping[str, str]) -> dict[str, Any] | None:
    """The -32022 answer to a ``server/discover`` while channel push is on, else None."""
    if not channel_on(env):
        return None
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("method") != "server/discover":
        return None
    decision = opening(message, env, {})
    return decision.answer if not decision.forward else None


async def _body(receive: Receive) -> bytes | None:
    """The whole request body, or None past ``MAX_BODY``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then what the connection says (a disconnect)."""
    given = False

    async def replay() -> Any:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _status_of(
    transport: StreamableHTTPServerTransport, scope: Scope, receive: Receive, send: Send
) -> int | None:
    """Serve one request on ``transport``; the HTTP status it answered (None: none)."""
    status: int | None = None

    async def watch(message: Any) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    await transport.handle_request(scope, receive, watch)
    return status


def mcp_http_app(hosts: Hosts, home: Path, env: Mapping[str, str], **settings: Any) -> McpHttp:
    """The app to mount at ``/mcp`` (``Route("/mcp", endpoint=app)``); enter ``app.lifespan()``
    in the enclosing app's lifespan."""
    return McpHttp(hosts, home, env, **settings)
