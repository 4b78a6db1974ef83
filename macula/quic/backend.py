"""Which QUIC library carries the transport: aioquic (the default) or qh3 (``macula-mesh[fast]``).

Every import of the QUIC library in ``macula`` and ``relay`` goes through this module. Invariants:
- the choice is made once, at import, from ``MACULA_QUIC``: unset, empty or ``aioquic`` selects
  aioquic; ``qh3`` selects qh3. Any other value, or ``qh3`` when qh3 is not installed, raises
  ``QuicBackendError`` naming the fix; nothing falls back silently;
- aioquic stays the default even when qh3 is installed: with this project's trims (large
  loopback datagrams, ACKs that ride on replies) it costs no more CPU than qh3 2.1 per message
  or per content MiB, and only on aioquic does a paused stream push back on its sender (qh3's
  native core has no hook for receive credit, so ``macula.quic.held_streams`` cuts a stream off
  past one window instead; docs/performance.md §7);
- names and types are aioquic's (mypy checks against aioquic only); on qh3 the same names come
  from qh3, adapted where its API differs: the client advertises Ed25519 in TLS
  ``signature_algorithms`` (qh3 leaves it out by default), ``close(error_code, reason_phrase)``
  is accepted by the protocol, and the peer certificate and unsent-byte count are read through
  ``peer_certificate`` and ``unsent_bytes``, which work on both.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from cryptography import x509

from macula.config import QUIC_ENV, choice_setting
from macula.errors import ConfigError

ENV = QUIC_ENV
CHOICES = ("aioquic", "qh3")


class QuicBackendError(ConfigError):
    """``MACULA_QUIC`` names a QUIC library that is unknown or not installed."""


def chosen(environ: Mapping[str, str] = os.environ) -> str:
    """The backend ``MACULA_QUIC`` selects ("aioquic" when unset or empty)."""
    return choice_setting(environ, ENV, CHOICES, QuicBackendError)


BACKEND = chosen()

if TYPE_CHECKING:
    from aioquic.asyncio.protocol import QuicConnectionProtocol as _BaseProtocol
    from aioquic.asyncio.server import QuicServer, serve
    from aioquic.quic import events
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import (
        MAX_STREAM_DATA_FRAME_CAPACITY,
        NetworkAddress,
        QuicConnection,
    )
    from aioquic.quic.packet import QuicErrorCode, QuicFrameType
    from aioquic.quic.stream import QuicStream
elif BACKEND == "qh3":
    try:
        from qh3.asyncio.protocol import QuicConnectionProtocol as _Qh3Protocol
        from qh3.asyncio.server import QuicServer, serve
        from qh3.quic import events
        from qh3.quic.configuration import QuicConfiguration as _Qh3Configuration
        from qh3.quic.connection import NetworkAddress, QuicConnection, QuicConnectionError
        from qh3.quic.packet import QuicErrorCode, QuicFrameType
        from qh3.tls import SignatureAlgorithm
    except ImportError as exc:
        raise QuicBackendError(
            f"{ENV}=qh3 but qh3 is not importable ({exc}); install macula-mesh[fast] or unset {ENV}"
        ) from exc
    import dataclasses

    # qh3 has no Python stream objects or frame builder: ``macula.quic.credit`` finds no
    # ``_write_stream_limits`` on a qh3 connection and stays uninstalled; these two names only
    # keep its imports valid.
    MAX_STREAM_DATA_FRAME_CAPACITY = 1 + 2 * 8
    QuicStream = Any

    # qh3's default client list leaves EdDSA out; a station's certificate is Ed25519.
    _SIGNATURES = [
        SignatureAlgorithm.ED25519,
        SignatureAlgorithm.ECDSA_SECP256R1_SHA256,
        SignatureAlgorithm.RSA_PSS_RSAE_SHA256,
        SignatureAlgorithm.RSA_PKCS1_SHA256,
        SignatureAlgorithm.ECDSA_SECP384R1_SHA384,
        SignatureAlgorithm.RSA_PSS_RSAE_SHA384,
        SignatureAlgorithm.RSA_PKCS1_SHA384,
        SignatureAlgorithm.RSA_PSS_RSAE_SHA512,
        SignatureAlgorithm.RSA_PKCS1_SHA512,
    ]

    @dataclasses.dataclass
    class QuicConfiguration(_Qh3Configuration):
        signature_algorithms: list[int] | None = dataclasses.field(
            default_factory=lambda: list(_SIGNATURES)
        )

    class _BaseProtocol(_Qh3Protocol):
        def close(self, error_code: int = 0, reason_phrase: str = "") -> None:
            """aioquic's signature (qh3's ``close`` takes no arguments)."""
            self._quic.close(error_code=error_code, reason_phrase=reason_phrase)
            self.transmit()
else:
    from aioquic.asyncio.protocol import QuicConnectionProtocol as _BaseProtocol
    from aioquic.asyncio.server import QuicServer, serve
    from aioquic.quic import events
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import (
        MAX_STREAM_DATA_FRAME_CAPACITY,
        NetworkAddress,
        QuicConnection,
    )
    from aioquic.quic.packet import QuicErrorCode, QuicFrameType
    from aioquic.quic.stream import QuicStream

# What the library raises when a stream or connection can no longer be written (finished,
# reset, stopped, or the connection closed): aioquic's assertions and ValueError/RuntimeError;
# qh3 wraps its native core's refusals in its own ``QuicConnectionError``, an ``Exception``
WRITE_REFUSED: tuple[type[Exception], ...] = (AssertionError, ValueError, RuntimeError)
if not TYPE_CHECKING and BACKEND == "qh3":
    WRITE_REFUSED += (QuicConnectionError,)

# aioquic can close a server connection before its first datagram is fed (the close goes out
# in an Initial packet, with no handshake work done); qh3 builds its native core from that
# first datagram and ignores a close before it, so there the refusal follows the datagram
CLOSES_BEFORE_FIRST_DATAGRAM = BACKEND == "aioquic"


class QuicConnectionProtocol(_BaseProtocol):
    """The library's protocol; on a connected UDP socket (a client's ``dial``) every datagram
    goes out without an address: uvloop refuses ``sendto(data, addr)`` there (EISCONN, reported
    to ``error_received`` only), which would silently stall the handshake."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        try:
            connected = sock is not None and bool(sock.getpeername())
        except OSError:  # not connected: a server's socket
            connected = False
        if connected:  # (uvloop's transport is no asyncio.DatagramTransport subclass)
            self._transport = _ConnectedDatagrams(cast(asyncio.DatagramTransport, transport))


