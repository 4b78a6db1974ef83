"""The daemon's loopback HTTP listener: the console (``tools.daemon.console``) behind a guard, and a
mount
point ``/mcp`` for MCP over Streamable HTTP and ``/a2a/`` for the A2A door (ASGI apps of their
own, which check their bearer tokens themselves: nothing of this module stands in front of them).

Invariants:
- it listens on 127.0.0.1 only, on ``MACULA_MCP_HTTP_PORT`` (``DaemonSettings.http_port``; 0
  or unset: a free port), and
  writes the port it got to ``tools.daemon.http.home_token.port_path`` (0600) once it listens; the
  file is
  removed when it stops;
- ``guard`` (pure) decides every console request: a Host other than this loopback origin is
  refused (DNS rebinding), so is an ``Origin`` other than it; a POST needs that same origin;
  the right ``?token=`` sets an HttpOnly SameSite=Strict cookie (a value derived from the
  token, not the token) and redirects to the URL without it; anything else without the cookie
  is a 401;
- every console response carries a strict CSP (``default-src 'self'``, no inline script),
  ``X-Frame-Options: DENY``, ``nosniff``, ``no-referrer`` and ``no-store``;
- uvicorn's access log is off and its loggers write nothing of a request's URL: the token
  never reaches a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from macula.private_file import write_private
from tools.daemon.console.app import Console
from tools.daemon.console.snapshot import ConsoleSource
from tools.daemon.http.home_token import home_token, http_dir, last_port_path, matches, port_path

log = logging.getLogger("macula.daemon")

HOST: Final = "127.0.0.1"
COOKIE: Final = "macula_console"
MCP_PATH: Final = "/mcp"
A2A_PREFIX: Final = "/a2a/"  # the A2A door (tools.daemon.http.a2a)
SECURITY_HEADERS: Final = (
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)


def cookie_value(token: str) -> str:
    """What the console's cookie holds: derived from the token, useless as a bearer token."""
    return hmac.new(token.encode("ascii"), b"macula-console-cookie-v1", hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Verdict:
    """``status`` 0: let it through; else answer it with ``status`` (``location``/``cookie``
    for the redirect that takes the token out of the URL)."""

    status: int
    reason: str = ""
    location: str | None = None
    cookie: str | None = None


def guard(
    *,
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    port: int,
    token: str,
) -> Verdict:
    """The decision for one console request (pure: everything it needs is an argument)."""
    allowed_hosts = {f"{HOST}:{port}", f"localhost:{port}"}
    if headers.get("host", "") not in allowed_hosts:
        return Verdict(421, "this listener answers only http://127.0.0.1 on its own port")
    origin = headers.get("origin")
    if origin is not None and origin not in {f"http://{h}" for h in allowed_hosts}:
        return Verdict(403, "cross-origin request refused")
    if method not in ("GET", "HEAD") and origin is None:
        return Verdict(403, "a write needs the console's own Origin")
    pairs = parse_qsl(query, keep_blank_values=True)
    presented = next((v for k, v in pairs if k == "token"), None)
    if presented is not None:
        if method != "GET" or not matches(presented, token):
            return Verdict(401, "wrong token: use the URL `macula-mcp console` prints")
        rest = urlencode([(k, v) for k, v in pairs if k != "token"])
        return Verdict(
            303, location=path + (f"?{rest}" if rest else ""), cookie=cookie_value(token)
        )
    cookie = SimpleCookie()
    with contextlib.suppress(Exception):
        cookie.load(headers.get("cookie", ""))
    held = cookie.get(COOKIE)
    if held is None or not hmac.compare_digest(held.value.encode(), cookie_value(token).encode()):
        return Verdict(401, "no token: open the URL `macula-mcp console` prints")
    return Verdict(0)


def _with_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
        await send(message)

    return sending


class Guarded:
    """The console behind ``guard``; ``/mcp`` and ``/a2a/`` (when mounted) straight to their own
    apps (each checks its own bearer tokens)."""

    def __init__(
        self, console: Console, token: str, mcp: ASGIApp | None, a2a: ASGIApp | None = None
    ) -> None:
        self.console = console
        self.app = console.app()
        self.token = token
        self.port = 0  # set by ``serve`` once it listens
        self.mcp = mcp
        self.a2a = a2a

    def close(self) -> None:
        """End the live feeds (they would keep the listener from stopping)."""
        self.console.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await (self.mcp or self.app)(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # no websockets here
        path: str = scope["path"]
        if self.mcp is not None and (path == MCP_PATH or path.startswith(MCP_PATH + "/")):
            await self.mcp(scope, receive, send)
            return
        if self.a2a is not None and path.startswith(A2A_PREFIX):
            await self.a2a(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        verdict = guard(
            method=scope["method"],
            path=path,
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=headers,
            port=self.port,
            token=self.token,
        )
        send = _with_headers(send)
        if verdict.status == 0:
            await self.app(scope, receive, send)
            return
        await _refuse(send, verdict)


async def _refuse(send: Send, verdict: Verdict) -> None:
    """The refusal, whole, with its Content-Length. Sent chunked (no length) before the request's
    body was read, a refusal on a ``Connection: close`` request was cut by a reset about 1 time in
    200 (urllib clients, uvicorn's h11, either loop): the chunked tail lost."""
    body = (verdict.reason or "see other").encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode("ascii")),
    ]
    if verdict.location is not None:
        headers.append((b"location", verdict.location.encode("latin-1")))
    if verdict.cookie is not None:
        cookie = f"{COOKIE}={verdict.cookie}; HttpOnly; SameSite=Strict; Path=/"
        headers.append((b"set-cookie", cookie.encode("ascii")))
    await send({"type": "http.response.start", "status": verdict.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def build_app(
    daemon: ConsoleSource, mcp_app: ASGIApp | None = None, a2a_app: ASGIApp | None = None
) -> Guarded:
    """The listener's ASGI app: the console of ``daemon`` guarded by its home's token;
    ``mcp_app`` (when given) at ``/mcp`` and ``a2a_app`` at ``/a2a/``, unguarded here (each
    checks its bearer tokens)."""
    return Guarded(Console(daemon), home_token(daemon.home), mcp_app, a2a_app)


def bind(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``port`` (0: a free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def bind_home(home: Path, port: int) -> socket.socket:
    """The home's listener: on ``port`` when one is set (``MACULA_MCP_HTTP_PORT``; taken is an
    error), else on the port this home used last, so the URLs ``register --http`` wrote stay
    right across daemon restarts, and on a free one when that is taken (remembered from then)."""
    if port:
        return bind(port)
    last = last_port(home)
    sock: socket.socket | None = None
    if last:
        with contextlib.suppress(OSError):
            sock = bind(last)
    if sock is None:
        sock = bind(0)
    chosen = sock.getsockname()[1]
    if chosen != last:
        _write_private(last_port_path(home), f"{chosen}\n")
    return sock


def last_port(home: Path) -> int:
    """The port the home's listener had last (0: none or unreadable)."""
    with contextlib.suppress(OSError, ValueError):
        value = int(last_port_path(home).read_text(encoding="ascii").strip())
        if 1024 <= value <= 65535:
            return value
    return 0


def _write_private(path: Path, text: str) -> None:
    http_dir(path.parent.parent)
    write_private(path, text.encode("ascii"))


def write_port(home: Path, port: int) -> Path:
    """The port file (0600), written whole or not at all."""
    path = port_path(home)
    _write_private(path, f"{port}\n")
    return path


@contextlib.contextmanager
def _quiet_uvicorn() -> Iterator[None]:
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.WARNING)
    yield


async def serve(app: Guarded, sock: socket.socket, home: Path, stopping: asyncio.Event) -> None:
    """Serve ``app`` on ``sock`` until ``stopping`` is set; the port file lives meanwhile."""
    import uvicorn

    port = app.port = sock.getsockname()[1]

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the daemon owns SIGTERM/SIGINT
            yield

    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="auto",
        timeout_graceful_shutdown=1,
        ws="none",
        server_header=False,
    )
    server = _Server(config)

    async def stop_when_asked() -> None:
        await stopping.wait()
        app.close()
        server.should_exit = True

    with _quiet_uvicorn():
        stopper = asyncio.ensure_future(stop_when_asked())
        path = write_port(home, port)
        log.info("console and HTTP listening on %s:%d", HOST, port)
        try:
            await server.serve(sockets=[sock])
        finally:
            stopper.cancel()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
