"""Who is subscribed to what (PROTOCOL.md §7): pure state, no I/O, no policy.

Invariants: the two indexes always agree — ``node`` is in ``subscribers(key)`` exactly when
``key`` is among that node's subscriptions; an emptied entry is deleted from either index, so
the table holds nothing for a node or topic without subscriptions. Subscriptions belong to a
node id, not a connection: the router purges them when the node's last connection goes (§7.5).
"""

from __future__ import annotations

from collections.abc import KeysView, Set

TopicKey = tuple[bytes, bytes]  # (realm, topic as UTF-8)

_NONE: frozenset[bytes] = frozenset()


class StationSubscriptions:
    def __init__(self) -> None:
        self._by_topic: dict[TopicKey, set[bytes]] = {}
        self._by_node: dict[bytes, set[TopicKey]] = {}

    def add(self, node_id: bytes, key: TopicKey) -> None:
        self._by_node.setdefault(node_id, set()).add(key)
        self._by_topic.setdefault(key, set()).add(node_id)

    def remove(self, node_id: bytes, key: TopicKey) -> None:
        subscribers = self._by_topic.get(key)
        if subscribers is not None:
            subscribers.discard(node_id)
            if not subscribers:
                del self._by_topic[key]
        mine = self._by_node.get(node_id)
        if mine is not None:
            mine.discard(key)
            if not mine:
                del self._by_node[node_id]

    def purge(self, node_id: bytes) -> None:
        """Forget every subscription of ``node_id``."""
        for key in list(self._by_node.get(node_id, ())):
            self.remove(node_id, key)

    def has(self, node_id: bytes, key: TopicKey) -> bool:
        return key in self._by_node.get(node_id, ())

    def keys_for(self, node_id: bytes) -> list[TopicKey]:
        """A copy of ``node_id``'s subscriptions."""
        return list(self._by_node.get(node_id, ()))

    def count_for(self, node_id: bytes) -> int:
        return len(self._by_node.get(node_id, ()))

    def subscribers(self, key: TopicKey) -> Set[bytes]:
        """The node ids subscribed to ``key`` (a live view: do not keep it across changes)."""
        return self._by_topic.get(key, _NONE)

    def nodes(self) -> KeysView[bytes]:
        """Node ids with at least one subscription."""
        return self._by_node.keys()

    def __len__(self) -> int:
        """Number of topics with at least one subscriber."""
        return len(self._by_topic)
