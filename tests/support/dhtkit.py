"""The DHT tests' parts: ``dht_nodes``, a few DHT nodes over real UDP on loopback, linked with
each other; a signed note, and the DHT id it is stored under."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from macula.clock import now_ms
from macula.wire.identity import Identity
from macula.wire.records import Record, new_record, record_version
from relay.federation.dht.station import DhtConfig, StationDht
from relay.federation.dht.storage import dht_id, dht_storage_key

from .identities import new_identity

LOOPBACK = "127.0.0.1"


def note(who: Identity, text: str = "hello", subject: bytes = b"s") -> Record:
    """A record of type 0x21 signed by ``who``, versioned now."""
    now = now_ms()
    return new_record(
        who,
        0x21,
        {"text": text},
        now_ms=now,
        version=record_version(now, os.urandom(10)),
        subject_id=subject,
    )


def digest(rec: Record) -> bytes:
    """The DHT id ``rec`` is stored under."""
    return dht_id(dht_storage_key(rec))


@asynccontextmanager
async def dht_nodes(
    n: int, config: DhtConfig, clock: Callable[[], int] = now_ms
) -> AsyncIterator[list[StationDht]]:
    """``n`` DHT nodes, all linked with each other (as the QUIC link layer would tell them), each
    bootstrapped from the first one's address only; stopped on leaving."""
    nodes: list[StationDht] = []
    try:
        for i in range(n):
            dht = StationDht(
                new_identity(), quic_port=5000 + i, hosts=[LOOPBACK], config=config, clock=clock
            )
            nodes.append(dht)
            await dht.start(LOOPBACK, 0)
        for a in nodes:
            for b in nodes:
                if a is not b:
                    a.link_up(b.identity.node_id, LOOPBACK, b.port)
        for dht in nodes[1:]:
            await dht.bootstrap([(LOOPBACK, nodes[0].port)])
        yield nodes
    finally:
        for dht in nodes:
            await dht.stop()
