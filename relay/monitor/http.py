"""The monitoring port's HTTP/1.1: a strict request parser (pure) and a bounded asyncio server.

Invariants: only ``GET`` and ``HEAD`` are served; a request line is at most
``MAX_REQUEST_LINE`` bytes, the headers at most ``MAX_HEADER_BYTES`` in all and
``MAX_HEADERS`` lines; a request with a body is refused (the monitor takes no input); every
response carries ``Connection: close`` and the connection closes after it. The server holds at
most ``max_clients`` connections at once (more are answered 503 and closed at once) and gives
each ``read_timeout_s`` to send its whole request head (then 408 and closed), so a slow or
hostile client costs a bounded amount of memory and never holds the station's loop: every read
and write is awaited, bounded and timed out. Each client is served by a task run through the
injected ``spawn`` (the station's task group) in a ``macula.task_scope.TaskScope``; ``close``
cancels and awaits them, and a client accepted while the station stops is closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from macula.errors import ConfigError
from macula.task_scope import Spawner, TaskScope

log = logging.getLogger("macula.relay.monitor")

MAX_REQUEST_LINE = 2048
MAX_HEADER_BYTES = 8192
MAX_HEADERS = 32
WRITE_TIMEOUT_S = 5.0

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


class BadRequest(Exception):
    """A request the monitor will not serve: ``status`` says why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


def parse_request_line(line: bytes) -> tuple[str, str, dict[str, str]]:
    """``GET /path?q HTTP/1.1`` (CRLF already cut) -> (method, path, query)."""
    if len(line) > MAX_REQUEST_LINE:
        raise BadRequest(414, "request line too long")
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(400, "request line is not ASCII") from None
    parts = text.split(" ")
    if len(parts) != 3 or not all(parts):
        raise BadRequest(400, "request line is not METHOD TARGET VERSION")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505, f"{version[:16]!r} is not HTTP/1.x")
    if method not in ("GET", "HEAD"):
        raise BadRequest(405, "only GET and HEAD")
    if not target.startswith("/") or any(ord(c) <= 32 or ord(c) == 127 for c in target):
        raise BadRequest(400, "the target is not an absolute path")
    split = urlsplit(target)
    return method, split.path, dict(parse_qsl(split.query, keep_blank_values=True))


def parse_header_line(line: bytes) -> tuple[str, str]:
    """``Name: value`` -> (lower-case name, stripped value); no obsolete line folding."""
    if line[:1] in (b" ", b"\t"):
        raise BadRequest(400, "folded header lines are not accepted")
    name, sep, value = line.partition(b":")
    if not sep or not name or name != name.strip() or b" " in name:
        raise BadRequest(400, "a header line is not Name: value")
    try:
        return name.decode("ascii").lower(), value.strip().decode("latin-1")
    except UnicodeDecodeError:
        raise BadRequest(400, "a header name is not ASCII") from None


def check_headers(headers: dict[str, str]) -> None:
    """The monitor takes no request body."""
    if "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0"):
        raise BadRequest(413, "the monitor takes no request body")


def encode_response(response: Response, *, head: bool) -> bytes:
    """The whole response, ``Connection: close``; no body for ``HEAD``."""
    reason = REASONS.get(response.status, "Unknown")
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Connection: close",
        "Cache-Control: no-store",
        "X-Content-Type-Options: nosniff",
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else response.body)


async def read_request(reader: asyncio.StreamReader) -> Request:
    """One request head from ``reader`` (bounded; the caller times it out)."""
    line = await _line(reader, MAX_REQUEST_LINE, 414, "request line too long")
    method, path, query = parse_request_line(line)
    headers: dict[str, str] = {}
    total = 0
    while True:
        line = await _line(reader, MAX_HEADER_BYTES, 431, "header line too long")
        if not line:
            break
        total += len(line)
        if total > MAX_HEADER_BYTES or len(headers) >= MAX_HEADERS:
            raise BadRequest(431, "too many header bytes or lines")
        name, value = parse_header_line(line)
        headers[name] = value
    check_headers(headers)
    return Request(method, path, query, headers)


async def _line(reader: asyncio.StreamReader, limit: int, status: int, detail: str) -> bytes:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise BadRequest(status, detail) from None
    except asyncio.IncompleteReadError:
        raise BadRequest(400, "connection closed mid-request") from None
    if len(raw) > limit + 2:
        raise BadRequest(status, detail)
    if not raw.endswith(b"\r\n"):
        raise BadRequest(400, "lines must end in CRLF")
    return raw[:-2]


Handler = Callable[[Request], Awaitable[Response]]


class MonitorServer:
    """``asyncio.start_server`` on the station's loop with the bounds above."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_clients: int = 16,
        read_timeout_s: float = 5.0,
        spawn: Spawner | None = None,
    ):
        self.handler = handler
        self.max_clients = max_clients
        self.read_timeout_s = read_timeout_s
        self.clients = 0
        self.stats = {"requests": 0, "timed_out": 0, "refused_busy": 0, "bad_requests": 0}
        self._server: asyncio.Server | None = None
        self._scope = TaskScope(spawn)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; a port in use is a ``ConfigError`` naming the monitor's address (not the
        station's, which listens already)."""
        try:
            self._server = await asyncio.start_server(
                self._accepted, host, port, limit=MAX_HEADER_BYTES + 2, reuse_address=True
            )
        except OSError as exc:
            raise ConfigError(
                f"--monitor {host}:{port}: cannot listen there ({exc.strerror or exc}); another "
                "program holds it: choose another --monitor port"
            ) from None
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._scope.aclose()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._scope.spawn(self._client(reader, writer)) is None:
            writer.close()  # closing: served by nobody

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients += 1
        try:
            if self.clients > self.max_clients:
                self.stats["refused_busy"] += 1
                await self._send(writer, Response(503, b"monitor busy\n"), head=False)
                return
            await self._serve_one(reader, writer)
        finally:
            self.clients -= 1
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = False
        try:
            request = await asyncio.wait_for(read_request(reader), self.read_timeout_s)
            head = request.method == "HEAD"
            self.stats["requests"] += 1
            response = await self.handler(request)
        except TimeoutError:
            self.stats["timed_out"] += 1
            response = Response(408, b"request head not received in time\n")
        except BadRequest as exc:
            self.stats["bad_requests"] += 1
            response = Response(exc.status, f"{exc.detail}\n".encode())
        except (ConnectionError, OSError):
            return
        except Exception:
            log.exception("monitor request failed")
            response = Response(500, b"internal error\n")
        await self._send(writer, response, head=head)

    async def _send(self, writer: asyncio.StreamWriter, response: Response, *, head: bool) -> None:
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            writer.write(encode_response(response, head=head))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
