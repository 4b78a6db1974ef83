"""Records for the DHT tests: a signed note, and the DHT id it is stored under."""

from __future__ import annotations

import os

from macula.clock import now_ms
from macula.wire.identity import Identity
from macula.wire.records import Record, new_record, record_version
from relay.federation.dht_storage import dht_id, dht_storage_key


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
