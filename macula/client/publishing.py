"""A PUBLISH with both of its signatures from one encoding of its fields (PROTOCOL.md §4.2, §4.4).

A published frame carries two Ed25519 signatures over overlapping content: ``publisher_sig``
over ``macula-v2-event-pub\\0 || CBOR{topic, realm, publisher, seq, payload}`` (end to end) and
the frame ``signature`` over ``macula-v2-frame\\0 || CBOR(map without signature and
publisher_sig)`` (per hop). ``Publish.with_publisher_sig(id).sign_and_encode(id)`` encodes the
payload twice and builds the frame twice; ``signed_publish`` encodes every field once and cuts
both signed byte strings out of the same canonical pairs. Invariants:
- the bytes are exactly those of ``frame.with_publisher_sig(id).sign_and_encode(id)`` (a
  subset of canonically sorted pairs is itself canonically sorted, and the publication map's
  five values travel in the frame with the same encoding);
  tests/unit/macula/client/test_frame_fast_paths.py holds the two paths byte-equal;
- ``frame`` must not carry a signature or a publisher_sig yet (both are made here);
- without its frame signature (``frame_signature=False``) the bytes are exactly those of
  ``frame.with_publisher_sig(id)`` encoded unsigned: ``publisher_sig`` is always there.
"""

from __future__ import annotations

import bisect

from macula.wire import cbor
from macula.wire.errors import LocalProtocolError
from macula.wire.frames import Publish
from macula.wire.framing import frame_bytes
from macula.wire.identity import DOMAIN_EVENT_PUB, DOMAIN_FRAME, Identity

_PUBLICATION_KEYS = frozenset(
    cbor.encode_key(key) for key in ("topic", "realm", "publisher", "seq", "payload")
)
_SIGNATURE_KEY = cbor.encode_key("signature")
_PUBLISHER_SIG_KEY = cbor.encode_key("publisher_sig")


def signed_publish(frame: Publish, identity: Identity, *, frame_signature: bool = True) -> bytes:
    """The framed bytes of ``frame`` with its ``publisher_sig`` and frame signature; without
    the frame signature when ``frame_signature`` is false: only for a station that said in its
    HELLO it checks this connection's frames by id (``ClientCore.station_binds``, SECURITY.md
    "Each claim verified once"), where nobody would verify it."""
    if frame.signature is not None or frame.publisher_sig is not None:
        raise LocalProtocolError("bad_field", "publish is already signed")
    pairs = frame.encoded_pairs()  # no signature or publisher_sig yet (checked above)
    publication = [pair for pair in pairs if pair[0] in _PUBLICATION_KEYS]
    publisher_sig = identity.sign(DOMAIN_EVENT_PUB + cbor.join_pairs(publication))
    if frame_signature:
        signature = identity.sign(DOMAIN_FRAME + cbor.join_pairs(pairs))
        bisect.insort(pairs, (_SIGNATURE_KEY, cbor.encode(signature)))
    bisect.insort(pairs, (_PUBLISHER_SIG_KEY, cbor.encode(publisher_sig)))
    return frame_bytes(cbor.join_pairs(pairs))
