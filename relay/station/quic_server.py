"""The station's QUIC server: the library's ``QuicServer`` with its connection ids indexed by
connection, so a connection ending costs the ids it had, not a scan of every connection's.

aioquic 1.7 and qh3 2.1 keep ``QuicServer._protocols`` (connection id -> protocol) and, when a
connection ends, copy and scan the whole map to find its ids (``_connection_terminated``): at
1,000 connections about 0.25 ms per ending, a third of the station's busy time while hundreds
of agents reconnected at once (docs/performance.md, issue 27). Here the map keeps a reverse
index as it is written (``__setitem__``, ``__delitem__``, ``clear``: every way the library
writes it), and an ending removes exactly the ids that still name that connection.
Invariant: ``cids_of[p]`` is the set of ids ``i`` with ``self[i] is p``.

Stateless resets (RFC 9000 §10.3, ``macula.quic.resets``), aioquic only: given the station's
``StatelessResets``, every connection id the server hands out carries a reset token derived
from the station's key and that id (not aioquic's random one), and a short-header packet for
an id the server does not know is answered with a reset (smaller than the packet, none for a
packet of 21 bytes or fewer, at most ``rate`` a second), so the clients of a station that was
restarted learn at their next packet that their connection is gone. On qh3 (its tokens are
native and random) nothing of this is done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from macula.quic.backend import (
    STATELESS_RESETS,
    NetworkAddress,
    QuicConnection,
    QuicServer,
    derive_reset_tokens,
)
from macula.quic.resets import StatelessResets, unknown_cid


class ProtocolsByCid(dict[bytes, Any]):
    """Connection id -> protocol, with the ids of each protocol."""

    def __init__(self) -> None:
        super().__init__()
        self.cids_of: dict[Any, set[bytes]] = {}

    def __setitem__(self, cid: bytes, protocol: Any) -> None:
        previous = self.get(cid)
        if previous is not None and previous is not protocol:
            self._unindex(cid, previous)
        super().__setitem__(cid, protocol)
        self.cids_of.setdefault(protocol, set()).add(cid)

    def __delitem__(self, cid: bytes) -> None:
        protocol = self[cid]
        super().__delitem__(cid)
        self._unindex(cid, protocol)

    def clear(self) -> None:
        super().clear()
        self.cids_of.clear()

    def forget(self, protocol: Any) -> None:
        """Remove every id that names ``protocol``."""
        for cid in self.cids_of.pop(protocol, ()):
            super().__delitem__(cid)

    def _unindex(self, cid: bytes, protocol: Any) -> None:
        cids = self.cids_of.get(protocol)
        if cids is not None:
            cids.discard(cid)
            if not cids:
                del self.cids_of[protocol]


class StationQuicServer(QuicServer):
    """``QuicServer`` whose connection endings do not scan every connection, and which answers
    packets of connections it does not know with stateless resets (given ``resets``)."""

    def __init__(self, *args: Any, resets: StatelessResets | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._protocols: ProtocolsByCid = ProtocolsByCid()
        self.resets = resets if STATELESS_RESETS else None
        if self.resets is not None:
            self._create_protocol = self._with_reset_tokens(self._create_protocol, self.resets)

    @staticmethod
    def _with_reset_tokens(
        create: Callable[..., Any], resets: StatelessResets
    ) -> Callable[..., Any]:
        def create_protocol(quic: QuicConnection, **kwargs: Any) -> Any:
            derive_reset_tokens(quic, resets.token)  # before its first datagram
            return create(quic, **kwargs)

        return create_protocol

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        resets = self.resets
        if resets is not None and isinstance(data, bytes):
            cid = unknown_cid(data, self._configuration.connection_id_length)
            if cid is not None and cid not in self._protocols:
                reset = resets.answer(data, cid, self._loop.time())
                if reset is not None and self._transport is not None:
                    self._transport.sendto(reset, addr)
                return  # aioquic would drop it
        super().datagram_received(data, addr)

    def _connection_terminated(self, protocol: Any) -> None:
        self._protocols.forget(protocol)
