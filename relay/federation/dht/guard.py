"""Who may make the DHT among stations send what (issue 26): sans-I/O, time passed in.

The DHT runs on UDP, where a source address proves nothing. ``DhtGuard`` decides, for each
request a datagram carries, how much this station may answer and what it may take:

- Return-address tokens: ``token(addr, now)`` is a keyed HMAC (a secret per station process) of
  the source address and a time window of ``token_window_ms``; a token of this window or the
  one before is ``proven``. A source proves it receives at its address by echoing one.
- An unproven source gets a ping's id, or a challenge carrying a token: never more than
  ``reply_ratio`` times the bytes it sent (``reply_allowed``), so a spoofed source cannot turn
  this station into a reflector. It never enters the routing table either.
- Linked stations: ``link_up``/``link_down`` come from the QUIC link layer (authenticated by
  its handshake). A STORE, and any push of held records, is for a linked station only, at an
  address its link named or its own signed ``station_endpoint`` record names (``bound``).
- Per-source budgets: new records and bytes a source may STORE per ``budget_window_ms``
  (``allows``, ``charge``); sources tracked at most ``max_sources`` (the oldest forgotten first).

Invariants: every table here is bounded; nothing here reads a clock, sends or raises on what
a peer sent; refusals are counted in ``stats`` by the caller's pattern (``dht_refused_*``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from macula.wire.records import Record, RecordType
from relay.federation.dht.checks import TOKEN_SIZE
from relay.federation.dht.storage import dht_id

__all__ = ["Address", "DhtGuard", "GuardLimits", "endpoint_addresses", "is_ip"]

_DOMAIN: Final = b"macula-v2-dht-token\0"
_MAX_ADDRESSES: Final = 8  # DHT addresses remembered per linked station

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class GuardLimits:
    # a token is good for its window and the next one (so 1x to 2x this long)
    token_window_ms: int = 120_000
    # bytes answered to an unproven source, at most this many times the bytes it sent
    reply_ratio: int = 3
    # what one source may STORE per window (records offered, and their value bytes)
    budget_window_ms: int = 60_000
    records_per_source_window: int = 2_000
    bytes_per_source_window: int = 8 * 1024 * 1024
    # sources whose budgets are remembered; linked stations remembered
    max_sources: int = 4_096
    max_linked: int = 4_096

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"GuardLimits.{name} must be a positive int, got {value!r}")


class DhtGuard:
    """Tokens, linked stations and per-source budgets of one station's DHT."""

    def __init__(
        self,
        secret: bytes,
        limits: GuardLimits | None = None,
        *,
        endpoints: Callable[[bytes], Iterable[Address]] = lambda node_id: (),
    ) -> None:
        """``endpoints(node id)``: the DHT addresses a station's own signed, checked
        ``station_endpoint`` records name (the binding when its link named none)."""
        if type(secret) is not bytes or len(secret) < 16:
            raise ValueError("the token secret is at least 16 bytes")
        self._secret = secret
        self.limits = GuardLimits() if limits is None else limits
        self.endpoints = endpoints
        self.stats: Counter[str] = Counter()
        # dht id of a linked station -> (its 32-byte node id, the addresses its links named,
        # how many links are up)
        self._linked: OrderedDict[bytes, tuple[bytes, set[Address], int]] = OrderedDict()
        # source -> (window start, records, bytes)
        self._budgets: OrderedDict[bytes, tuple[int, int, int]] = OrderedDict()

    # -- return-address tokens --

    def token(self, addr: Address, now_ms: int) -> bytes:
        return self._mac(addr, now_ms // self.limits.token_window_ms)

    def _mac(self, addr: Address, window: int) -> bytes:
        ip, port = addr
        message = b"%s%d\0%s\0%d" % (_DOMAIN, window, ip.encode(), port)
        return hmac.new(self._secret, message, hashlib.sha256).digest()[:TOKEN_SIZE]

    def proven(self, addr: Address, token: bytes | None, now_ms: int) -> bool:
        if token is None:
            return False
        window = now_ms // self.limits.token_window_ms
        return any(hmac.compare_digest(token, self._mac(addr, w)) for w in (window, window - 1))

    def reply_allowed(self, request_bytes: int, reply_bytes: int) -> bool:
        """What an unproven source may be answered (it may not be the one who sent it)."""
        return reply_bytes <= self.limits.reply_ratio * request_bytes

    # -- linked stations --

    def link_up(self, node_id: bytes, host: str, dht_port: int) -> None:
        """The link layer authenticated station ``node_id``; its DHT at ``host:dht_port``
        (0: not told)."""
        key = dht_id(node_id)
        _, addresses, links = self._linked.pop(key, (node_id, set(), 0))
        self._linked[key] = (node_id, addresses, links + 1)
        self.add_address(node_id, (host, dht_port))
        while len(self._linked) > self.limits.max_linked:
            self._linked.popitem(last=False)

    def add_address(self, node_id: bytes, addr: Address) -> None:
        """Linked station ``node_id`` runs its DHT at ``addr`` too (e.g. its link's host name,
        resolved); nothing if it is not linked or the port is 0."""
        held = self._linked.get(dht_id(node_id))
        if held is None or not addr[1]:
            return
        addresses = held[1]
        if addr not in addresses and len(addresses) < _MAX_ADDRESSES:
            addresses.add(addr)

    def link_down(self, node_id: bytes) -> None:
        key = dht_id(node_id)
        held = self._linked.get(key)
        if held is None:
            return
        if held[2] <= 1:
            del self._linked[key]
        else:
            self._linked[key] = (held[0], held[1], held[2] - 1)

    def linked(self, dht_node_id: bytes) -> bool:
        return dht_node_id in self._linked

    def node_of(self, dht_node_id: bytes) -> bytes | None:
        """The 32-byte node id of linked station ``dht_node_id`` (None: not linked)."""
        held = self._linked.get(dht_node_id)
        return None if held is None else held[0]

    def bound(self, dht_node_id: bytes, addr: Address) -> bool:
        """``addr`` is where linked station ``dht_node_id`` runs its DHT: named by its link,
        or by its own signed station_endpoint record."""
        held = self._linked.get(dht_node_id)
        if held is None:
            return False
        return addr in held[1] or addr in set(self.endpoints(held[0]))

    # -- per-source budgets --

    def allows(self, source: bytes, now_ms: int) -> bool:
        """``source`` has budget left in this window (a STORE may overshoot it by its own
        records: at most one datagram's worth)."""
        _, records, nbytes = self._window(source, now_ms)
        limits = self.limits
        return records < limits.records_per_source_window and (
            nbytes < limits.bytes_per_source_window
        )

    def charge(self, source: bytes, records: int, nbytes: int, now_ms: int) -> None:
        """``source`` stored ``records`` new records in ``nbytes`` (what it re-sent unchanged
        costs nothing: replication re-sends everything on its period)."""
        start, used_records, used_bytes = self._window(source, now_ms)
        self._budgets.pop(source, None)
        self._budgets[source] = (start, used_records + records, used_bytes + nbytes)
        while len(self._budgets) > self.limits.max_sources:
            self._budgets.popitem(last=False)

    def _window(self, source: bytes, now_ms: int) -> tuple[int, int, int]:
        start, records, nbytes = self._budgets.get(source, (now_ms, 0, 0))
        if now_ms - start >= self.limits.budget_window_ms or now_ms < start:
            return (now_ms, 0, 0)
        return (start, records, nbytes)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def endpoint_addresses(record: Record) -> list[Address]:
    """The DHT addresses a station_endpoint record names (its IP literal hosts); the caller
    has checked the record (signed by the station)."""
    hosts, port = record.payload.get("host_advertised"), record.payload.get("dht_port", 0)
    if record.type != RecordType.STATION_ENDPOINT or not isinstance(hosts, list):
        return []
    if type(port) is not int or not 0 < port <= 0xFFFF:
        return []
    found = []
    for host in hosts[:_MAX_ADDRESSES]:
        with contextlib.suppress(UnicodeDecodeError, AttributeError):
            if is_ip(host.decode()):
                found.append((host.decode(), port))
    return found
