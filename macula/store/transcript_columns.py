"""What goes into and comes out of a transcript column (``macula.store.transcript``).

Invariants: an argument of the wrong type or shape is a ``ValueError`` naming it, raised before
anything is written; ``refs`` and ``participants`` are stored as compact JSON arrays of text,
and a stored column that is not one reads back as None (logged, never raised).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

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
