"""A bound connection's frame leaving on a station link is verified first (issue 27).

On a connection bound to this station (``Peer.bound``: its CONNECT named this station) a frame
is admitted on the id comparison, without an Ed25519 verify (``relay.core.admission``); the end that
acts verifies it. A frame that crosses a station link is verified as before every other frame
on a link is, so no linked station receives from this one a frame it did not verify: the
forwarders call ``crossing_verified`` before they send a relayed CALL, RESULT/ERROR or STREAM_*
onto a link. Pure: no I/O, no state.
"""

from __future__ import annotations

from macula.wire.frames import Frame
from macula.wire.framing import unsigned_body
from macula.wire.identity import DOMAIN_FRAME, verify
from relay.core.peers import Peer

__all__ = ["crossing_verified"]


def crossing_verified(sender: Peer, frame: Frame, body: bytes | None = None) -> bool:
    """True when ``frame``, received from ``sender``, may go onto a station link: it was
    verified on arrival (an unbound connection, a link), or it verifies now (``body``: the bytes
    it was received as, when canonical: the signature is checked over them)."""
    if not sender.bound:
        return True
    unsigned = unsigned_body(body) if body is not None else None
    signable = DOMAIN_FRAME + unsigned if unsigned is not None else frame.signable_bytes()
    return verify(frame.expected_signer() or sender.node_id, signable, frame.signature)
