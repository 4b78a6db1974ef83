"""What a peer station's DHT datagrams carry, checked before kademlia reads them (dht.py).

Invariants: every check is a pure predicate on decoded msgpack (never raises); a node triple is
(20-byte id, an IP address literal, never a name to resolve, port 1..65535); a reply carries at
most ``MAX_NODES`` triples. A request is ``[name, [args..., token?]]``: the arguments of
``REQUEST_ARGS[name]``, then optionally the return-address token this station handed out
(``dht_guard``); a ``token`` request asks for one, and a challenge ``{"token": t}`` answers it
(and any request that needed a token and carried no good one). A find_value answer's ``next``
says where a further page of its records starts (``find_more``; 0 or absent: none).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Final

from relay.federation.dht.storage import DHT_ID_SIZE

__all__ = [
    "MAX_NODES",
    "REQUEST_ARGS",
    "TOKEN_SIZE",
    "is_challenge",
    "is_count",
    "is_found",
    "is_id",
    "is_index",
    "is_node",
    "is_node_list",
    "is_page",
    "parse_request",
]

TOKEN_SIZE: Final = 16

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


def is_index(value: object) -> bool:
    """Where a further page of records starts: 1..65535."""
    return type(value) is int and 0 < value <= 0xFFFF


def _next_page(value: dict[object, object]) -> bool:
    following = value.get("next", 0)
    return following == 0 or is_index(following)


def is_found(value: object) -> bool:
    return (
        isinstance(value, dict)
        and type(value.get("value")) is bytes
        and is_node_list(value.get("nodes"))
        and _next_page(value)
    )


def is_page(value: object) -> bool:
    return isinstance(value, dict) and type(value.get("value")) is bytes and _next_page(value)


def is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def is_token(value: object) -> bool:
    return type(value) is bytes and len(value) == TOKEN_SIZE


def is_challenge(value: object) -> bool:
    return isinstance(value, dict) and len(value) == 1 and is_token(value.get("token"))


REQUEST_ARGS: Final[dict[str, tuple[Callable[[object], bool], ...]]] = {
    "token": (is_id,),
    "ping": (is_id,),
    "store": (is_id, is_id, lambda v: type(v) is bytes),
    "find_node": (is_id, is_id),
    "find_value": (is_id, is_id),
    "find_more": (is_id, is_id, is_index),
}


def parse_request(data: object) -> tuple[str, list[object], bytes | None] | None:
    """A request's procedure, arguments and token (None: it carried none); None if malformed."""
    if not isinstance(data, list) or len(data) != 2:
        return None
    name, args = data
    checks = REQUEST_ARGS.get(name) if type(name) is str else None
    if checks is None or not isinstance(args, list):
        return None
    token = None
    if len(args) == len(checks) + 1 and is_token(args[-1]):
        token = args[-1]
        args = args[:-1]
    if len(args) != len(checks) or not all(check(a) for check, a in zip(checks, args, strict=True)):
        return None
    return str(name), args, token
