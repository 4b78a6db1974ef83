"""What goes into and comes out of a transcript column (``macula.store.transcript``), and
the message row every read of it returns (``TranscriptMessage``).

Invariants: an argument of the wrong type or shape is a ``ValueError`` naming it, raised before
anything is written; ``refs`` and ``participants`` are stored as compact JSON arrays of text,
and a stored column that is not one reads back as None (logged, never raised).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from macula.store.base import Row, opt_text

logger = logging.getLogger("macula.store.transcript")


def check_text(value: str, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be non-empty text")


def opt_text_arg(value: str | None, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be text or None")
    return value


def check_int(value: int, name: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{name} must be an int (unix ms)")
    return value


def check_envelope(envelope: str) -> None:
    if not isinstance(envelope, str):
        raise ValueError("envelope must be the raw JSON text")
    try:
        json.loads(envelope)
    except ValueError:
        raise ValueError("envelope is not valid JSON") from None


def json_texts(values: Sequence[str] | None, name: str) -> str | None:
    if values is None:
        return None
    if isinstance(values, str | bytes) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{name} must be a sequence of text (not one text)")
    return json.dumps(list(values), ensure_ascii=False, separators=(",", ":"))


def texts_from_json(value: object, name: str, path: Path) -> tuple[str, ...] | None:
    """Defence in depth: a stored column that is not a JSON array of text reads as None."""
    if value is None:
        return None
    try:
        decoded = json.loads(str(value))
    except ValueError:
        decoded = None
    if isinstance(decoded, list) and all(isinstance(v, str) for v in decoded):
        return tuple(decoded)
    logger.warning("%s: %s is not a JSON array of text; reading it as None", path, name)
    return None


MESSAGE_COLUMNS: Final = (
    "seq, room_topic, message_id, from_hex, kind, text, in_reply_to, refs, participants,"
    " purpose, sent_at, received_ms, publisher, attested, envelope"
)


@dataclass(frozen=True, slots=True)
class TranscriptMessage:
    seq: int
    room_topic: str
    message_id: str
    from_hex: str
    kind: str
    text: str | None
    in_reply_to: str | None
    refs: tuple[str, ...] | None
    participants: tuple[str, ...] | None
    purpose: str | None
    sent_at: int
    received_ms: int
    publisher: bytes | None
    attested: int  # 0 or 1
    envelope: str


def message_from_row(row: Row, path: Path) -> TranscriptMessage:
    """A ``MESSAGE_COLUMNS`` row as a message (``path``: the file, for the log)."""
    return TranscriptMessage(
        seq=int(row[0]),
        room_topic=str(row[1]),
        message_id=str(row[2]),
        from_hex=str(row[3]),
        kind=str(row[4]),
        text=opt_text(row[5]),
        in_reply_to=opt_text(row[6]),
        refs=texts_from_json(row[7], "refs", path),
        participants=texts_from_json(row[8], "participants", path),
        purpose=opt_text(row[9]),
        sent_at=int(row[10]),
        received_ms=int(row[11]),
        publisher=None if row[12] is None else bytes(row[12]),
        attested=int(row[13]),
        envelope=str(row[14]),
    )
