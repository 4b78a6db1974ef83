"""How a station link comes up (docs/federation.md "A link"), sans-I/O; ``RouterCore`` owns it.

The dialling side opens a connection (``dialled_peer``) and sends CONNECT with the station bit
and its DHT port; it then takes only a HELLO on that control stream, from the node id it
dialled (``hello``). The accepting side's CONNECT handling is the core's; both sides end in
``link_up``. Invariants: a HELLO that is not from the expected node id, does not verify, is
stale or replayed, says ``accepted`` "false" or lacks the station bit closes the connection with
the reason, counted (``link_hello_invalid``, ``links_refused``); a station has at most one
linked connection here: of two, the one dialled by the lower node id stays (both dialled by
the same station: the newer), the other gets GOODBYE ``duplicate_link``, so both sides keep
the same one; ``LinkUp`` is emitted once per connection, and only by ``link_up``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from macula.services.refusals import DROPPED_BEFORE_HELLO, LINK_HELLO_INVALID, LINKS_REFUSED
from macula.wire.errors import ProtocolError
from macula.wire.frames import CAP_STATION, Hello, parse_frame
from relay.core.actions import Action, Close, LinkUp, Send
from relay.core.admission import FrameAdmission
from relay.core.frames import StationFrames, dht_port_of
from relay.core.logbook import clip
from relay.core.peers import Peer, PeerState, accepted_peer
from relay.core.policy import Quotas

log = logging.getLogger("macula.relay")

DUPLICATE_CLOSE_MS = 200  # a losing link's GOODBYE leaves before it is closed


def dialled_peer(
    conn: int, control: int, expected: bytes, host: str, quotas: Quotas, now_ms: int
) -> Peer:
    """The peer entry of a connection this station dialled, before its HELLO."""
    peer = accepted_peer(conn, "", quotas, now_ms)
    peer.control, peer.dialled, peer.expected_node_id, peer.link_host = (
        control,
        True,
        expected,
        host,
    )
    return peer


class LinkHandshake:
    def __init__(
        self,
        own_id: bytes,
        peers: dict[int, Peer],
        node_conn: dict[bytes, int],
        frames: StationFrames,
        admission: FrameAdmission,
        *,
        drop: Callable[[Peer, str, str], None],
        count: Callable[[str], None],
        forget: Callable[[Peer, int], list[Action]],
        linked: Callable[[Peer, int], list[Action]],
    ) -> None:
        self._own_id = own_id
        self._peers = peers
        self._node_conn = node_conn
        self._frames = frames
        self._admission = admission
        self._drop = drop
        self._count = count
        self._forget = forget  # the core's ``forget_peer``
        self._linked = linked  # ``ConnectHandling.station_linked``

    def hello(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int
    ) -> list[Action]:
        """The answer on a link this station dialled: a HELLO from the station it expected."""
        if stream != peer.control:
            return self._failed(peer, "data on another stream before HELLO")
        if frame_map.get("frame_type") != "hello":
            self._drop(peer, DROPPED_BEFORE_HELLO, "frame before HELLO")
            return []
        try:
            hello = parse_frame(frame_map)
        except ProtocolError as exc:
            return self._failed(peer, f"malformed HELLO: {exc.detail}")
        assert isinstance(hello, Hello)
        expected = peer.expected_node_id
        if hello.node_id != expected:
            why = f"HELLO from {hello.node_id.hex()[:16]}, dialled {expected.hex()[:16]}"
            return self._failed(peer, why)
        if not hello.verifies(expected):
            return self._failed(peer, "HELLO signature does not verify")
        if not self._admission.fresh(hello, now_ms, expected):
            return self._failed(peer, "HELLO is replayed or its clock is skewed")
        if not hello.accepted:
            why = f"link refused by the station (code {hello.refusal_code})"
            return self._failed(peer, why, counter=LINKS_REFUSED)
        if not hello.capabilities & CAP_STATION:
            return self._failed(peer, "peer is not a station")
        peer.node_id = expected
        peer.capabilities = CAP_STATION
        peer.dht_port = dht_port_of(hello.addresses)
        peer.state = PeerState.CONNECTED
        return self.link_up(peer, now_ms)

    def _failed(self, peer: Peer, why: str, counter: str = LINK_HELLO_INVALID) -> list[Action]:
        who = peer.expected_node_id.hex()[:16]
        log.info("conn %d: link to %s failed: %s", peer.conn, who, clip(why))
        self._drop(peer, counter, why)
        peer.state = PeerState.DRAINING
        return [Close(peer.conn, f"link failed: {why}")]

    def link_up(self, peer: Peer, now_ms: int) -> list[Action]:
        """A station peer's handshake is done (either side): one link per station, LinkUp."""
        out: list[Action] = []
        current = self._node_conn.get(peer.node_id)
        existing = self._peers.get(current) if current is not None else None
        if existing is not None and existing.state is PeerState.CONNECTED:
            self._count("duplicate_links")
            if existing.linked and self._stays(existing, peer):
                detail = "a link with this station exists"
                out.append(self._goodbye(peer, "duplicate_link", detail, now_ms))
                out.append(Close(peer.conn, "duplicate link", after_ms=DUPLICATE_CLOSE_MS))
                peer.state = PeerState.DRAINING
                return out
            self._node_conn[peer.node_id] = peer.conn  # before the forget: nothing is purged
            detail = "another link with this station took over"
            reason = "duplicate_link" if existing.linked else "replaced_by_newer_handshake"
            out.append(self._goodbye(existing, reason, detail, now_ms))
            out.append(Close(existing.conn, reason.replace("_", " "), after_ms=DUPLICATE_CLOSE_MS))
            existing.state = PeerState.DRAINING
            out += self._forget(existing, now_ms)
        self._node_conn[peer.node_id] = peer.conn
        peer.linked = True
        self._count("links_up")
        host = peer.link_host or peer.address
        out.append(LinkUp(peer.conn, peer.node_id, host, peer.dht_port))
        out += self._linked(peer, now_ms)
        return out

    def _stays(self, existing: Peer, new: Peer) -> bool:
        """Of two links with one station, does ``existing`` stay? The one dialled by the
        lower node id does; two dialled by the same station: the newer."""
        existing_by = self._own_id if existing.dialled else existing.node_id
        new_by = self._own_id if new.dialled else new.node_id
        return existing_by != new_by and existing_by < new_by

    def _goodbye(self, peer: Peer, reason: str, detail: str, now_ms: int) -> Send:
        return self._frames.goodbye(peer.conn, peer.control or 0, reason, detail, now_ms)
