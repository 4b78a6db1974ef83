"""Who a peer is, when something in this process knows more than its petname: the A2A door
(``tools.a2a.door``) names the mesh identities of its clients, so a task one of them handed over
says "A2A client crew" in the agent's task views and channel push.

Invariants: a label comes only from a namer registered in this process (the owner's records,
keyed by a node id the mesh attested), never from what a peer sent; a namer that fails names
nobody; labels are one line, at most ``MAX_CHARS`` characters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Final

MAX_CHARS: Final = 120
Namer = Callable[[bytes], str | None]

NAMERS: list[Namer] = []


def peer_label(node_id: bytes) -> str | None:
    """What a registered namer calls ``node_id``, or None."""
    for namer in list(NAMERS):
        with contextlib.suppress(Exception):
            label = namer(node_id)
            if label:
                return " ".join(label.split())[:MAX_CHARS]
    return None
