"""Read several UDP datagrams per readiness callback instead of asyncio's one.

asyncio's datagram transport reads one datagram each time the socket polls readable, so a burst
of N datagrams costs N event-loop turns (N ``select`` calls) and, for QUIC, N transmits.
``DrainingProtocol`` sits between such a transport and the real protocol: after the transport
hands it a datagram it reads on from the same socket (a socket the caller made and gave the
transport with ``sock=``; asyncio's public API offers no way to replace the transport's reader)
until the socket is empty or ``max_batch`` datagrams were read. Invariants:
- at most ``max_batch`` datagrams per readiness callback, then the loop runs other callbacks;
  the socket is level-triggered, so what is left is read on the next turn: nothing is lost;
- every datagram goes to the inner protocol's ``datagram_received`` in arrival order; an
  ``OSError`` from ``recvfrom`` goes to its ``error_received`` (as asyncio does) and ends the batch;
- nothing is read once the transport is closing; sending, closing, ``connection_made`` and
  ``connection_lost`` are the transport's, passed through unchanged.
"""

from __future__ import annotations

import asyncio
import socket

READ_BATCH = 32  # datagrams read per readiness callback, at most
MAX_DATAGRAM = 256 * 1024  # asyncio's own receive size for datagram transports


class DrainingProtocol(asyncio.DatagramProtocol):
    """Hands ``inner`` every datagram waiting on ``sock`` per readiness, up to ``max_batch``."""

    def __init__(
        self, inner: asyncio.DatagramProtocol, sock: socket.socket, max_batch: int = READ_BATCH
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self.inner = inner
        self._sock = sock
        self._max_batch = max_batch
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.DatagramTransport) -> None:  # type: ignore[override]
        self._transport = transport
        self.inner.connection_made(transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        deliver = self.inner.datagram_received
        deliver(data, addr)
        transport, receive = self._transport, self._sock.recvfrom
        for _ in range(self._max_batch - 1):
            if transport is None or transport.is_closing():
                return
            try:
                data, addr = receive(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.inner.error_received(exc)
                return
            deliver(data, addr)

    def error_received(self, exc: Exception) -> None:
        self.inner.error_received(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


async def bound_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A non-blocking UDP socket bound to ``host:port`` (the first address that binds), as
    ``loop.create_datagram_endpoint(local_addr=...)`` would make it; ``reuse_port``: with
    ``SO_REUSEPORT``, so several processes share the port (``macula-relay --workers``)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error or OSError(f"no address to bind for {host}:{port}")


async def open_draining(
    sock: socket.socket, protocol: asyncio.DatagramProtocol
) -> asyncio.DatagramTransport:
    """``protocol`` on ``sock`` (made by the caller) behind a ``DrainingProtocol``; ``sock``
    is closed when that fails."""
    try:
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: DrainingProtocol(protocol, sock), sock=sock
        )
    except BaseException:
        sock.close()
        raise
    return transport
