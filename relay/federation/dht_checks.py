"""What a peer station's DHT datagrams carry, checked before kademlia reads them (dht.py).

Invariants: every check is a pure predicate on decoded msgpack (never raises); a node triple is
(20-byte id, an IP address literal, never a name to resolve, port 1..65535); a reply carries at
most ``MAX_NODES`` triples.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Final

from relay.federation.dht_storage import DHT_ID_SIZE

__all__ = ["MAX_NODES", "REQUEST_ARGS", "is_count", "is_found", "is_id", "is_node", "is_node_list"]

MAX_NODES: Final = 64  # node triples accepted in one reply


def is_id(value: object) -> bool:
    return type(value) is bytes and len(value) == DHT_ID_SIZE


def is_node(value: object) -> bool:
    if not isinstance(value, list | tuple) or len(value) != 3:
        return False
    node_id, ip, port = value
    if not is_id(node_id) or type(ip) is not str or type(port) is not int:
        return False
    if not 0 < port <= 0xFFFF:
        return False
    try:
        ipaddress.ip_address(ip)  # never a name to resolve
    except ValueError:
        return False
    return True


def is_node_list(value: object) -> bool:
    return isinstance(value, list) and len(value) <= MAX_NODES and all(map(is_node, value))


def is_found(value: object) -> bool:
    return (
        isinstance(value, dict)
        and type(value.get("value")) is bytes
        and is_node_list(value.get("nodes"))
    )


def is_count(value: object) -> bool:
    return type(value) is int and value >= 0


REQUEST_ARGS: Final[dict[str, tuple[Callable[[object], bool], ...]]] = {
    "ping": (is_id,),
    "store": (is_id, is_id, lambda v: type(v) is bytes),
    "find_node": (is_id, is_id),
    "find_value": (is_id, is_id),
}
