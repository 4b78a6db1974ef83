"""Shared test helpers: the vector files and their typed value notation."""

from __future__ import annotations

import json
from typing import Any

from .paths import VECTORS


def load_vectors(name: str) -> Any:
    """One of the committed vector files (identical to ../shared/vectors/)."""
    return json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))


def typed(value: dict[str, Any]) -> Any:
    """Python value of the vectors' typed notation ({"int": n}, {"bytes": hex}, ...)."""
    kind, raw = next((k, v) for k, v in value.items() if k != "bits")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    if kind == "bytes":
        return bytes.fromhex(raw)
    if kind == "text":
        return raw
    if kind == "null":
        return None
    if kind == "array":
        return [typed(item) for item in raw]
    if kind == "map":
        return {typed(k): typed(v) for k, v in raw}
    raise ValueError(f"unknown notation {kind}")
