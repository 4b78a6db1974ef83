"""The kademlia protocol of the DHT among stations, adapted and guarded (issues 12, 26).

``DhtProtocol(KademliaProtocol)`` answers and sends the package's requests (ping, find_node,
find_value, store) in rpcudp's msgpack framing, with what ``relay.federation.dht.guard``
decides about each source:

- Requests in: every datagram is checked before anything reads it (``dht_checks``: msgpack
  garbage, unknown procedures, wrong argument types are counted in ``stats`` and dropped). A
  source that carries no good return-address token gets a ping's id, or a challenge carrying
  a token, and nothing larger than ``reply_ratio`` times what it sent
  (``dht_refused_amplification`` otherwise); it does not enter the routing table. A proven
  source gets the answer (find_value: the records held, a page of at most
  ``max_reply_bytes``, where the next page starts, and the closest nodes; ``find_more``: a
  further page), and enters the routing table.
- STORE is taken only from a linked station at its bound address (``dht_refused_unlinked``),
  within its budget of new records a window (``dht_refused_budget``); what it stores is held
  under its source (``RecordShelf``'s per-source caps).
- Requests out carry the token of the station asked (fetched by a ``token`` request, kept for
  ``token_reuse_s``; a challenge answer refreshes it and the request is sent again once).
- ``welcome_if_new`` adds a station to the routing table; only a linked station never
  welcomed before (ids remembered, bounded) gets the values it should hold by the package's
  rule (closer than the k-th, this station is the closest holder), at most
  ``welcome_max_values`` STOREs. Kademlia's rule is applied to the digest itself.
- A station leaves the routing table after ``evict_after_timeouts`` consecutive unanswered
  requests (any answer resets the count), or at once after a malformed answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import umsgpack
from kademlia.node import Node
from kademlia.protocol import KademliaProtocol

from macula.task_scope import Spawner, TaskScope
from macula.wire.records import Record
from relay.federation.dht.checks import (
    is_challenge,
    is_count,
    is_found,
    is_id,
    is_node_list,
    is_page,
    parse_request,
)
from relay.federation.dht.guard import Address, DhtGuard, endpoint_addresses
from relay.federation.dht.storage import DhtRefused, RecordShelf, check_record, decode_value

if TYPE_CHECKING:
    from relay.federation.dht.config import DhtConfig

__all__ = ["DhtProtocol"]

log = logging.getLogger("macula.relay.dht")

_REQUEST: bytes = b"\x00"
_REPLY: bytes = b"\x01"
_MAX_REQUEST = 8192  # msgpack bytes of name and arguments (rpcudp's limit, kept)


class DhtProtocol(KademliaProtocol):  # type: ignore[misc]  # kademlia ships no type hints
    storage: RecordShelf

    def __init__(
        self,
        source_node: Node,
        storage: RecordShelf,
        config: DhtConfig,
        guard: DhtGuard,
        spawn: Spawner | None = None,
    ) -> None:
        super().__init__(source_node, storage, config.ksize)
        self._wait_timeout = config.rpc_timeout_s
        self.stats = storage.stats
        self.config = config
        self.guard = guard
        self._misses: OrderedDict[bytes, int] = OrderedDict()  # consecutive, by node id
        self._welcomed: OrderedDict[bytes, None] = OrderedDict()
        self._pushes = TaskScope(spawn)  # records pushed to newcomers (the station's group)
        self._tokens: OrderedDict[Address, tuple[bytes, int]] = OrderedDict()  # token, got at
        self._asked: dict[bytes, Address] = {}  # msg id -> the address it was sent to

    # -- the routing table --

    def welcome_if_new(self, node: Node) -> None:
        if not self.router.is_new_node(node):
            return
        if node.id in self._welcomed:
            self._welcomed.move_to_end(node.id)
            self.stats["rewelcomed"] += 1
        elif self.pushable(node):
            self._welcomed[node.id] = None
            while len(self._welcomed) > self.config.welcome_memory:
                self._welcomed.popitem(last=False)
            self._push_to_newcomer(node)
        else:
            self.stats["welcome_unlinked"] += 1  # no records pushed to a station not linked
        self.router.add_contact(node)

    def pushable(self, node: Node) -> bool:
        """Records may be sent to ``node``: a linked station at its bound address."""
        return self.guard.bound(node.id, (node.ip, node.port))

    def _push_to_newcomer(self, node: Node) -> None:
        """The package's rule (§2.5 of the paper), bounded: values ``node`` should hold."""
        budget = self.config.welcome_max_values
        if not budget:
            return
        now = self.storage.clock()
        for dkey in self.storage.digests():
            keynode = Node(dkey)
            neighbors = self.router.find_neighbors(keynode)
            if neighbors and not (
                node.distance_to(keynode) < neighbors[-1].distance_to(keynode)
                and self.source_node.distance_to(keynode) < neighbors[0].distance_to(keynode)
            ):
                continue
            for batch in self.storage.store_batches(self.storage.records(dkey, now)):
                if budget == 0:
                    self.stats["welcome_push_capped"] += 1
                    return
                budget -= 1
                self.stats["welcome_pushed"] += 1
                self._pushes.spawn(self._push(node, dkey, batch))

    def handle_call_response(self, result: Any, node: Node) -> Any:
        if result[0]:
            self._misses.pop(node.id, None)
            self.welcome_if_new(node)  # it answered our random msg id: it is at that address
            return result
        if self.router.is_new_node(node):  # not in the table: nothing to evict
            self._misses.pop(node.id, None)
            return result
        misses = self._misses.pop(node.id, 0) + 1
        if misses >= self.config.evict_after_timeouts:
            self._evict(node)
        else:
            self._misses[node.id] = misses
            while len(self._misses) > self.config.welcome_memory:
                self._misses.popitem(last=False)
            self.stats["timeout_tolerated"] += 1
        return result

    def _evict(self, node: Node) -> None:
        self._misses.pop(node.id, None)
        self.router.remove_contact(node)
        self.stats["evicted"] += 1

    # -- datagrams in --

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            self._solve(data, (str(addr[0]), int(addr[1])))
        except Exception:  # anything a stranger can send: counted, never raised into the loop
            self.stats["request_failed"] += 1
            log.debug("DHT datagram from %s failed", addr, exc_info=True)

    def _solve(self, datagram: bytes, address: Address) -> None:
        if len(datagram) < 22:
            self.stats["malformed_datagram"] += 1
            return
        kind, msg_id = datagram[:1], datagram[1:21]
        try:
            data = umsgpack.unpackb(datagram[21:])
        except Exception:  # msgpack garbage
            self.stats["malformed_datagram"] += 1
            return
        if kind == _REQUEST:
            self._answer(msg_id, data, address, len(datagram))
        elif kind == _REPLY:
            self._accept_reply(msg_id, data, address)
        else:
            self.stats["malformed_datagram"] += 1

    def _accept_reply(self, msg_id: bytes, data: object, address: Address) -> None:
        if self._asked.get(msg_id) != address:  # unasked, or from another address
            self.stats["unasked_reply"] += 1
            return
        del self._asked[msg_id]
        future, timeout = self._outstanding.pop(msg_id)
        timeout.cancel()
        if not future.done():
            future.set_result((True, data))

    def _answer(self, msg_id: bytes, data: object, address: Address, size: int) -> None:
        request = parse_request(data)
        if request is None:
            self.stats["malformed_request"] += 1
            return
        name, args, token = request
        now = self.storage.clock()
        proven = self.guard.proven(address, token, now)
        reply = self._reply(name, args, address, proven, now)
        datagram = _REPLY + msg_id + umsgpack.packb(reply)
        if not proven and not self.guard.reply_allowed(size, len(datagram)):
            self.stats["dht_refused_amplification"] += 1
            return
        self.transport.sendto(datagram, address)

    def _reply(
        self, name: str, args: list[Any], address: Address, proven: bool, now: int
    ) -> object:
        source = Node(args[0], address[0], address[1])
        if name == "ping":
            if proven:
                self.welcome_if_new(source)
            return self.source_node.id
        if not proven:  # a token request, or one that needs the token it did not carry
            if name != "token":
                self.stats["dht_challenged"] += 1
            return {"token": self.guard.token(address, now)}
        if name == "token":
            return {"token": self.guard.token(address, now)}
        self.welcome_if_new(source)
        if name == "store":
            return self._store(source, args[1], args[2], now)
        if name == "find_more":
            value, following = self.storage.reply_page(args[1], now, args[2])
            return {"value": value, "next": following}
        neighbors = [tuple(n) for n in self.router.find_neighbors(Node(args[1]), exclude=source)]
        if name == "find_node":
            return neighbors
        value, following = self.storage.reply_page(args[1], now)
        return {"value": value, "nodes": neighbors, "next": following}

    def _store(self, source: Node, dkey: bytes, value: bytes, now: int) -> int:
        records = decode_value(value, self.storage.limits, self.stats)
        if not self.pushable(source) and not self._binds(source, dkey, records, now):
            self.stats["dht_refused_unlinked"] += 1
            return 0
        if not self.guard.allows(source.id, now):
            self.stats["dht_refused_budget"] += 1
            return 0
        before = self.stats["stored"]
        taken = sum(self.storage.accept(dkey, r, now, source.id) for r in records)
        stored = self.stats["stored"] - before
        self.guard.charge(source.id, stored, len(value) if stored else 0, now)
        return taken

    def _binds(self, source: Node, dkey: bytes, records: list[Record], now: int) -> bool:
        """A linked station's STORE carries its own station_endpoint record naming the address
        it came from (its link did not): bound from now on."""
        node_id = self.guard.node_of(source.id)
        address = (source.ip, source.port)
        for record in records:
            if record.key != node_id or address not in endpoint_addresses(record):
                continue
            try:
                check_record(record, dkey, now, self.storage.limits, verified=self.storage.verified)
            except DhtRefused:
                continue
            self.guard.add_address(node_id, address)
            self.stats["dht_bound_by_endpoint"] += 1
            return True
        return False

    # -- requests out --

    def _send(self, address: Address, name: str, args: list[Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        data = umsgpack.packb([name, args])
        if len(data) > _MAX_REQUEST or self.transport is None:
            future.set_result((False, None))
            return future
        msg_id = os.urandom(20)
        self.transport.sendto(_REQUEST + msg_id + data, address)
        timeout = loop.call_later(self._wait_timeout, self._timeout, msg_id)
        self._outstanding[msg_id] = (future, timeout)
        self._asked[msg_id] = address
        return future

    def _timeout(self, msg_id: bytes) -> None:
        self._asked.pop(msg_id, None)
        future = self._outstanding.pop(msg_id, (None, None))[0]
        if future is not None and not future.done():
            future.set_result((False, None))
        self.stats["rpc_timeout"] += 1

    async def _token_of(self, address: Address) -> bytes | tuple[bool, object]:
        """The token ``address`` handed out (asked for unless kept), or the failed answer."""
        now = self.storage.clock()
        held = self._tokens.get(address)
        if held is not None and now - held[1] < self.config.token_reuse_s * 1000:
            return held[0]
        result = await self._send(address, "token", [self.source_node.id])
        if not result[0] or not is_challenge(result[1]):
            return (bool(result[0]), result[1])  # no answer, or a malformed one
        token = bytes(result[1]["token"])
        self._keep_token(address, token, now)
        return token

    def _keep_token(self, address: Address, token: bytes, now: int) -> None:
        self._tokens.pop(address, None)
        self._tokens[address] = (token, now)
        while len(self._tokens) > self.config.welcome_memory:
            self._tokens.popitem(last=False)

    async def _call(self, address: Address, name: str, *args: Any) -> Any:
        """``name`` asked of ``address`` with its token; (answered, reply)."""
        token = await self._token_of(address)
        if not isinstance(token, bytes):
            return token
        result = await self._send(address, name, [*args, token])
        if result[0] and is_challenge(result[1]):  # the token aged out there: once more
            self._keep_token(address, result[1]["token"], self.storage.clock())
            result = await self._send(address, name, [*args, result[1]["token"]])
        return result

    async def ping_address(self, address: Address) -> Any:
        return await self._send(address, "ping", [self.source_node.id])

    # -- replies in --

    def _answered(self, result: Any, check: Callable[[object], bool], node: Node) -> Any:
        """A malformed answer counts as none, and the station leaves the table at once."""
        if result[0] and not check(result[1]):
            self.stats["bad_reply"] += 1
            self._evict(node)
            return (False, None)
        return self.handle_call_response(result, node)

    async def call_ping(self, node_to_ask: Node) -> Any:
        result = await self.ping_address((node_to_ask.ip, node_to_ask.port))
        return self._answered(result, is_id, node_to_ask)

    async def call_find_node(self, node_to_ask: Node, node_to_find: Node) -> Any:
        address = (node_to_ask.ip, node_to_ask.port)
        result = await self._call(address, "find_node", self.source_node.id, node_to_find.id)
        return self._answered(result, is_node_list, node_to_ask)

    async def call_find_value(self, node_to_ask: Node, node_to_find: Node) -> Any:
        address = (node_to_ask.ip, node_to_ask.port)
        result = await self._call(address, "find_value", self.source_node.id, node_to_find.id)
        return self._answered(result, is_found, node_to_ask)

    async def call_find_more(self, node_to_ask: Node, key: bytes, skip: int) -> Any:
        """A further page of the records ``node_to_ask`` holds under ``key``."""
        address = (node_to_ask.ip, node_to_ask.port)
        result = await self._call(address, "find_more", self.source_node.id, key, skip)
        return self._answered(result, is_page, node_to_ask)

    async def _push(self, node: Node, key: bytes, batch: bytes) -> None:
        """One batch pushed to a newcomer, as a task of the station's group."""
        await self.call_store(node, key, batch)

    async def call_store(self, node_to_ask: Node, key: bytes, value: bytes) -> Any:
        address = (node_to_ask.ip, node_to_ask.port)
        result = await self._call(address, "store", self.source_node.id, key, value)
        return self._answered(result, is_count, node_to_ask)
