"""The station's QUIC server: the library's ``QuicServer`` with its connection ids indexed by
connection, so a connection ending costs the ids it had, not a scan of every connection's.

aioquic 1.7 and qh3 2.1 keep ``QuicServer._protocols`` (connection id -> protocol) and, when a
connection ends, copy and scan the whole map to find its ids (``_connection_terminated``): at
1,000 connections about 0.25 ms per ending, a third of the station's busy time while hundreds
of agents reconnected at once (docs/performance.md, issue 27). Here the map keeps a reverse
index as it is written (``__setitem__``, ``__delitem__``, ``clear``: every way the library
writes it), and an ending removes exactly the ids that still name that connection.
Invariant: ``cids_of[p]`` is the set of ids ``i`` with ``self[i] is p``.
"""

from __future__ import annotations

from typing import Any

from macula.quic_backend import QuicServer


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
    """``QuicServer`` whose connection endings do not scan every connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._protocols: ProtocolsByCid = ProtocolsByCid()

    def _connection_terminated(self, protocol: Any) -> None:
        self._protocols.forget(protocol)
