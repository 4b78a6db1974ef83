"""The daemon's A2A door (``tools.a2a.door``), loaded when it is first needed.

The door imports the ``a2a-sdk`` (about 0.55 s on the test machine), so nothing else pays for
it: the listener loads it at start, in the background, only for a home that has A2A clients
(``$MACULA_HOME/a2a/clients/*.json``), else on the first ``/a2a/`` request.

Invariants:
- one door per daemon, entered and exited in one task of the daemon's task group, closed when
  the daemon stops; a door that fails to load answers 503 and is logged;
- beyond loopback (``A2ASettings.listen``, the explicit flag) a listener of its own serves the
  door and nothing else: the console and ``/mcp`` stay on 127.0.0.1. An address it cannot bind
  (busy, not this host's) is logged naming the variable and leaves the daemon running, the
  door on loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from starlette.types import Receive, Scope, Send

from tools.settings import A2A_LISTEN_ENV, A2ASettings

log = logging.getLogger("macula.daemon")

PREFIX: Final = "/a2a/"
BEYOND_LOOPBACK: Final = "macula.a2a.beyond_loopback"  # a scope key: came from beyond loopback
UNAVAILABLE: Final = (
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-32603,'
    b'"message":"the A2A door is not available: see the daemon log"}}'
)


class DoorMount:
    """``/a2a/`` of the daemon's listener: the door, loaded on first use."""

    def __init__(
        self,
        hosts: Any,
        home: Path,
        settings: A2ASettings,
        group: asyncio.TaskGroup,
        stopping: asyncio.Event,
    ) -> None:
        self.hosts, self.home, self.settings = hosts, home, settings
        self.group, self.stopping = group, stopping
        self.door: Any = None
        self.ready = asyncio.Event()
        self._started = False

    def warm(self) -> None:
        """Load the door now (in the background) when the home has A2A clients."""
        if any((self.home / "a2a" / "clients").glob("*.json")):
            self._start()

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self.group.create_task(self._run(), name="a2a-door")

    async def _run(self) -> None:
        try:
            module = await asyncio.to_thread(importlib.import_module, "tools.a2a.door")
            async with module.Door(self.hosts, self.home, self.settings) as door:
                self.door = door
                self.ready.set()
                log.info("A2A door open at %s", PREFIX)
                await self.stopping.wait()
        except Exception:
            log.exception("the A2A door failed")
        finally:
            self.door = None
            self.ready.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self._start()
        await self.ready.wait()
        if self.door is None:
            body = UNAVAILABLE
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.door(scope, receive, send)


class DoorOnly:
    """The app of the listener beyond loopback: ``/a2a/`` and nothing else (404)."""

    def __init__(self, mount: DoorMount) -> None:
        self.mount = mount

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PREFIX):
            # the door names the public URL (A2ASettings.public_url) in cards for these only
            await self.mount(dict(scope, **{BEYOND_LOOPBACK: 1}), receive, send)
            return
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-length", b"0")]})  # fmt: skip
            await send({"type": "http.response.body", "body": b""})


@contextlib.contextmanager
def _no_signals() -> Iterator[None]:
    yield


def _bound(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening); ``OSError`` if it cannot be."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_beyond_loopback(mount: DoorMount, host: str, port: int) -> None:
    """The door alone on ``host:port`` until the daemon stops (plain HTTP: put TLS in front,
    docs/a2a.md). An address it cannot bind is logged, and the daemon goes on without it."""
    import uvicorn

    try:
        sock = await asyncio.to_thread(_bound, host, port)
    except OSError as exc:
        log.error(
            "%s=%s:%d: cannot listen there (%s): the A2A door is served on loopback only",
            A2A_LISTEN_ENV, host, port, exc.strerror or exc,
        )  # fmt: skip
        return
    config = uvicorn.Config(
        DoorOnly(mount), host=host, port=port, log_config=None, access_log=False,
        lifespan="off", timeout_graceful_shutdown=1, ws="none", server_header=False,
        proxy_headers=False,
    )  # fmt: skip
    server = uvicorn.Server(config)
    server.capture_signals = _no_signals  # type: ignore[method-assign]  # the daemon owns them

    async def stop_when_asked() -> None:
        await mount.stopping.wait()
        server.should_exit = True

    stopper = asyncio.ensure_future(stop_when_asked())
    log.warning(
        "A2A door served beyond loopback on %s:%d (plain HTTP: put TLS in front)", host, port
    )
    try:
        await server.serve(sockets=[sock])
    except SystemExit:  # uvicorn exits on a startup failure: never the daemon's exit
        log.error("%s=%s:%d: the A2A listener stopped at start", A2A_LISTEN_ENV, host, port)
    finally:
        stopper.cancel()
        sock.close()