class _ConnectedDatagrams(asyncio.DatagramTransport):
    """A datagram transport on a connected socket: ``sendto`` drops the (same) address."""

    def __init__(self, inner: asyncio.DatagramTransport) -> None:
        super().__init__(inner.get_extra_info("extra", None))
        self._inner = inner

    def sendto(self, data: Any, addr: Any = None) -> None:
        self._inner.sendto(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def close(self) -> None:
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def __getattr__(self, name: str) -> Any:  # pause_reading, resume_reading, ...
        return getattr(self._inner, name)


__all__ = [
    "BACKEND",
    "CLOSES_BEFORE_FIRST_DATAGRAM",
    "MAX_STREAM_DATA_FRAME_CAPACITY",
    "WRITE_REFUSED",
    "NetworkAddress",
    "QuicBackendError",
    "QuicConfiguration",
    "QuicConnection",
    "QuicConnectionProtocol",
    "QuicErrorCode",
    "QuicFrameType",
    "QuicServer",
    "QuicStream",
    "application_space",
    "closed_by_peer_early",
    "derive_reset_tokens",
    "ended_by_reset",
    "events",
    "lean_handshake",
    "offer_x25519_only",
    "peer_certificate",
    "peer_reset_token",
    "release_crypto_buffers",
    "serve",
    "set_ack_delay",
    "unsent_bytes",
]


def peer_certificate(quic: QuicConnection) -> x509.Certificate | None:
    """The peer's TLS certificate (``cryptography`` object) once the handshake presented one."""
    certificate: Any = getattr(quic.tls, "_peer_certificate", None)
    if certificate is None:
        return None
    if isinstance(certificate, x509.Certificate):  # aioquic
        return certificate
    try:  # qh3: its own parsed certificate; public_bytes() is the DER
        der = certificate.public_bytes()
        return x509.load_der_x509_certificate(der if isinstance(der, bytes) else bytes(der))
    except (AttributeError, TypeError, ValueError):
        return None


def unsent_bytes(quic: QuicConnection, stream_id: int, written: int) -> int | None:
    """Of ``written`` bytes given to ``send_stream_data`` on ``stream_id``, how many the library
    has not sent yet; None once it no longer knows the stream (ended or reset)."""
    streams: dict[int, QuicStream] | None = getattr(quic, "_streams", None)
    if streams is not None:  # aioquic
        stream = streams.get(stream_id)
        if stream is None:
            return None
        return max(0, written - stream.sender.highest_offset)
    native: Any = quic  # qh3: the native core counts what still waits for a first send
    if not native._stream_can_send(stream_id):
        return None
    return int(native.get_send_buffer_size(stream_id))


def closed_by_peer_early(quic: QuicConnection) -> events.ConnectionTerminated | None:
    """qh3, client side: the close the peer sent (or a protocol error), as soon as it is known.
    qh3 reports ``ConnectionTerminated`` only once its draining period is over (4 s after a
    refusal on a first flight); aioquic needs no help here. None when there is none, on a
    server (its draining must keep absorbing the peer's packets), or on aioquic."""
    if BACKEND != "qh3" or not quic.configuration.is_client:
        return None
    event: events.ConnectionTerminated | None = getattr(quic, "_close_event", None)
    return event


def offer_x25519_only(quic: QuicConnection) -> None:
    """aioquic: the ClientHello of ``quic`` offers one key share, X25519, instead of four (each
    share is a key generated per connect; docs/performance.md §5). Call once its TLS context
    exists. qh3: nothing (its TLS is native and chooses for itself)."""
    if BACKEND == "aioquic":
        from aioquic.tls import Group

        quic.tls._supported_groups = [Group.X25519]


# -- ACK scheduling: aioquic only (qh3's packet core is native; there the helpers do nothing) --


def set_ack_delay(quic: QuicConnection, seconds: float) -> None:
    """How long aioquic may hold an ACK for a 1-RTT packet (its own: 1 ms, hard-coded). The
    caller keeps it under the ``max_ack_delay`` aioquic advertises (25 ms, RFC 9000 §13.2.1)."""
    if BACKEND == "aioquic":
        quic._ack_delay = seconds


def application_space(quic: QuicConnection) -> Any | None:
    """aioquic's 1-RTT packet space of ``quic`` (``ack_at``: when an ACK is due, None when
    none is owed; ``largest_received_packet``), None before the handshake set it up or on qh3."""
    if BACKEND != "aioquic":
        return None
    from aioquic.tls import Epoch

    return quic._spaces.get(Epoch.ONE_RTT)


def release_crypto_buffers(quic: QuicConnection) -> bool:
    """aioquic keeps three 16 KiB TLS output buffers for a connection's life; once the handshake
    is confirmed TLS writes nothing more (no session tickets are issued, QUIC forbids TLS
    KeyUpdate): replace them with empty ones. False when not confirmed yet, or not aioquic."""
    if BACKEND != "aioquic" or not getattr(quic, "_handshake_confirmed", False):
        return False
    from aioquic._buffer import Buffer

    buffers = quic._crypto_buffers
    for epoch in list(buffers):
        buffers[epoch] = Buffer(capacity=0)
    return True


# The RFC 9000 minimum: one spare connection id each way instead of aioquic's seven, each one a
# NEW_CONNECTION_ID frame built, sent, parsed and stored per connect (docs/performance.md §11)
ACTIVE_CONNECTION_ID_LIMIT = 2
_PADDING = 0x00


def lean_handshake(quic: QuicConnection) -> None:
    """aioquic: make ``quic`` (client or server, created but not yet started) cheaper to set
    up. It asks its peer for one spare connection id, not seven; and it skips a PADDING run
    with one native ``lstrip`` instead of aioquic's Python loop over every byte (a client pads
    the 1-RTT packet of its second flight to the whole datagram: 15.6 KB on loopback, ~0.4 ms
    of the station's CPU per connect, and any peer can send such packets). qh3: nothing."""
    if BACKEND != "aioquic":
        return
    quic._local_active_connection_id_limit = ACTIVE_CONNECTION_ID_LIMIT
    handlers: dict[int, tuple[Any, Any]] | None = getattr(
        quic, "_QuicConnection__frame_handlers", None
    )
    if handlers is None or _PADDING not in handlers or quic._quic_logger is not None:
        return  # another aioquic layout, or a qlog wants every PADDING frame logged
    handlers[_PADDING] = (_skip_padding, handlers[_PADDING][1])


def _skip_padding(context: Any, frame_type: int, buf: Any) -> None:
    """aioquic's PADDING handler, natively: consume every zero byte from here on."""
    start = buf.tell()
    rest = buf.data_slice(start, buf.capacity)
    buf.seek(start + len(rest) - len(rest.lstrip(b"\x00")))


# -- stateless resets (RFC 9000 §10.3, macula.quic.resets). Sending them needs aioquic: qh3's
# native core makes its own random tokens and has no hook for ours, so a qh3 station sends none
# (a reset of ours could never match its tokens). Receiving works on both: aioquic is told here;
# qh3's core recognises a reset itself and ends the connection --

STATELESS_RESETS = BACKEND == "aioquic"
_ENDED = frozenset({"CLOSING", "DRAINING", "TERMINATED"})  # both libraries' state names


def derive_reset_tokens(quic: QuicConnection, token_for: Callable[[bytes], bytes]) -> bool:
    """aioquic, server side: every connection id ``quic`` (created, not yet fed a datagram)
    hands out carries ``token_for(cid)`` as its stateless reset token, in the transport
    parameters and in NEW_CONNECTION_ID frames, instead of aioquic's random one (made where
    aioquic makes ids: in the constructor, and in ``_replenish_connection_ids``). False, and
    nothing done, on qh3."""
    if not STATELESS_RESETS:
        return False

    def tokens_derived() -> None:
        for connection_id in quic._host_cids:
            connection_id.stateless_reset_token = token_for(connection_id.cid)

    replenish = quic._replenish_connection_ids

    def replenish_derived() -> None:
        replenish()
        tokens_derived()

    tokens_derived()
    quic._replenish_connection_ids = replenish_derived  # type: ignore[method-assign]
    return True


def peer_reset_token(quic: QuicConnection) -> bytes | None:
    """Client side: the stateless reset token of the connection id ``quic`` sends to (from the
    peer's transport parameters, or on aioquic its NEW_CONNECTION_ID); None if it gave none."""
    if STATELESS_RESETS:
        token: bytes | None = quic._peer_cid.stateless_reset_token
    else:  # qh3 keeps the peer's transport parameters once applied
        parameters: Any = getattr(quic, "_applied_transport_parameters", None)
        token = getattr(parameters, "stateless_reset_token", None)
    return token or None


def ended_by_reset(quic: QuicConnection, state_before: Any, reason: str) -> bool:
    """A stateless reset for ``quic`` arrived (``state_before``: its ``_state`` before the
    datagram). aioquic: end it at once, as RFC 9000 §10.3.1 says (no draining, nothing more
    sent; ``ConnectionTerminated`` with ``reason`` is its next event). qh3: its core has ended it
    itself. True when this reset ended the connection (it had not ended before)."""
    if getattr(state_before, "name", None) in _ENDED:
        return False
    if not STATELESS_RESETS:
        return getattr(quic._state, "name", None) in _ENDED
    quic._close_event = events.ConnectionTerminated(
        error_code=QuicErrorCode.NO_ERROR, frame_type=None, reason_phrase=reason
    )
    quic._close_end()
    return True


def describe() -> dict[str, str]:
    """The selected backend and its version, for logs and benchmarks."""
    from importlib.metadata import version

    return {"quic": BACKEND, "version": version(BACKEND)}
