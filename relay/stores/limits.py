"""What the station's stores hold at most (``StoreLimits``) and the refusal past a limit.

Pure data. Invariants: every limit has a default and a ``macula-relay`` flag (``relay.ops.cli``);
a store that raises ``QuotaExceeded`` has changed nothing; the built-ins answer it 0x0F
``quota_exceeded: <which limit>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from macula.wire.records import DEFAULT_TTL_MS

__all__ = ["MIB", "QuotaExceeded", "StoreLimits"]

MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """What the station's disk holds at most, and what one DHT reply carries."""

    records_per_signer: int = 1_000
    record_bytes_per_signer: int = 4 * MIB
    records_total: int = 200_000
    record_bytes_total: int = 256 * MIB
    # a record's lifetime (expires_at - created_at); §10.7's longest default is 48 h
    max_record_ttl_ms: int = DEFAULT_TTL_MS
    content_bytes_total: int = 1024 * MIB
    # blocks and manifests put or got this recently are never collected to make room
    content_keep_ms: int = 120_000
    # one _dht.find_records(_by_type) reply: its records' CBOR array, so that the whole RESULT
    # frame stays under 1 MiB
    max_find_reply_bytes: int = MIB - 8 * 1024
    max_find_by_type: int = 1_000

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if type(value) is not int or value < (0 if name == "content_keep_ms" else 1):
                raise ValueError(f"StoreLimits.{name} must be a positive int, got {value!r}")


class QuotaExceeded(Exception):
    """A put would take a store past one of its ``StoreLimits``; nothing was changed."""
